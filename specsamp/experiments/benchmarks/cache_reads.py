"""Does a decode step's cost follow the live cache or the allocated one? ``scripts/
benchmark_cache.py``.

Autoregressive ms/token of one model at the same positions (a prompt of ``position`` tokens,
then ``new_tokens`` more) with caches of different allocated sizes, with the cache read whole
(``attention_block_size=0``) and in blocks up to the live position. With blocked reads, a
cache 16x larger than needed should cost (almost) nothing; read whole, a step's attention
grows with the allocated slots.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import numpy as np

from specsamp.experiments.benchmarks import timing
from specsamp.models import transformer
from specsamp.models.config import TransformerConfig
from specsamp.sampling import autoregressive


def measure(
  config: TransformerConfig,
  *,
  position: int,
  new_tokens: int,
  cache_lengths: Sequence[int],
  block_sizes: Sequence[int],
  repeats: int,
  calls: int,
  log: Callable[[str], None] = print,
) -> list[dict]:
  """ms/token per (block size, cache length), the settings interleaved ``repeats`` times so
  that machine noise is shared; the median of each setting's repeats."""
  prompts = np.random.default_rng(0).integers(3, config.vocab_size, (1, position), np.int32)
  lengths = np.full((1,), position, np.int32)
  models = {
    block: transformer.create(config.replace(attention_block_size=block), seed=0)
    for block in block_sizes
  }
  settings = [(block, length) for block in block_sizes for length in cache_lengths]
  samples: dict[tuple[int, int], list[float]] = {setting: [] for setting in settings}
  for _ in range(repeats):
    for block, length in settings:

      def sample(batch, index, model=models[block], length=length):
        return autoregressive.generate(
          model,
          *batch,
          jax.random.key(index),
          max_new_tokens=new_tokens,
          temperature=0.0,
          cache_length=length,
        )

      timed = timing.time_sampler("autoregressive", sample, [(prompts, lengths)], calls)
      samples[(block, length)].append(timed.ms_per_token)
  rows = []
  for block, length in settings:
    ms = float(np.median(samples[(block, length)]))
    rows.append({"block_size": block, "cache_slots": length, "ms_per_token": ms})
    log(f"block {block:>4}, cache {length:>5} slots: {ms:.3f} ms/token (position {position})")
  for block in block_sizes:
    by_length = {r["cache_slots"]: r["ms_per_token"] for r in rows if r["block_size"] == block}
    smallest, largest = min(by_length), max(by_length)
    ratio = by_length[largest] / by_length[smallest]
    log(f"block {block:>4}: {largest} slots cost {ratio:.2f}x {smallest} slots")
    for r in rows:
      if r["block_size"] == block:
        r["ratio_to_smallest"] = r["ms_per_token"] / by_length[smallest]
  return rows
