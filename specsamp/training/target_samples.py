r"""Training text sampled from the target itself: corpus prompts, the target's continuations.

A feature head (or a distilled draft) drafts what the target will write, on contexts the
target wrote. Training on the corpus teaches it the corpus's contexts; training on the
target's own samples teaches it the contexts it meets at inference (Medusa-2's and EAGLE's
self-distillation data). The loss is unchanged: the KL to the target's distribution at every
position, so the samples only choose the contexts.

``sample_stream`` draws ``num_sequences`` corpus windows of ``prompt_tokens`` tokens (evenly
spaced, a seeded shuffle), lets the target continue each with ``new_tokens`` tokens at
``temperature`` (autoregressively, in batches, on device), and returns the prompts and
continuations back to back as one token stream, ready for ``data.Batches.pack``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from specsamp.sampling import autoregressive


def sample_stream(
  target: Any,
  stream: np.ndarray,
  *,
  num_sequences: int,
  prompt_tokens: int,
  new_tokens: int,
  temperature: float = 1.0,
  batch_size: int = 16,
  seed: int = 0,
  log: Callable[[str], None] | None = None,
) -> np.ndarray:
  """[num_sequences * (prompt_tokens + new_tokens)] tokens: each corpus prompt followed by the
  target's continuation of it (module docstring)."""
  stream = np.asarray(stream)
  if num_sequences < 1 or prompt_tokens < 1 or new_tokens < 1 or batch_size < 1:
    raise ValueError(
      "target samples need num_sequences, prompt_tokens, new_tokens and batch_size >= 1, got "
      f"{num_sequences}, {prompt_tokens}, {new_tokens}, {batch_size}."
    )
  windows = len(stream) // prompt_tokens
  if windows < 1:
    raise ValueError(f"The corpus ({len(stream)} tokens) is shorter than one prompt.")
  order = np.random.default_rng(seed).permutation(windows)
  starts = order[np.arange(num_sequences) % windows] * prompt_tokens
  prompts = np.stack([stream[s : s + prompt_tokens] for s in starts]).astype(np.int32)
  rows = []
  key = jax.random.key(seed)
  for first in range(0, num_sequences, batch_size):
    batch = prompts[first : first + batch_size]
    count = len(batch)
    if count < batch_size:  # Same shapes for every call: one compiled loop.
      batch = np.concatenate([batch, np.repeat(batch[-1:], batch_size - count, 0)])
    out = autoregressive.generate(
      target,
      batch,
      np.full((batch_size,), prompt_tokens, np.int32),
      jax.random.fold_in(key, first),
      max_new_tokens=new_tokens,
      temperature=temperature,
    )
    rows.append(np.asarray(out.tokens)[:count, : prompt_tokens + new_tokens])
    if log:
      log(f"  target samples: {first + count} of {num_sequences} sequences")
  return np.concatenate(rows).reshape(-1)
