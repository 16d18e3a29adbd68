"""Test setup: 8 simulated CPU devices (before jax is imported) and shared tiny models."""

import os
import sys
import tempfile

os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# A persistent compilation cache per pytest-xdist worker: the worker's tests and every script
# they start (inheriting this environment) compile the same micro-pair programs, and a script's
# second run of a program then loads it (a sample.py run: 10 s -> 4 s). The cache is keyed by
# the program and the compiler, so it never serves a stale program. One directory per worker:
# two workers writing the same entry at once crashed the writer inside JAX (SIGSEGV/SIGABRT in
# compilation_cache.put_executable_and_time, three suite runs on 2026-11-25), and a crashed
# write left an entry that segfaulted the next reader.
os.environ.setdefault(
  "JAX_COMPILATION_CACHE_DIR",
  os.path.join(
    tempfile.gettempdir(),
    "specsamp-tests-jax-cache-" + os.environ.get("PYTEST_XDIST_WORKER", "main"),
  ),
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")

import jax  # noqa: E402  (must follow the XLA_FLAGS above)
import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402
from flax import nnx  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "configs"))

jax.config.update("jax_default_matmul_precision", "highest")

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
