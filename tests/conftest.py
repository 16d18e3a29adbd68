"""Test setup: 8 simulated CPU devices (before jax is imported) and shared tiny models."""

import gc
import os
import sys


# The suite's time is XLA's: compiling took 184 of test_speculative.py's 225 s (2026-11-26,
# jax.monitoring's backend_compile_duration). Tests check behaviour and exactness, not speed,
# so their programs are compiled cheaply: LLVM at -O0 (184 -> 109 s), and on jaxlib 0.10 the
# classic fusion emitters instead of the MLIR ones (one test's compile 24.7 -> 6.6 s with both;
# the flag alone, at -O2, made it slower). XLA aborts on a flag it does not know, and jaxlib
# 0.11 has no fusion-emitter flag, so that one is set only where it exists.
def _fast_compile_flags() -> str:
  from importlib import metadata

  flags = " --xla_backend_optimization_level=0"
  if metadata.version("jaxlib").startswith("0.10."):
    flags += " --xla_cpu_use_fusion_emitters=false"
  return flags


# The 8 simulated devices run their collectives as threads that meet in a rendezvous, which XLA
# aborts the process for after a termination timeout. Two test workers, the scripts they start
# and up to 16 device threads share 2 cores, so a device thread can be starved past it: the
# timeouts are raised (a worker aborted mid-run in train_step and in the sampler, with no
# other error, in suite runs of 2026-11-25).
def xla_flags(devices: int = 8) -> str:
  """XLA_FLAGS for the test processes and the scripts they start (``script_env``)."""
  return (
    f"--xla_force_host_platform_device_count={devices}"
    " --xla_cpu_collective_call_warn_stuck_timeout_seconds=600"
    " --xla_cpu_collective_call_terminate_timeout_seconds=3600"
    " --xla_cpu_collective_timeout_seconds=3600"
    + (_fast_compile_flags() if os.environ.get("SPECSAMP_TEST_COMPILE", "fast") == "fast" else "")
  )


def largest_file(folder: str) -> str:
  """The largest file under ``folder`` (a checkpoint's parameter data)."""
  return max((os.path.join(r, n) for r, _, ns in os.walk(folder) for n in ns), key=os.path.getsize)


def flip_a_byte(path: str) -> None:
  """Flips one bit of the middle byte of ``path``: a corrupted copy."""
  data = bytearray(open(path, "rb").read())
  data[len(data) // 2] ^= 1
  open(path, "wb").write(bytes(data))


def script_env(devices: int = 8) -> dict[str, str]:
  """The environment of a script a test starts: this one, with ``devices`` simulated CPU
  devices and the suite's compile flags."""
  return dict(os.environ, XLA_FLAGS=xla_flags(devices))


os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + xla_flags()).strip()
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
import numpy as np  # noqa: E402
import pytest  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "configs"))

jax.config.update("jax_default_matmul_precision", "highest")

import tiny  # noqa: E402  (configs/tiny.py)

from specsamp.models import TransformerConfig, transformer  # noqa: E402
from specsamp.testing import exactness  # noqa: E402


def pytest_configure(config):
  config.addinivalue_line(
    "markers",
    "slow: a script run end to end, a certificate, a real model's file, torch parity, or a "
    'test of about 7 s or more on 2 cores; `python -m pytest -m "not slow" -n 2 tests` is the '
    "inner loop without them",
  )
  config.addinivalue_line(
    "markers",
    "extended: a heavy check with a reduced version in the suite (the real model's file, the "
    "quick certificate's every case, parity with every family, several processes, the notebook); "
    "left out of the suite unless the -m expression names it: `python -m pytest -m extended -n 2 "
    "--dist loadfile tests` is the extended command",
  )


def _names_extended(markexpr: str) -> bool:
  return "extended" in (markexpr or "")


def deselect_extended(config, items):
  """Leaves out the ``extended`` tests unless ``-m`` names the marker (``-m extended`` runs only
  them, ``-m "extended or not extended"`` everything): the suite runs their reduced versions."""
  if _names_extended(config.option.markexpr):
    return items
  kept = [item for item in items if item.get_closest_marker("extended") is None]
  dropped = [item for item in items if item.get_closest_marker("extended") is not None]
  if dropped:
    config.hook.pytest_deselected(items=dropped)
  return kept


# The longest test files (seconds of test time, README test command on 2 cores, 2026-11-30's
# twenty-second session). With ``--dist loadfile`` a worker takes the next file when it is free,
# in collection order: files collected last and long leave the other worker idle at the end (one
# worker idled for minutes in a 20-minute run), so the longest go first.
LONGEST_FIRST = (
  "test_scripts.py",  # 186 s in many tests
  "test_certify.py",  # 84 s
  "test_feature_drafter.py",  # 83 s
  "test_sequential_head.py",  # 74 s
  "test_train.py",  # 62 s
  "test_hf.py",  # 59 s
  "test_speculative.py",  # 56 s
  "test_parallel_drafter.py",  # 55 s
  "test_sharding.py",  # 54 s
  "test_compacting.py",  # 51 s
  "test_certify_trees.py",  # 46 s
  "test_gguf.py",  # 45 s
  "test_regenerate.py",  # 43 s
)


def pytest_collection_finish(session):
  """Python's cyclic garbage collector, set for a process that traces programs all day. Its
  full collections walked every object the imports made (jax, torch, transformers: none of it
  ever garbage) 15 times in three loop-heavy files: 3.1 s of their 88 (gc.callbacks,
  2026-11-30). The imports are frozen out of its walks, and a full collection comes after each
  test file (``_release_compiled_programs``) and otherwise once in 1,000 middle-generation
  ones, not 10; the young generations are collected as usual. The three files: 3.9 -> 1.1 s
  of collecting, the same peak memory (1.30 GB)."""
  gc.collect()
  gc.freeze()
  young, middle, _ = gc.get_threshold()
  gc.set_threshold(young, middle, 1000)


def pytest_collection_modifyitems(session, config, items):
  """Runs the longest files first (``LONGEST_FIRST``), the rest in their usual order."""
  items[:] = deselect_extended(config, items)
  rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


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


# --- The quick certificate (tests/test_certify.py, tests/test_certify_trees.py). ----------------

CERTIFY_DRAWS = {"trigram": 100_000, "transformer": 20_000}


def quick_certificate(cases):
  """``certify.certify`` over ``cases`` at ``CERTIFY_DRAWS`` sequences per case (scripts/
  certify.py draws 10^6 over every case). A transformer sequence costs ~25x a trigram one, and
  its three quick cases drew for 106 s at 10^5 against 54 s at 2 * 10^4 (2026-11-26); the
  planted bugs are all trigram cases, so the power to reject them keeps its 10^5 draws. Each
  threshold is fitted to 200 bootstrap values of G (the script fits 1,000): 2 s for a ragged
  case's 16 rows, where 1,000 would add a minute to the suite."""
  from specsamp.experiments.proofs import certify

  results = []
  for model, draws in CERTIFY_DRAWS.items():
    chosen = [case for case in cases if case.model == model]
    if chosen:
      results += certify.certify(chosen, draws, level=1e-4, log=lambda line: None, null_repeats=200)
  assert len(results) == len(cases), "a case on a model without CERTIFY_DRAWS"
  return results


# --- Exactness against enumeration (specsamp/testing/exactness.py). -----------------------------

EXACT_VOCAB, EXACT_NEW_TOKENS, EXACT_ROWS = 8, 3, 24_000


def exact_pair():
  """A target over 8 tokens and a draft that agrees with it often but not always."""
  config = tiny_config(vocab_size=EXACT_VOCAB, d_model=32, num_heads=4, num_kv_heads=2, ffn_dim=64)
  target = transformer.create(config, seed=10)
  return target, exactness.noisy_copy(target, 0.6, seed=11)


@pytest.fixture(scope="session")
def small_pair():
  """``exact_pair()``, built once per test worker for the files that only read it (four files
  built it once each: 4-5.6 s of setup apiece, 2026-11-30)."""
  return exact_pair()


def sampled_counts(target, drafter, prompt, seed: int = 0, **loop):
  """EXACT_ROWS speculative continuations of EXACT_NEW_TOKENS after ``prompt``, counted in
  exactness's cells [V^N], and the run's summary. ``loop``: speculative_generate's options."""
  from specsamp.sampling.speculative import speculative_generate

  out = speculative_generate(
    target,
    drafter,
    np.tile(prompt, (EXACT_ROWS, 1)),
    np.full(EXACT_ROWS, len(prompt)),
    jax.random.key(seed),
    max_new_tokens=EXACT_NEW_TOKENS,
    **loop,
  )
  tokens = np.asarray(out.tokens[:, len(prompt) : len(prompt) + EXACT_NEW_TOKENS])
  return exactness.count_continuations(tokens, exactness.vocab_size(target)), out.summary()


def assert_follows(counts, target, prompt, sampling, level: float = 1e-3):
  """The G-test of ``counts`` against the warped target's enumerated continuations passes."""
  probs = exactness.exact_distribution(target, tuple(prompt), sampling, EXACT_NEW_TOKENS)
  test = exactness.g_test(counts, probs, level)
  assert not test["rejected"], test
