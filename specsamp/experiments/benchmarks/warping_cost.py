"""What warping a batch of distributions costs: the nucleus searched in its most likely blocks
first against the whole vocabulary, both forced on any platform (a CPU chooses the blocks by
default, accelerators the whole vocabulary), and top-k (``scripts/benchmark_warping.py``).

A speculative iteration warps the target's distribution at every scored position and the
draft's at every drafted one, and an autoregressive step warps one per row, so this cost is
paid per token by every sampler at T > 0 (docs/benchmarks.md, "The nucleus in its most likely
blocks"). Calls are interleaved and the medians kept; each case also reports how many rows
found their nucleus in the blocks (the rest search the whole vocabulary too).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specsamp.experiments.benchmarks import timing
from specsamp.sampling import warping


def zipf_logits(rows: int, vocab: int, exponent: float, seed: int = 0) -> np.ndarray:
  """[rows, vocab] float32 logits of Zipf-like distributions (the r-th most likely token's
  probability about r^-exponent, a language model's shape), shuffled over the ids."""
  rng = np.random.default_rng(seed)
  rank_logits = -exponent * np.log(np.arange(1, vocab + 1)) + rng.normal(0, 0.5, (rows, vocab))
  return np.stack([rng.permutation(row) for row in rank_logits]).astype(np.float32)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _nucleus(logits_BV, top_p, blocks_first):
  return warping.nucleus_mask(logits_BV, top_p, blocks_first=blocks_first)


@functools.partial(jax.jit, static_argnums=1)
def _top_k(logits_BV, top_k):
  return warping.top_k_mask(logits_BV, top_k)


@functools.partial(jax.jit, static_argnums=1)
def _found(logits_BV, top_p):
  probs = jax.nn.softmax(logits_BV.astype(jnp.float32), axis=-1)
  keys = jax.lax.bitcast_convert_type(probs, jnp.int32)
  return warping._nucleus_in_top_blocks(keys, probs, top_p)[2]


def measure(
  logits: np.ndarray,
  batch_sizes: Sequence[int],
  temperature: float,
  top_p: float,
  top_k: int = 50,
  repeats: int = 11,
) -> list[dict[str, Any]]:
  """One record per batch size: the median ms of each way over the first rows of
  ``logits / temperature``, and whether both nucleus ways kept the same tokens."""
  records = []
  for batch in batch_sizes:
    x = jnp.asarray(logits[:batch] / temperature)
    ways = {
      "nucleus_blocks_first_ms": lambda: _nucleus(x, top_p, True),
      "nucleus_whole_vocabulary_ms": lambda: _nucleus(x, top_p, False),
      f"top_{top_k}_ms": lambda: _top_k(x, top_k),
    }
    seconds = timing.interleaved_medians(ways, repeats)
    same = bool(np.array_equal(_nucleus(x, top_p, True), _nucleus(x, top_p, False)))
    record = {"batch": batch, "vocab": int(x.shape[-1]), "temperature": temperature}
    record.update(top_p=top_p, same_tokens=same)
    record["rows_found_in_blocks"] = int(np.sum(_found(x, top_p)))
    record.update({name: 1e3 * s for name, s in seconds.items()})
    records.append(record)
  return records
