"""Autoregressive sampling as ONE jitted ``lax.while_loop`` on device.

Prompts of different lengths share a batch, right-padded: row b's prompt
occupies positions 0..prompt_lengths[b]-1 and its new tokens follow at its own
positions, so no row is shifted or left-padded. One prefill call fills the
cache; each loop iteration feeds every row's last token at that row's
position, samples the next token from the warped distribution with the key
``fold_in(rng, step)``, and appends it. Rows stop independently at EOS or
``max_new_tokens``; finished rows are padded and no longer advance. The loop
exits when every row is done: no host synchronisation per token.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specsamp import sharding
from specsamp.config_fields import is_int
from specsamp.models.output import ModelOutput
from specsamp.sampling import memory, model_protocol, threefry
from specsamp.sampling.warping import SamplingConfig, sample


@struct.dataclass
class GenerationOutput:
  """What a generator returns (device arrays).

  Attributes:
    tokens: [B, W] int32, each row's prompt followed by its generated tokens
      (EOS included), then ``pad_id``; W = padded prompt length + max_new_tokens.
    lengths: [B] int32, prompt + generated tokens of each row.
    num_generated: [B] int32, generated tokens of each row.
    model_calls: scalar int32, calls of the model (prefill included).
    nan_logits: [B] bool, the model gave the row NaN logits while it was generating
      (``generate`` raises ``FloatingPointError`` on any unless ``check_nan=False``).
  """

  tokens: jax.Array
  lengths: jax.Array
  num_generated: jax.Array
  model_calls: jax.Array
  nan_logits: jax.Array

  def generated(self, row: int) -> np.ndarray:
    """Host copy of one row's generated tokens."""
    end = int(self.lengths[row])
    return np.asarray(self.tokens[row, end - int(self.num_generated[row]) : end])


@struct.dataclass
class LoopState:
  """The loop's state between steps (``start``, ``advance``).

  Attributes:
    step: scalar int32, the next token's index among each row's new tokens (its key is
      ``fold_in(rng, step)``).
    tokens: [B, W] each row's prompt and tokens so far, then ``pad_id``.
    lengths: [B] prompt + tokens so far of each row.
    done: [B] rows that ended (EOS or ``max_new_tokens``).
    cache: the model's cache.
    nan: [B] the model gave the row NaN logits while it was active (a draw from them is
      meaningless: ``sample`` returns some token all the same).
  """

  step: jax.Array
  tokens: jax.Array
  lengths: jax.Array
  done: jax.Array
  cache: Any
  nan: jax.Array


def check_prompts(
  prompts: Any,
  prompt_lengths: Any,
  max_new_tokens: int,
  cache_length: int | None,
  extra_slots: int = 0,
  vocab_size: int | None = None,
) -> tuple[jax.Array, jax.Array, int]:
  """Validates a batch of right-padded prompts; returns them as int32 and the cache length.

  Args:
    prompts: [B, T] token ids, row b valid up to prompt_lengths[b].
    prompt_lengths: [B] lengths, 1 <= length <= T.
    max_new_tokens: tokens to generate per row (>= 1).
    cache_length: slots per row; None picks T + max_new_tokens + extra_slots.
    extra_slots: slots a sampler needs beyond prompt + new tokens (drafts).
    vocab_size: when given, every prompt token (up to its row's length) must be an id in
      [0, vocab_size): an embedding lookup would silently clip an out-of-range id.

  The ids and lengths must be whole numbers (a float or a 64-bit id was cast silently: 5.7
  read as 5, 2^32 + 5 as 5). The padding past each row's length may hold any integer (-100,
  V): it is replaced by 0 here, since an out-of-range id embeds as NaN, which the masked
  attention still multiplies by 0.
  """
  prompts, prompt_lengths = _integers(prompts, "prompts"), _integers(prompt_lengths, "lengths")
  if prompts.ndim != 2 or prompts.shape[0] < 1 or prompts.shape[1] < 1:
    raise ValueError(
      f"prompts must be [batch, length] with batch and length >= 1, got shape {prompts.shape}."
    )
  if prompt_lengths.shape != (prompts.shape[0],):
    raise ValueError(
      f"prompt_lengths must have shape ({prompts.shape[0]},), got {prompt_lengths.shape}."
    )
  if not is_int(max_new_tokens) or max_new_tokens < 1:
    raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}.")
  if not isinstance(prompt_lengths, jax.core.Tracer):
    lengths = np.asarray(prompt_lengths)
    if lengths.min() < 1 or lengths.max() > prompts.shape[1]:
      raise ValueError(
        f"prompt_lengths must be in [1, {prompts.shape[1]}], got {lengths.tolist()}."
      )
    if vocab_size is not None and not isinstance(prompts, jax.core.Tracer):
      ids = np.asarray(prompts)
      valid = np.arange(ids.shape[1])[None, :] < lengths[:, None]
      bad = valid & ((ids < 0) | (ids >= vocab_size))
      if bad.any():
        row, column = (int(i[0]) for i in np.nonzero(bad))
        raise ValueError(
          f"Prompt token id {int(ids[row, column])} (row {row}, position {column}) is outside "
          f"the model's vocabulary [0, {vocab_size}): tokenize with the model's tokenizer."
        )
  valid_BT = jnp.arange(prompts.shape[1])[None, :] < jnp.asarray(prompt_lengths)[:, None]
  prompts = jnp.where(valid_BT, jnp.asarray(prompts), 0).astype(jnp.int32)
  prompt_lengths = jnp.asarray(prompt_lengths, jnp.int32)
  needed = prompts.shape[1] + max_new_tokens + extra_slots
  if cache_length is None:
    cache_length = needed
  if not is_int(cache_length):  # NaN, inf and "64" failed in int() or a comparison.
    raise ValueError(f"cache_length must be None or an int, got {cache_length!r}.")
  if cache_length < needed:
    raise ValueError(
      f"The cache has {cache_length} slots per row but prompts of length {prompts.shape[1]} "
      f"+ max_new_tokens={max_new_tokens}"
      + (f" + {extra_slots} draft slots" if extra_slots else "")
      + f" need {needed}: the prompt is too long for the cache; raise cache_length or "
      "shorten the prompt."
    )
  return prompts, prompt_lengths, int(cache_length)


def _integers(values: Any, name: str) -> Any:
  """``values`` as an integer array (a JAX array, or a tracer, as it is), refused in one line
  when they are not whole numbers (floats such as ``np.ones(B)`` that hold whole numbers are
  read as the integers they are) or not rectangular."""
  if isinstance(values, jax.Array):  # A tracer, or an array already on the devices.
    array = values
  else:
    try:
      array = np.asarray(values)
    except ValueError as error:  # Rows of different lengths.
      raise ValueError(
        f"{name} must be a rectangular array; right-pad the rows to one length and give "
        f"each row's length in prompt_lengths ({error})."
      ) from error
  if array.dtype.kind == "f" and not isinstance(array, jax.core.Tracer):
    host = np.asarray(array)
    whole = np.isfinite(host) & (host == np.round(host))
    if not whole.all():  # np.ones(B) is a length of 1; 1.9 is no length.
      raise ValueError(
        f"{name} must be integers, got {float(host[~whole].ravel()[0])!r} (dtype {host.dtype})."
      )
    return host.astype(np.int64)
  if array.dtype.kind not in "iub":
    raise ValueError(f"{name} must be integers, got dtype {array.dtype}.")
  return array


def check_generation(
  model: Any,
  prompts: Any,
  prompt_lengths: Any,
  max_new_tokens: int,
  cache_length: int | None,
  batch_size: int | None = None,
) -> tuple[jax.Array, jax.Array, int]:
  """What a generator checks before it allocates anything: the model follows the decode
  protocol, the prompts are valid (``check_prompts``), and a KV cache of ``batch_size`` rows
  (default: one per prompt) fits in memory. Returns the prompts as int32 and the cache
  length."""
  model_protocol.check_model(model)
  prompts, prompt_lengths, cache_length = check_prompts(
    prompts, prompt_lengths, max_new_tokens, cache_length, vocab_size=model.vocab_size
  )
  check_cache_fits(model, prompts.shape[0] if batch_size is None else batch_size, cache_length)
  return prompts, prompt_lengths, cache_length


def check_cache_fits(model: Any, rows: int, cache_length: int) -> None:
  """Refuses, before allocating, a KV cache of ``rows`` x ``cache_length`` slots that the
  devices' memory cannot hold (``memory.check_fits``)."""
  memory.check_fits(
    {"KV cache": memory.cache_bytes(model, rows, cache_length)},
    f"{rows} rows x {cache_length} cache slots",
  )


def stop_ids(eos_id: Any) -> tuple[int, ...] | None:
  """``eos_id`` as the tuple of ids that end a row: None (never), one id, or several (an HF
  generation_config's list: Llama 3's end of text and end of turn, Gemma's <eos> and
  <end_of_turn>), in order, each once."""
  if eos_id is None:
    return None
  ids = [eos_id] if np.ndim(eos_id) == 0 else list(eos_id)
  return tuple(dict.fromkeys(int(i) for i in ids))


def is_stop(tokens: jax.Array, eos_ids: int | Sequence[int]) -> jax.Array:
  """Whether each token is one of ``eos_ids`` (static: one comparison per id)."""
  eos_ids = stop_ids(eos_ids)
  ended = tokens == eos_ids[0]
  for eos in eos_ids[1:]:
    ended = ended | (tokens == eos)
  return ended


def check_token_ids(
  eos_id: Any, pad_id: Any, vocab_size: int
) -> tuple[tuple[int, ...] | None, int]:
  """(eos ids, pad_id): ``eos_id`` None (never stop), one id, or a non-empty sequence of ids
  (a row ends after emitting any of them; ``stop_ids``), each in [0, vocab_size); ``pad_id``
  any int (it only fills the output). A None pad id, a float or an EOS id past the vocabulary
  (which never stopped a row) are refused in one line (they failed as a bare int() deep in
  the loop)."""

  def is_id(value: Any) -> bool:
    return is_int(value) and 0 <= value < vocab_size

  try:
    several = isinstance(eos_id, (list, tuple, np.ndarray)) and np.ndim(eos_id) == 1
  except ValueError:  # A ragged list (NumPy cannot shape it): not a list of ids.
    several = False
  eos_id = eos_id.item() if isinstance(eos_id, np.ndarray) and eos_id.ndim == 0 else eos_id
  if eos_id is not None and not (
    all(is_id(i) for i in eos_id) and len(eos_id) > 0 if several else is_id(eos_id)
  ):
    raise ValueError(
      f"eos_id must be None, one token id or a non-empty list of token ids, each in "
      f"[0, {vocab_size}), got {eos_id!r}."
    )
  if not is_int(pad_id) or not -(2**31) <= pad_id < 2**31:  # It fills an int32 buffer.
    raise ValueError(f"pad_id must be an int32 (it fills each row after its end), got {pad_id!r}.")
  return stop_ids(eos_id), int(pad_id)


def prefill(
  model: Any,
  prompts_BT: jax.Array,
  prompt_lengths_B: jax.Array,
  cache: Any,
  capture_layers: tuple[int, ...] = (),
) -> ModelOutput:
  """Runs the padded prompts through the model; returns each row's last logits [B, V] and the
  cache (``ModelOutput``; its features, with ``capture_layers``, are those at every prompt
  position: decode protocol (g)).

  Padding tokens write cache slots at or beyond their row's length; those are
  masked until the row's real tokens overwrite them.
  """
  batch, length = prompts_BT.shape
  positions_BT = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
  last_B = (prompt_lengths_B - 1).astype(jnp.int32)
  if model_protocol.takes_logits_at(model):  # Decode protocol (h): only the last logits.
    out = model_protocol.score(
      model, prompts_BT, positions_BT, cache, capture_layers, logits_at=last_B
    )
    last_BV = out.logits[:, 0]
  else:
    out = model_protocol.score(model, prompts_BT, positions_BT, cache, capture_layers)
    last_BV = jnp.take_along_axis(out.logits, last_B[:, None, None], axis=1)[:, 0]
  if last_BV.shape[-1] != model.vocab_size:  # Static: refused while tracing.
    raise ValueError(
      f"{type(model).__name__} declares vocab_size={model.vocab_size} but its logits are "
      f"{last_BV.shape[-1]} wide: token ids are read from the logits' positions, so the two must "
      "agree (an output head padded past the tokenizer's size is its vocab_size; a draft over "
      "fewer rows than the target goes through model_protocol.PaddedVocabulary)."
    )
  return ModelOutput(last_BV, out.cache.replace(lengths=prompt_lengths_B), out.features)


def initial_tokens(
  prompts_BT: jax.Array, prompt_lengths_B: jax.Array, width: int, pad_id: int
) -> jax.Array:
  """The [B, width] token buffer: each row's prompt, then pad_id."""
  batch, length = prompts_BT.shape
  valid_BT = jnp.arange(length)[None, :] < prompt_lengths_B[:, None]
  tokens = jnp.full((batch, width), pad_id, jnp.int32)
  return tokens.at[:, :length].set(jnp.where(valid_BT, prompts_BT, pad_id))


@dataclasses.dataclass(frozen=True)
class StepOptions:
  """What ``start`` and ``advance`` need beyond the model and the state (hashable).

  Attributes:
    sampling: the warping sampled from.
    eos_id: a row ends after emitting this id, or any of these ids (None: never).
    pad_id: fills each row after its last token.
    max_new_tokens: tokens generated per row at most.
  """

  sampling: SamplingConfig
  eos_id: tuple[int, ...] | None
  pad_id: int
  max_new_tokens: int


def start(
  model: Any,
  cache: Any,
  prompts_BT: jax.Array,
  prompt_lengths_B: jax.Array,
  rng: jax.Array,
  options: StepOptions,
) -> LoopState:
  """Prefills the prompts and samples each row's first token (key ``fold_in(rng, 0)``)."""
  batch, prompt_width = prompts_BT.shape
  with jax.named_scope("prefill"):
    last_logits_BV, cache = prefill(model, prompts_BT, prompt_lengths_B, cache)
  first_B = sample(threefry.fold_in(rng, 0), last_logits_BV, options.sampling)
  tokens_BW = initial_tokens(
    prompts_BT, prompt_lengths_B, prompt_width + options.max_new_tokens, options.pad_id
  )
  tokens_BW = tokens_BW.at[jnp.arange(batch), prompt_lengths_B].set(first_B)
  done_B = jnp.full((batch,), options.max_new_tokens == 1)
  if options.eos_id is not None:
    done_B = done_B | is_stop(first_B, options.eos_id)
  return LoopState(
    step=jnp.int32(1),
    tokens=tokens_BW,
    lengths=prompt_lengths_B + 1,
    done=done_B,
    cache=cache,
    nan=model_protocol.has_nan(last_logits_BV),
  )


def advance(
  model: Any,
  state: LoopState,
  prompt_lengths_B: jax.Array,
  rng: jax.Array,
  options: StepOptions,
) -> LoopState:
  """One step: every row's last token through the model, the next drawn with the key
  ``fold_in(rng, step)``; rows already done append ``pad_id`` and do not advance."""
  rows_B = jnp.arange(state.tokens.shape[0])
  positions_B = state.lengths - 1
  last_B = state.tokens[rows_B, positions_B]
  with jax.named_scope("step"):  # The decode call, named as the speculative loop's parts are.
    logits_B1V, cache = model(last_B[:, None], positions_B[:, None], state.cache)
  with jax.named_scope("sample"):
    next_B = sample(threefry.fold_in(rng, state.step), logits_B1V[:, 0], options.sampling)
  active_B = ~state.done
  tokens_BW = state.tokens.at[rows_B, state.lengths].set(
    jnp.where(active_B, next_B, options.pad_id), mode="drop"
  )
  lengths_B = state.lengths + active_B
  done_B = state.done | (lengths_B - prompt_lengths_B >= options.max_new_tokens)
  if options.eos_id is not None:
    done_B = done_B | (active_B & is_stop(next_B, options.eos_id))
  return LoopState(
    step=state.step + 1,
    tokens=tokens_BW,
    lengths=lengths_B,
    done=done_B,
    cache=cache,
    nan=state.nan | (active_B & model_protocol.has_nan(logits_B1V)),
  )


@dataclasses.dataclass(frozen=True)
class AutoregressiveLoop:
  """The autoregressive loop's static settings, hashable; calling it runs the jitted loop.

  Attributes:
    model_static: the model's structure (``model_protocol.split_model``).
    max_new_tokens: tokens generated per row at most.
    sampling: the warping sampled from.
    eos_id: a row ends after emitting this id, or any of these ids (None: never).
    pad_id: fills each row after its last token.
    cache_length: KV cache slots per row.
  """

  model_static: Any
  max_new_tokens: int
  sampling: SamplingConfig
  eos_id: tuple[int, ...] | None
  pad_id: int
  cache_length: int

  @classmethod
  def for_model(
    cls,
    model: Any,
    *,
    max_new_tokens: int,
    sampling: SamplingConfig,
    eos_id: int | Sequence[int] | None,
    pad_id: int,
    cache_length: int,
  ) -> tuple[AutoregressiveLoop, Any]:
    """(loop, the model's arrays): what ``generate`` calls, and what ``experiments.aot``
    lowers for a TPU slice."""
    static, dynamic = model_protocol.split_model(model)
    loop = cls(
      model_static=static,
      max_new_tokens=int(max_new_tokens),
      sampling=sampling,
      eos_id=stop_ids(eos_id),
      pad_id=int(pad_id),
      cache_length=int(cache_length),
    )
    return loop, dynamic

  @functools.partial(jax.jit, static_argnums=0)
  def __call__(
    self, model_dynamic: Any, prompts_BT: jax.Array, prompt_lengths_B: jax.Array, rng: jax.Array
  ) -> GenerationOutput:
    """Runs the loop on right-padded prompts; token t is drawn with ``fold_in(rng, t)``."""
    return self._run(model_dynamic, None, prompts_BT, prompt_lengths_B, rng)[0]

  @functools.partial(jax.jit, static_argnums=0, donate_argnums=2)
  def reusing(
    self,
    model_dynamic: Any,
    cache: Any,
    prompts_BT: jax.Array,
    prompt_lengths_B: jax.Array,
    rng: jax.Array,
  ) -> tuple[GenerationOutput, Any]:
    """``__call__`` on an earlier call's cache (donated, returned for the next call): nothing
    is allocated or zeroed, and the output is bit-identical (as ``SpeculativeLoop.reusing``)."""
    return self._run(model_dynamic, cache, prompts_BT, prompt_lengths_B, rng)

  @property
  def options(self) -> StepOptions:
    return StepOptions(self.sampling, self.eos_id, self.pad_id, self.max_new_tokens)

  def _run(self, model_dynamic, cache, prompts_BT, prompt_lengths_B, rng):
    model = model_protocol.merge_model(self.model_static, model_dynamic)
    if cache is None:
      cache = model.init_cache(prompts_BT.shape[0], self.cache_length)
    state = start(model, cache, prompts_BT, prompt_lengths_B, rng, self.options)

    def cond(state: LoopState) -> jax.Array:
      return (state.step < self.max_new_tokens) & ~jnp.all(state.done)

    def body(state: LoopState) -> LoopState:
      model = model_protocol.merge_model(self.model_static, model_dynamic)
      return advance(model, state, prompt_lengths_B, rng, self.options)

    state = jax.lax.while_loop(cond, body, state)
    output = sharding.replicated(
      GenerationOutput(
        tokens=state.tokens,
        lengths=state.lengths,
        num_generated=state.lengths - prompt_lengths_B,
        model_calls=state.step,
        nan_logits=state.nan,
      )
    )
    return output, state.cache


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
  check_nan: bool = True,
) -> GenerationOutput:
  """Samples up to ``max_new_tokens`` per row from ``model``, autoregressively, on device.

  Args:
    model: any model following the decode protocol (``model_protocol``).
    prompts: [B, T] int token ids, right-padded; row b valid up to prompt_lengths[b].
    prompt_lengths: [B] ints in [1, T].
    rng: a JAX random key; step t uses ``fold_in(rng, t)``.
    max_new_tokens: tokens generated per row at most.
    temperature, top_k, top_p: the warping (see ``warping.SamplingConfig``); 0 is greedy.
    eos_id: a row stops after emitting this id, or any of these ids (kept in its output).
    pad_id: fills each row after its last token.
    cache_length: KV cache slots per row; default T + max_new_tokens.
    check_nan: raise ``FloatingPointError`` if the model gave NaN logits (one host check;
      False: only ``nan_logits`` reports them).

  Returns:
    A ``GenerationOutput``. Compiled once per (model structure, shapes, options)
    and reused.
  """
  threefry.check_key(rng)
  sampling = SamplingConfig(temperature, top_k, top_p)
  prompts, prompt_lengths, cache_length = check_generation(
    model, prompts, prompt_lengths, max_new_tokens, cache_length
  )
  eos_id, pad_id = check_token_ids(eos_id, pad_id, model.vocab_size)
  loop, dynamic = AutoregressiveLoop.for_model(
    model,
    max_new_tokens=max_new_tokens,
    sampling=sampling,
    eos_id=eos_id,
    pad_id=pad_id,
    cache_length=cache_length,
  )
  shape = f"{prompts.shape[0]} rows x {cache_length} cache slots"
  return run_loop(lambda: loop(dynamic, prompts, prompt_lengths, rng), shape, check_nan)


def run_loop(call: Any, shape: str, check_nan: bool) -> Any:
  """Runs ``call()`` (a compiled sampler loop) and waits for it: an allocation failure becomes
  a one-line error naming ``shape``, and NaN logits a ``FloatingPointError`` (when
  ``check_nan``, and the call is not traced by a caller's jit). The output is returned as the
  call returned it; its first part (or itself) carries ``nan_logits``."""
  try:
    result = call()
    out = result[0] if isinstance(result, tuple) else result
    # Under a caller's jit or vmap there is nothing to wait for or look at: nan_logits says it.
    check_nan = check_nan and not isinstance(out.nan_logits, jax.core.Tracer)
    nan = check_nan and bool(jnp.any(out.nan_logits))  # Waits: an allocation failure shows here.
  except jax.errors.JaxRuntimeError as error:
    if memory.is_out_of_memory(error):
      raise memory.out_of_memory_error(error, shape) from error
    raise
  if nan:
    rows = np.flatnonzero(np.asarray(out.nan_logits)).tolist()
    raise nan_logits_error(f"the target or draft model in rows {rows}")
  return result


def nan_logits_error(where: str) -> FloatingPointError:
  """The error for NaN logits from ``where`` (the samplers' and regeneration's); +inf logits and
  rows that are -inf throughout are reported as NaN logits too (``model_protocol.has_nan``)."""
  return FloatingPointError(
    f"NaN logits from {where} (or +inf, or -inf for every token): check the weights and "
    "inputs (e.g. a bad checkpoint, or float16 overflow)."
  )
