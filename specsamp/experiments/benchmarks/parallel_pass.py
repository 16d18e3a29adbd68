"""What one parallel draft call costs, in standalone draft steps (issue 39's goal: a call that
proposes K = 4 costs <= 1.5 steps): scripts/benchmark_parallel.py.

A draft step is one call on 1 token per row at position n - 1; a parallel call is the
``ParallelDrafter``'s call of width 2K (``parallel_drafter.window``: K + 1 committed tokens, K - 1
placeholders), only its last K positions through the head when the model can. Each is compiled
once with its cache donated, warmed up, then timed interleaved with the others (``calls``
rounds); medians. The same executables give each call's arithmetic and bytes (XLA's cost
analysis): where the pass costs more steps than its bytes would (this CPU), the extra FLOPs
say why.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specsamp.experiments.proofs import hlo_ops
from specsamp.sampling.parallel_drafter import ParallelDrafter


def time_pass(
  drafter: ParallelDrafter,
  num_draft_tokens: Sequence[int],
  *,
  batch_size: int = 1,
  position: int = 100,
  cache_length: int = 512,
  calls: int = 200,
  seed: int = 0,
) -> dict[str, Any]:
  """{'step_ms', 'step_gflop', 'step_mb', 'calls': {K: {'ms', 'draft_steps', 'gflop', 'mb'}}}
  at ``position``: median times, and XLA's FLOPs and bytes accessed per call."""
  model = drafter.model
  vocab = model.vocab_size
  tokens = jnp.asarray(
    np.random.default_rng(seed).integers(0, vocab, (batch_size, position + 1)), jnp.int32
  )
  lengths = jnp.full((batch_size,), position, jnp.int32)

  def step(cache, tokens):
    last = jnp.full((batch_size, 1), position - 1, jnp.int32)
    return model(tokens[:, position - 1 : position], last, cache)[:2]

  def parallel(k):
    def call(cache, tokens):
      return drafter.distributions(cache, tokens, lengths, k)

    return call

  functions = {"step": step, **{k: parallel(k) for k in num_draft_tokens}}
  compiled = {
    name: jax.jit(f, donate_argnums=0)
    .lower(model.init_cache(batch_size, cache_length), tokens)
    .compile()
    for name, f in functions.items()
  }
  counts = {name: hlo_ops.xla_cost(f) for name, f in compiled.items()}
  caches = {}
  for name, f in compiled.items():  # Warm up.
    caches[name] = f(model.init_cache(batch_size, cache_length), tokens)[1]
  seconds = {name: [] for name in compiled}
  for _ in range(calls):
    for name, f in compiled.items():
      start = time.perf_counter()
      out = jax.block_until_ready(f(caches[name], tokens))
      seconds[name].append(time.perf_counter() - start)
      caches[name] = out[1]
  step_s = float(np.median(seconds["step"]))
  return {
    "step_ms": 1e3 * step_s,
    "step_gflop": counts["step"][0] / 1e9,
    "step_mb": counts["step"][1] / 1e6,
    "calls": {
      k: {
        "ms": 1e3 * float(np.median(seconds[k])),
        "draft_steps": float(np.median(seconds[k])) / step_s,
        "gflop": counts[k][0] / 1e9,
        "mb": counts[k][1] / 1e6,
      }
      for k in num_draft_tokens
    },
  }
