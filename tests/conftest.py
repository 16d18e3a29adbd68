"""Test setup: 8 simulated CPU devices (before jax is imported) and shared tiny models."""

import gc
import os
import sys

# The 8 simulated devices run their collectives as threads that meet in a rendezvous, which XLA
# aborts the process for after a termination timeout. Two test workers, the scripts they start
# and up to 16 device threads share 2 cores, so a device thread can be starved past it: the
# timeouts are raised (a worker aborted mid-run in train_step and in the sampler, with no
# other error, in suite runs of 2026-11-25).
os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "")
  + " --xla_force_host_platform_device_count=8"
  + " --xla_cpu_collective_call_warn_stuck_timeout_seconds=600"
  + " --xla_cpu_collective_call_terminate_timeout_seconds=3600"
  + " --xla_cpu_collective_timeout_seconds=3600"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# No persistent compilation cache, in the test processes or the scripts they start (they
# inherit this environment). With JAX 0.10.2's cache on, suite runs crashed inside XLA: four
# runs on 2026-11-25 (one of them CI's, which then stalled past its limit) in the cache's reads
# and writes while the machine was short of memory, and one more with memory to spare, with a
# directory per process, in the compile of a certificate program (compiler.py,
# _compile_and_write_cache -> backend_compile_and_load). The suite runs without it in 15 min.
os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"

import jax  # noqa: E402  (must follow the XLA_FLAGS above)
import jax.numpy as jnp  # noqa: E402
import pytest  # noqa: E402
from flax import nnx  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "configs"))

jax.config.update("jax_default_matmul_precision", "highest")

import tiny  # noqa: E402  (configs/tiny.py)

from specsamp.models import TransformerConfig, transformer  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """Drops every compiled program after each test file. A worker that kept all of them (hundreds
  of XLA CPU executables, 5-14 GB resident by the end of the run) aborted or segfaulted inside
  XLA's compile or its cache late in several suite runs of 2026-11-25, always in a file that
  came after many others; a test file's programs are rarely another file's."""
  yield
  jax.clear_caches()
  gc.collect()


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
