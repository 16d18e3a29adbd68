"""Timing on device: medians of repeated, synchronised calls, compilation excluded.

Everything here follows one discipline: compile and warm up first, then time
``repeats`` calls each ended by ``jax.block_until_ready``, and report the
median (robust to a noisy neighbour on a shared CPU). Three probes:

  time_calls              seconds per model call, as a jitted chain of dependent
                          calls (each fed the argmax of the previous logits, so
                          nothing is hoisted or cached away)
  measure_memory_bandwidth  bytes/s reading a large array (the decode floor)
  measure_matmul_flops    FLOP/s of a large square matmul (the compute ceiling)
"""

from __future__ import annotations

import functools
import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp

from specsamp.sampling import model_protocol


def median_seconds(fn: Callable[[], Any], repeats: int = 5, warmup: int = 1) -> float:
  """Median wall seconds of ``fn()`` (synchronised), after ``warmup`` untimed calls."""
  if repeats < 1:
    raise ValueError(f"repeats must be >= 1, got {repeats}.")
  for _ in range(max(warmup, 0)):
    jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return statistics.median(times)


@functools.partial(jax.jit, static_argnames=("graphdef", "num_calls"))
def _chain(graphdef, state, tokens_BT, cache, start, num_calls):
  """``num_calls`` calls of the model, each fed the argmax of the previous call's logits."""
  model = model_protocol.merge_model(graphdef, state)
  positions_BT = start + jnp.arange(tokens_BT.shape[1], dtype=jnp.int32)[None]
  positions_BT = jnp.broadcast_to(positions_BT, tokens_BT.shape)

  def body(_, carry):
    tokens_BT, cache = carry
    logits_BTV, cache = model(tokens_BT, positions_BT, cache)
    return jnp.argmax(logits_BTV, axis=-1).astype(jnp.int32), cache

  return jax.lax.fori_loop(0, num_calls, body, (tokens_BT, cache))[0]


def time_calls(model, batch_size: int, num_tokens: int, cache_length: int,
               num_calls: int = 32, repeats: int = 5) -> float:
  """Median seconds per model call processing ``num_tokens`` per row, with a cache of
  ``cache_length`` slots half full."""
  graphdef, state = model_protocol.split_model(model)
  cache = model.init_cache(batch_size, cache_length)
  tokens_BT = jnp.ones((batch_size, num_tokens), jnp.int32)
  start = max(cache_length // 2 - num_tokens, 0)
  run = lambda: _chain(graphdef, state, tokens_BT, cache, start, num_calls)
  return median_seconds(run, repeats) / num_calls


@jax.jit
def _sum(x_RC):
  return jnp.sum(x_RC)


@jax.jit
def _matvec(x_RC, v_C):
  return x_RC @ v_C


def measure_memory_bandwidth(num_bytes: int = 512 * 2**20, repeats: int = 5) -> float:
  """Bytes/s streaming a ``num_bytes`` float32 array (far larger than any cache) from memory:
  the better of a sum and a matrix-vector product (the decode step's access pattern)."""
  x_RC = jnp.ones((num_bytes // (4 * 4096), 4096), jnp.float32)
  v_C = jnp.ones((4096,), jnp.float32)
  seconds = min(median_seconds(lambda: _sum(x_RC), repeats),
                median_seconds(lambda: _matvec(x_RC, v_C), repeats))
  return x_RC.size * 4 / seconds


@jax.jit
def _matmul(a, b):
  return a @ b


def measure_matmul_flops(size: int = 2048, repeats: int = 5) -> float:
  """FLOP/s of a float32 [size, size] x [size, size] matmul."""
  a = jnp.ones((size, size), jnp.float32)
  b = jnp.ones((size, size), jnp.float32)
  return 2 * size ** 3 / median_seconds(lambda: _matmul(a, b), repeats)
