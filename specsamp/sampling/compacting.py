r"""Autoregressive generation for throughput: rows that finish leave the batch.

``autoregressive.generate`` runs one batch until its longest row ends, so a row that stops
early keeps being computed. For a latency loop that is the price of one program with no host
round trip; for making data (``training.regenerate``: thousands of answers, a few hundred tokens
each, most ending at EOS well before the cap) it is most of the work: on SmolLM2's answers a
batch of 64 kept 44% of its row-steps (2026-11-28, docs/training_on_answers.md section 12).

``generate`` here runs the same steps (``autoregressive.start`` / ``advance``: the same
warping, EOS and ``max_new_tokens``, token t of the loop drawn with ``fold_in(rng, t)``) in
chunks of ``chunk_steps``; between chunks, once at most half of the batch is still running, the
running rows are gathered (tokens, lengths and cache: ``KVCache.take_rows``) into a batch half
as large, or smaller, padded with finished rows. The batch sizes are B, B/2, B/4, ... (rounded
up), so at most log2(B) + 1 step programs compile.

What each row draws is a draw from its own warped distribution given its own tokens, as in
``autoregressive.generate``: greedy rows are identical, and a sampled row's law is the same
(the uniforms a step's key gives are independent of the past, and a row takes one of them by its
place in the batch, which depends on the past only), while the particular draws differ.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specsamp.sampling import autoregressive, model_protocol
from specsamp.sampling.warping import SamplingConfig


@dataclasses.dataclass(frozen=True)
class Generated:
  """What ``generate`` returns (host arrays).

  Attributes:
    tokens: [B, W] each row's prompt and new tokens, then ``pad_id``.
    lengths: [B] prompt + new tokens of each row.
    num_generated: [B] new tokens of each row.
    steps: model calls (the prefill and the decode steps): the longest row's new tokens.
    row_steps: rows times steps computed, padding and finished rows included: the work done,
      against ``num_generated.sum()``, the work kept.
    batch_sizes: the batch's size in each chunk.
  """

  tokens: np.ndarray
  lengths: np.ndarray
  num_generated: np.ndarray
  steps: int
  row_steps: int
  batch_sizes: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class _Programs:
  model_static: Any
  cache_length: int
  chunk_steps: int
  options: autoregressive.StepOptions

  @functools.partial(jax.jit, static_argnums=0)
  def start(self, model_dynamic, prompts_BT, prompt_lengths_B, rng):
    model = model_protocol.merge_model(self.model_static, model_dynamic)
    cache = model.init_cache(prompts_BT.shape[0], self.cache_length)
    return autoregressive.start(model, cache, prompts_BT, prompt_lengths_B, rng, self.options)

  @functools.partial(jax.jit, static_argnums=0, donate_argnums=2)
  def chunk(self, model_dynamic, state, prompt_lengths_B, rng):
    """Up to ``chunk_steps`` steps; stops early once every row is done."""
    end = jnp.minimum(state.step + self.chunk_steps, self.options.max_new_tokens)

    def body(state):
      model = model_protocol.merge_model(self.model_static, model_dynamic)
      return autoregressive.advance(model, state, prompt_lengths_B, rng, self.options)

    return jax.lax.while_loop(lambda s: (s.step < end) & ~jnp.all(s.done), body, state)

  @functools.partial(jax.jit, static_argnums=0)
  def take(self, state, prompt_lengths_B, rows_b, padding_b):
    """The state of rows ``rows_b``; ``padding_b`` rows are marked done."""
    state = state.replace(
      tokens=state.tokens[rows_b],
      lengths=state.lengths[rows_b],
      done=state.done[rows_b] | padding_b,
      cache=state.cache.take_rows(rows_b),
    )
    return state, prompt_lengths_B[rows_b]


def generate(
  model: Any,
  prompts: Any,
  prompt_lengths: Any,
  rng: jax.Array,
  *,
  max_new_tokens: int,
  temperature: float = 1.0,
  top_k: int = 0,
  top_p: float = 1.0,
  eos_id: int | None = None,
  pad_id: int = 0,
  cache_length: int | None = None,
  chunk_steps: int = 16,
) -> Generated:
  """``autoregressive.generate``'s samples (module docstring), with finished rows dropped
  between chunks of ``chunk_steps`` steps. The model's cache must have ``take_rows``
  (``KVCache``: every model of specsamp)."""
  if chunk_steps < 1:
    raise ValueError(f"chunk_steps must be >= 1, got {chunk_steps}.")
  prompts, prompt_lengths, cache_length = autoregressive.check_generation(
    model, prompts, prompt_lengths, max_new_tokens, cache_length
  )
  static, dynamic = model_protocol.split_model(model)
  programs = _Programs(
    static,
    cache_length,
    int(chunk_steps),
    autoregressive.StepOptions(
      SamplingConfig(temperature, top_k, top_p),
      None if eos_id is None else int(eos_id),
      int(pad_id),
      int(max_new_tokens),
    ),
  )
  state = programs.start(dynamic, prompts, prompt_lengths, rng)
  given_lengths = np.asarray(prompt_lengths)
  full = prompts.shape[0]
  tokens = np.full(state.tokens.shape, pad_id, np.int32)
  lengths = np.zeros(full, np.int32)
  row_of = np.arange(full)  # The caller's row in each place of the batch; -1: padding.
  sizes, row_steps, step = [], full, 1  # Row-steps: the first tokens (prefill) too.
  while True:
    done = np.asarray(state.done)
    ended = np.nonzero(done & (row_of >= 0))[0]
    if ended.size:  # Kept as they are now: a done row never changes again.
      tokens[row_of[ended]] = np.asarray(state.tokens[ended])
      lengths[row_of[ended]] = np.asarray(state.lengths[ended])
      row_of[ended] = -1
    running = np.nonzero(row_of >= 0)[0]
    if not running.size:
      break
    size = len(row_of)
    while size > 1 and running.size <= -(-size // 2) and -(-size // 2) < size:
      size = -(-size // 2)
    if size < len(row_of):
      rows = np.concatenate([running, np.full(size - running.size, running[0])])
      padding = np.arange(size) >= running.size
      state, prompt_lengths = programs.take(state, prompt_lengths, rows, padding)
      row_of = np.where(padding, -1, row_of[rows])
    state = programs.chunk(dynamic, state, prompt_lengths, rng)
    now = int(state.step)
    sizes.append(size)
    row_steps += size * (now - step)
    step = now
  return Generated(
    tokens=tokens,
    lengths=lengths,
    num_generated=lengths - given_lengths,
    steps=step,
    row_steps=row_steps,
    batch_sizes=tuple(sizes),
  )
