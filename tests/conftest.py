"""Test setup: 8 simulated CPU devices (before jax is imported) and shared tiny models."""

import atexit
import os
import shutil
import sys
import tempfile

os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The scripts the tests start (they inherit this environment) use no persistent compilation
# cache: JAX 0.10.2 writes an entry with a plain write_bytes, so two processes of one test (the
# multi-host ones) or a process a test interrupts can leave a torn entry, which segfaulted the
# next reader (suite runs of 2026-11-25, one of them CI's, which then stalled past its limit).
os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"

import jax  # noqa: E402  (must follow the XLA_FLAGS above)
import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402
from flax import nnx  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "configs"))

jax.config.update("jax_default_matmul_precision", "highest")
# This test process alone keeps a persistent cache (tests build the same programs again in new
# jit wrappers), in a directory of its own that no other process writes and no later run
# reads: a new one per process, so an entry is never torn nor stale.
jax.config.update("jax_enable_compilation_cache", True)
_CACHE_DIR = tempfile.mkdtemp(
  prefix=f"specsamp-tests-jax-cache-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-"
)
atexit.register(shutil.rmtree, _CACHE_DIR, ignore_errors=True)
jax.config.update("jax_compilation_cache_dir", _CACHE_DIR)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)

import tiny  # noqa: E402  (configs/tiny.py)

from specsamp.models import TransformerConfig, transformer  # noqa: E402


def tiny_config(family: str = "chinchilla", **changes) -> TransformerConfig:
  """The tiny model of configs/tiny.py for a family, with field overrides."""
  return TransformerConfig.from_config(tiny.get_config(family).model).replace(**changes)


@pytest.fixture(scope="session")
def tiny_model():
  """A seeded random tiny Chinchilla-style model, shared by the tests that only read it."""
  return transformer.create(tiny_config(), seed=0)


def perturbed(model, scale: float, seed: int):
  """A copy of ``model`` with Gaussian noise of ``scale`` x each tensor's std added: a draft
  that agrees with its target often but not always."""
  graphdef, state = nnx.split(model)
  leaves, treedef = jax.tree.flatten(state)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  noisy = [
    x + scale * jnp.std(x) * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)
  ]
  return nnx.merge(graphdef, jax.tree.unflatten(treedef, noisy))
