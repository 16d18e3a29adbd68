"""What drawing a token costs: the flat exponential race over the whole vocabulary against the
two-stage race over blocks of ``draws.race_block(V)`` tokens (``scripts/benchmark_draws.py``).

A speculative iteration draws a token at every drafted position, and one more from the
residual or the bonus; an autoregressive step draws one per row. Both races draw from 64 random
bits per entrant (``specsamp/sampling/draws.py``): the flat one V exponentials, the two-stage
one V / B + B. Each timed call runs ``draws_per_call`` draws inside one compiled loop (each
from its own key and a distribution that depends on the previous draw, so nothing is hoisted
out of the loop), so a call's dispatch is spread over them; calls are interleaved and the
medians kept (docs/benchmarks.md, "Two-stage draws below 4,096 tokens").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specsamp.experiments.benchmarks import timing
from specsamp.sampling import draws, threefry


def _looped(draw, logits_BV: jax.Array, draws_per_call: int):
  """A jitted call of ``draws_per_call`` dependent draws from softmax(logits)."""

  def body(i, total_B):
    key = threefry.fold_in(jnp.asarray(np.array([0, 7], np.uint32)), i)
    shifted = logits_BV + total_B.astype(jnp.float32)[:, None] * 1e-9
    return total_B + draw(key, jax.nn.softmax(shifted, axis=-1))

  rows = logits_BV.shape[0]
  return jax.jit(lambda: jax.lax.fori_loop(0, draws_per_call, body, jnp.zeros((rows,), jnp.int32)))


def measure(
  vocabs: Sequence[int],
  batch_sizes: Sequence[int],
  *,
  draws_per_call: int = 200,
  repeats: int = 9,
  seed: int = 0,
) -> list[dict[str, Any]]:
  """One record per (vocab, batch): microseconds per draw of each race, the block size and the
  ratio, medians over ``repeats`` interleaved calls."""
  records = []
  for vocab in vocabs:
    size = draws.race_block(vocab)
    for batch in batch_sizes:
      logits = jax.random.normal(jax.random.key(seed), (batch, vocab)) * 3.0
      ways = {
        "flat_us": _looped(
          lambda key, p: draws.categorical_from_words(draws.random_words(key, p.shape), p),
          logits,
          draws_per_call,
        ),
        "two_stage_us": _looped(
          lambda key, p, size=size: draws.two_stage_categorical(key, p, size),
          logits,
          draws_per_call,
        ),
      }
      seconds = timing.interleaved_medians(ways, repeats)
      record = {"vocab": vocab, "batch": batch, "block": size}
      for name, value in seconds.items():
        record[name] = round(value / draws_per_call * 1e6, 2)
      record["flat_over_two_stage"] = round(record["flat_us"] / record["two_stage_us"], 2)
      record["categorical"] = "flat" if vocab <= draws.FLAT_RACE_MAX else "two-stage"
      records.append(record)
  return records
