r"""Autoregressive generation for throughput: finished rows leave the batch, waiting prompts
take their places.

``autoregressive.generate`` runs one batch until its longest row ends, so a row that stops
early keeps being computed. For a latency loop that is the price of one program with no host
round trip; for making data (``training.regenerate``: thousands of answers, a few hundred tokens
each, most ending at EOS well before the cap) it is most of the work: on SmolLM2's answers a
batch of 64 kept 44% of its row-steps (2026-11-28, docs/training_on_answers.md section 12).

``generate`` here runs the same steps (``autoregressive.start`` / ``advance``: the same
warping, EOS and ``max_new_tokens``) in chunks of ``chunk_steps``, and between chunks:

- **refill** (continuous batching): with more prompts than ``batch_size``, the first
  ``batch_size`` start, and once ``refill_size`` places have finished the next waiting prompts
  are prefilled (``autoregressive.start`` on a cache of their own, at their own width) and put
  in those places, every cache slot of the row replaced (``KVCache.put_rows``). The batch keeps
  its size, so one decode program serves the whole run, and one prefill program per width;
- **compaction**, once nothing waits: when at most half of the batch is still running, the
  running rows are gathered (tokens, lengths and cache: ``KVCache.take_rows``) into a batch half
  as large, or smaller, padded with finished rows: batch sizes B, B/2, B/4, ..., at most
  log2(B) + 1 decode programs (``compact=False``: the batch keeps its size to the end).

What each row draws is a draw from its own warped distribution given its own tokens, as in
``autoregressive.generate``: greedy rows are identical, and a sampled row's law is the same,
while the particular draws differ. Step t of the run draws its uniforms with ``fold_in(rng,
t)`` and the r-th refill its first tokens with ``fold_in(fold_in(rng, 2^32 - 1), r)`` (each key
used once), and a row takes the uniforms of its place in the batch, which depends on the past
only: no uniform is used twice and none is chosen by what it is.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specsamp.config_fields import is_int
from specsamp.sampling import autoregressive, model_protocol, threefry
from specsamp.sampling.warping import SamplingConfig

REFILL_STREAM = 2**32 - 1
"""``fold_in(rng, REFILL_STREAM)`` keys the refills; the steps' keys are ``fold_in(rng, t)``
with t < 2^32 - 1."""


@dataclasses.dataclass(frozen=True)
class Generated:
  """What ``generate`` returns (host arrays).

  Attributes:
    tokens: [N, W] each prompt's row: the prompt and its new tokens, then ``pad_id``.
    lengths: [N] prompt + new tokens of each row (the prompt's length if it was not admitted).
    num_generated: [N] new tokens of each row.
    steps: the run's step counter at the end: the first batch's prefill and each decode step
      (a call of the model on the whole batch; the refills' prefills are ``prefills``).
    row_steps: rows times steps computed, padding and finished rows included, and a prefilled
      row's first token: the work done, against ``num_generated.sum()``, the work kept.
    batch_sizes: the batch's size in each chunk.
    prefills: prefill calls (the first batch's and each refill's).
    admitted: the prompts that ran: the first ``admitted`` (``admit`` stopped the rest).
  """

  tokens: np.ndarray
  lengths: np.ndarray
  num_generated: np.ndarray
  steps: int
  row_steps: int
  batch_sizes: tuple[int, ...]
  prefills: int
  admitted: int


@dataclasses.dataclass(frozen=True)
class _Programs:
  model_static: Any
  cache_length: int
  chunk_steps: int
  options: autoregressive.StepOptions

  @functools.partial(jax.jit, static_argnums=(0, 5))
  def start(self, model_dynamic, prompts_BT, prompt_lengths_B, rng, width):
    """The first batch prefilled, its first tokens drawn with ``fold_in(rng, 0)``; the token
    buffer ``width`` wide whatever the prompts' width."""
    model = model_protocol.merge_model(self.model_static, model_dynamic)
    cache = model.init_cache(prompts_BT.shape[0], self.cache_length)
    state = autoregressive.start(model, cache, prompts_BT, prompt_lengths_B, rng, self.options)
    return state.replace(tokens=self._widen(state.tokens, width))

  @functools.partial(jax.jit, static_argnums=0, donate_argnums=2)
  def chunk(self, model_dynamic, state, prompt_lengths_B, rng):
    """Up to ``chunk_steps`` steps; stops early once every row is done."""
    end = state.step + self.chunk_steps

    def body(state):
      model = model_protocol.merge_model(self.model_static, model_dynamic)
      return autoregressive.advance(model, state, prompt_lengths_B, rng, self.options)

    return jax.lax.while_loop(lambda s: (s.step < end) & ~jnp.all(s.done), body, state)

  @functools.partial(jax.jit, static_argnums=0, donate_argnums=2)
  def refill(self, model_dynamic, state, prompt_lengths_B, places_n, prompts_nT, lengths_n, key):
    """Prompts ``prompts_nT`` prefilled on a cache of their own, their first tokens drawn with
    ``fold_in(key, 0)``, and put in places ``places_n`` (an index past the batch: padding,
    dropped): tokens, lengths, done and every cache slot of those rows."""
    model = model_protocol.merge_model(self.model_static, model_dynamic)
    cache = model.init_cache(prompts_nT.shape[0], self.cache_length)
    new = autoregressive.start(model, cache, prompts_nT, lengths_n, key, self.options)
    tokens = self._widen(new.tokens, state.tokens.shape[1])
    state = state.replace(
      tokens=state.tokens.at[places_n].set(tokens, mode="drop"),
      lengths=state.lengths.at[places_n].set(new.lengths, mode="drop"),
      done=state.done.at[places_n].set(new.done, mode="drop"),
      cache=state.cache.put_rows(places_n, new.cache),
      nan=state.nan.at[places_n].set(new.nan, mode="drop"),
    )
    return state, prompt_lengths_B.at[places_n].set(lengths_n, mode="drop")

  @functools.partial(jax.jit, static_argnums=0)
  def take(self, state, prompt_lengths_B, rows_b, padding_b):
    """The state of rows ``rows_b``; ``padding_b`` rows are marked done."""
    state = state.replace(
      tokens=state.tokens[rows_b],
      lengths=state.lengths[rows_b],
      done=state.done[rows_b] | padding_b,
      cache=state.cache.take_rows(rows_b),
      nan=state.nan[rows_b],
    )
    return state, prompt_lengths_B[rows_b]

  def _widen(self, tokens_BW, width):
    """The token buffer padded with ``pad_id`` to ``width`` columns."""
    extra = width - tokens_BW.shape[1]
    return jnp.pad(tokens_BW, ((0, 0), (0, extra)), constant_values=self.options.pad_id)


def _width(prompts: np.ndarray, lengths: np.ndarray, width_step: int | None) -> np.ndarray:
  """The prompts cut to their longest, rounded up to ``width_step`` (None: kept whole)."""
  if width_step is None:
    return prompts
  width = min(prompts.shape[1], -(-int(lengths.max()) // width_step) * width_step)
  return prompts[:, :width]


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
  eos_id: int | Sequence[int] | None = None,
  pad_id: int = 0,
  cache_length: int | None = None,
  chunk_steps: int = 8,
  batch_size: int | None = None,
  refill_size: int | None = None,
  compact: bool = True,
  width_step: int | None = None,
  admit: Callable[[int], bool] | None = None,
  on_finished: Callable[[np.ndarray, np.ndarray, np.ndarray], None] | None = None,
) -> Generated:
  """``autoregressive.generate``'s samples (module docstring), finished rows leaving the batch
  and waiting prompts taking their places between chunks of ``chunk_steps`` steps.

  Args:
    model, prompts, prompt_lengths, rng, max_new_tokens, temperature, top_k, top_p, eos_id,
      pad_id, cache_length: as ``autoregressive.generate``; prompts are [N, T], any N. The
      model's cache must have ``take_rows`` and ``put_rows`` (``KVCache``: every model of
      specsamp).
    chunk_steps: decode steps between looks at the batch.
    batch_size: rows decoded at once (default N); the prompts start in order.
    refill_size: waiting prompts are prefilled this many at a time (padded when fewer wait),
      once as many places are free (default ``batch_size // 16``, at least 1): one prefill
      program per width. Places wait for it, and for the chunk to end, idle: on SmolLM2's
      answers (batch 64) B/4 and 16 steps kept 81% of the row-steps, B/16 and 8 steps 90%.
    compact: once no prompt waits, running rows gather into smaller batches.
    width_step: each prefill cuts its prompts to their longest, rounded up to a multiple of
      this (a program per width); None: every prefill is T wide.
    admit: ``admit(i)`` is asked before prompt i starts, in order; once it says False no later
      prompt starts (their rows come back unanswered: ``Generated.admitted``).
    on_finished: called with (prompt indices, their token rows, their lengths) as rows
      finish, before ``generate`` returns: a caller can keep what is done.
  """
  # 2.5 failed inside JAX as a shape (batch_size) or was cut by int() (chunk_steps,
  # refill_size); a width_step of 0 divided by zero, and a negative one cut prompts short of
  # their lengths, which then read as NaN logits (2026-11-30).
  for name, value, optional in (
    ("chunk_steps", chunk_steps, False),
    ("batch_size", batch_size, True),
    ("refill_size", refill_size, True),
    ("width_step", width_step, True),
  ):
    if not (optional and value is None) and (not is_int(value) or value < 1):
      raise ValueError(f"{name} must be {'None or ' * optional}an int >= 1, got {value!r}.")
  prompts, prompt_lengths, cache_length = autoregressive.check_generation(
    model, prompts, prompt_lengths, max_new_tokens, cache_length, batch_size
  )
  eos_id, pad_id = autoregressive.check_token_ids(eos_id, pad_id, model.vocab_size)
  count, prompt_width = prompts.shape
  batch = count if batch_size is None else int(batch_size)
  refill = max(1, batch // 16) if refill_size is None else int(refill_size)
  if not 1 <= refill <= batch:
    raise ValueError(f"Need 1 <= refill_size <= batch_size, got {refill} and {batch}.")
  threefry.check_key(rng)
  static, dynamic = model_protocol.split_model(model)
  programs = _Programs(
    static,
    cache_length,
    int(chunk_steps),
    autoregressive.StepOptions(
      SamplingConfig(temperature, top_k, top_p),
      autoregressive.stop_ids(eos_id),
      int(pad_id),
      int(max_new_tokens),
    ),
  )
  host_prompts, host_lengths = np.asarray(prompts), np.asarray(prompt_lengths)
  width = prompt_width + int(max_new_tokens)
  tokens = np.full((count, width), pad_id, np.int32)
  tokens[:, :prompt_width] = np.where(
    np.arange(prompt_width)[None, :] < host_lengths[:, None], host_prompts, pad_id
  )
  lengths = host_lengths.astype(np.int32).copy()
  admitted, closed = 0, False  # closed: admit said no, nothing more starts.

  def take_waiting(limit: int) -> np.ndarray:
    """The next prompts that ``admit`` lets start, at most ``limit``."""
    nonlocal admitted, closed
    first = admitted
    while admitted < min(count, first + limit) and (admit is None or admit(admitted)):
      admitted += 1
    if admitted < first + limit and admitted < count:
      closed = True
    return np.arange(first, admitted)

  def batch_of(indices: np.ndarray, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Prompts ``indices`` (padded to ``rows`` with the last) at their width."""
    chosen = np.concatenate([indices, np.full(rows - indices.size, indices[-1])])
    return _width(host_prompts[chosen], host_lengths[chosen], width_step), host_lengths[chosen]

  first = take_waiting(batch)
  if not first.size:
    return Generated(tokens, lengths, lengths - host_lengths, 0, 0, (), 0, 0)
  start_prompts, start_lengths = batch_of(first, batch)
  state = programs.start(dynamic, start_prompts, start_lengths, rng, width)
  batch_lengths = jnp.asarray(start_lengths)
  row_of = np.full(batch, -1)  # The prompt in each place of the batch; -1: none.
  row_of[: first.size] = first
  if first.size < batch:  # Places with no prompt: done from the start, free for a refill.
    state = state.replace(done=state.done | jnp.asarray(row_of < 0))
  refills, sizes, row_steps, step = 0, [], batch, 1
  refill_rng = threefry.fold_in(rng, REFILL_STREAM)
  while True:
    done = np.asarray(state.done)
    if np.asarray(state.nan).any():  # Before a row with NaN logits is kept or handed on.
      nan_rows = sorted(row_of[np.asarray(state.nan) & (row_of >= 0)].tolist())
      raise autoregressive.nan_logits_error(f"the model for prompts {nan_rows}")
    ended = np.nonzero(done & (row_of >= 0))[0]
    if ended.size:  # Kept as they are now: a done row never changes again.
      rows = row_of[ended]
      # The whole buffer to the host, then the rows: indexing on device would compile a gather
      # for every number of rows that end together.
      tokens[rows] = np.asarray(state.tokens)[ended]
      lengths[rows] = np.asarray(state.lengths)[ended]
      row_of[ended] = -1
      if on_finished is not None:
        on_finished(rows, tokens[rows], lengths[rows])
    free = np.nonzero(row_of < 0)[0]
    waiting = admitted < count and not closed
    running = np.nonzero(row_of >= 0)[0]
    if waiting and (free.size >= refill or not running.size):
      while free.size and admitted < count and not closed:
        new = take_waiting(min(refill, free.size))
        if not new.size:
          break
        places = np.concatenate([free[: new.size], np.full(refill - new.size, len(row_of))])
        new_prompts, new_lengths = batch_of(new, refill)
        state, batch_lengths = programs.refill(
          dynamic, state, batch_lengths, places, new_prompts, new_lengths,
          threefry.fold_in(refill_rng, refills),
        )  # fmt: skip
        row_of[free[: new.size]] = new
        refills += 1
        row_steps += refill
        free = free[new.size :]
      continue  # The refilled rows may have ended at their first token.
    if not running.size:
      break
    size = len(row_of)
    if compact and not waiting:
      while size > 1 and running.size <= -(-size // 2) and -(-size // 2) < size:
        size = -(-size // 2)
    if size < len(row_of):
      rows = np.concatenate([running, np.full(size - running.size, running[0])])
      padding = np.arange(size) >= running.size
      state, batch_lengths = programs.take(state, batch_lengths, rows, padding)
      row_of = np.where(padding, -1, row_of[rows])
    state = programs.chunk(dynamic, state, batch_lengths, rng)
    now = int(state.step)
    sizes.append(size)
    row_steps += size * (now - step)
    step = now
  return Generated(
    tokens=tokens,
    lengths=lengths,
    num_generated=lengths - host_lengths,
    steps=step,
    row_steps=row_steps,
    batch_sizes=tuple(sizes),
    prefills=1 + refills,
    admitted=admitted,
  )
