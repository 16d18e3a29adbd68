"""A sampler that keeps its compiled loops and KV caches between calls, as serving engines do.

``speculative_generate`` and ``generate`` are one-shot: every call splits the models,
validates, allocates both KV caches and zeroes them inside the compiled loop. For a
long-lived sampler that is wasted work: zeroing an 8192-slot cache costs a 64-token call
1.42x its 512-slot cost (docs/benchmarks.md). A ``Sampler``

  * splits the target and the drafter once;
  * keeps one loop object per request shape (so jit's cache lookup is a dictionary hit);
  * hands each call the caches the previous call of that shape left behind, donated
    (``SpeculativeLoop.reusing`` / ``AutoregressiveLoop.reusing``), and keeps the ones it
    returns: nothing is allocated or zeroed after the first call of a shape;
  * keeps the caches of at most ``max_kept_shapes`` shapes (batch and cache length), dropping
    the least recently used before allocating another's: the default cache length follows the
    prompt width, max_new_tokens and K, so a long-lived sampler kept a pair of caches for
    every width it saw until memory ran out (2026-11-30). ``clear()`` drops them all.

Old cache entries lie beyond every row's length, where attention never reads them (the
rollback invariant of ``kv_cache.py``), so every output is bit-identical to a fresh call's
with the same key. A call whose models produced NaN drops its caches (a NaN key or value
would otherwise reach later calls through 0 x NaN in attention).

``num_draft_tokens=0`` is plain autoregressive sampling through the same method: the
autoregressive loop of the target, its output dressed as a ``SpeculativeOutput`` with one
token per target call (what the automatic draft length picks when no K pays).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from specsamp.config_fields import is_int
from specsamp.sampling import autoregressive, drafters, model_protocol, speculative, threefry
from specsamp.sampling.statistics import SpeculativeOutput
from specsamp.sampling.tree import TreeShape
from specsamp.sampling.warping import SamplingConfig


def as_speculative_output(output: autoregressive.GenerationOutput) -> SpeculativeOutput:
  """An autoregressive run as a speculative one with K = 0: every row-iteration one target
  call and one token, no draft."""
  batch = output.tokens.shape[0]
  generated_B = output.num_generated.astype(jnp.int32)
  return SpeculativeOutput(
    tokens=output.tokens,
    lengths=output.lengths,
    num_generated=output.num_generated,
    model_calls=output.model_calls,
    draft_calls=jnp.int32(0),
    scored_tokens=(output.model_calls - 1).astype(jnp.int32),
    iterations=generated_B,
    accepted_histogram=generated_B[:, None],
    uncapped_histogram=generated_B[:, None],
    accepted_at_position=jnp.zeros((batch, 0), jnp.int32),
    verified_at_position=jnp.zeros((batch, 0), jnp.int32),
    proposed=jnp.zeros((batch,), jnp.int32),
    nan_logits=output.nan_logits,
    accepted_at_rank=jnp.zeros((batch, 0), jnp.int32),
    reached_at_rank=jnp.zeros((batch, 0), jnp.int32),
  )


@dataclasses.dataclass(frozen=True)
class Sampler:
  """A target and a drafter with their compiled loops and caches kept between calls.

  Attributes:
    target: a decode-protocol model.
    draft: a ``drafters.Drafter``, a decode-protocol draft model, or None (autoregressive
      only).
    eos_id: a row stops after emitting this id, or any of these ids.
    pad_id: fills each row after its last token.
    check_nan: raise ``FloatingPointError`` on NaN logits (one host check per call).
    max_kept_shapes: how many request shapes' caches are kept (least recently used dropped).

  Frozen: the models are split once, here, so a reassigned ``target`` or ``draft`` would be
  ignored (it was, silently); make a new ``Sampler`` instead. Weights updated in place
  (``nnx.update`` on the same modules) are read at the next call.
  """

  target: Any
  draft: Any = None
  eos_id: int | Sequence[int] | None = None
  pad_id: int = 0
  check_nan: bool = True
  max_kept_shapes: int = 4

  def __post_init__(self):
    if not is_int(self.max_kept_shapes) or self.max_kept_shapes < 1:
      raise ValueError(f"max_kept_shapes must be an int >= 1, got {self.max_kept_shapes!r}.")
    model_protocol.check_model(self.target, "target")
    autoregressive.check_token_ids(self.eos_id, self.pad_id, self.target.vocab_size)
    drafter, drafter_split = None, None
    if self.draft is not None:
      drafter = drafters.as_drafter(self.draft)
      drafter.check(self.target)
      drafter_split = drafter.split()
    set_ = functools.partial(object.__setattr__, self)  # Frozen: set once, here.
    set_("_target_split", model_protocol.split_model(self.target))
    set_("_drafter", drafter)
    set_("_drafter_split", drafter_split)
    set_("_caches", {})

  def generate(
    self,
    prompts: Any,
    prompt_lengths: Any,
    rng: jax.Array,
    *,
    max_new_tokens: int,
    num_draft_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    verifier: str = "token",
    schedule: str = "fixed",
    cache_length: int | None = None,
    tree: str | TreeShape | None = None,
    synthetic_acceptance: float | None = None,
    narrow_scoring: bool = False,
  ) -> SpeculativeOutput:
    """``speculative_generate``'s sampling (its arguments mean the same) on kept caches;
    ``num_draft_tokens=0`` (an int, numpy's too) samples autoregressively, and the draft's
    options (verifier, schedule, tree, narrow scoring) are then unused: the automatic draft
    length calls every K with the same options. Bit-identical to a fresh call."""
    threefry.check_key(rng)
    sampling = SamplingConfig(temperature, top_k, top_p)
    if not is_int(num_draft_tokens) or num_draft_tokens < 0:
      raise ValueError(
        "num_draft_tokens (K) must be an int >= 0 (0: autoregressive sampling), got "
        f"{num_draft_tokens!r}."
      )
    if num_draft_tokens == 0:
      return self._autoregressive(
        prompts, prompt_lengths, rng, max_new_tokens, sampling, cache_length
      )
    if self._drafter is None:
      raise ValueError(
        "This Sampler has no draft: num_draft_tokens must be 0 (autoregressive sampling)."
      )
    prompts, prompt_lengths, cache_length, tree, shape = speculative.check_request(
      self.target,
      self._drafter,
      prompts,
      prompt_lengths,
      max_new_tokens=max_new_tokens,
      num_draft_tokens=num_draft_tokens,
      verifier=verifier,
      schedule=schedule,
      cache_length=cache_length,
      tree=tree,
      synthetic_acceptance=synthetic_acceptance,
      check_memory=False,
      narrow_scoring=narrow_scoring,
    )
    loop = speculative.SpeculativeLoop(
      target_static=self._target_split[0],
      drafter_static=self._drafter_split[0],
      max_new_tokens=int(max_new_tokens),
      num_draft_tokens=int(num_draft_tokens),
      sampling=sampling,
      verifier=verifier,
      schedule=schedule,
      eos_id=autoregressive.stop_ids(self.eos_id),
      pad_id=int(self.pad_id),
      cache_length=int(cache_length),
      tree=tree,
      narrow_scoring=bool(narrow_scoring),
    )
    batch = prompts.shape[0]
    key = ("speculative", batch, cache_length)
    caches = self._caches.pop(key, None)
    if caches is None:  # The first call of this shape allocates (after the memory check).
      self._make_room()
      speculative.check_buffers_fit(
        self.target, self._drafter, batch, cache_length, num_draft_tokens, tree, shape
      )
      caches = self._fresh_caches(batch, cache_length)
    arguments = (prompts, prompt_lengths, rng, jnp.float32(synthetic_acceptance or 0.0))
    output, (target_cache, state) = speculative.run_loop(
      lambda: loop.reusing(self._target_split[1], self._drafter_split[1], caches, *arguments),
      shape,
      check_nan=False,
    )
    return self._keep(key, output, (target_cache, self._drafter.kept_state(state)))

  def _fresh_caches(self, batch: int, cache_length: int) -> tuple[Any, Any]:
    target_cache = jax.jit(self.target.init_cache, static_argnums=(0, 1))(batch, cache_length)
    state = jax.jit(self._drafter.empty_state, static_argnums=(0, 1))(batch, cache_length)
    return target_cache, state

  def clear(self) -> None:
    """Drops every kept cache (their device memory is freed once nothing else holds them);
    the next call of each shape allocates again. Compiled loops stay."""
    self._caches.clear()

  def _make_room(self) -> None:
    """Drops the least recently used shapes' caches until one more fits ``max_kept_shapes``
    (a call pops its shape's caches and ``_keep`` puts them back last: the dict is in order of
    use)."""
    while len(self._caches) >= self.max_kept_shapes:
      del self._caches[next(iter(self._caches))]

  def _keep(self, key: Any, output: Any, caches: Any) -> Any:
    """Keeps a call's caches for the next call of its shape, unless a model produced NaN."""
    nan = bool(jnp.any(output.nan_logits))
    if not nan:
      self._caches[key] = caches
    elif self.check_nan:
      speculative.run_loop(lambda: output, "", check_nan=True)  # Raises the NaN error.
    return output

  def _autoregressive(self, prompts, prompt_lengths, rng, max_new_tokens, sampling, cache_length):
    prompts, prompt_lengths, cache_length = autoregressive.check_prompts(
      prompts, prompt_lengths, max_new_tokens, cache_length, vocab_size=self.target.vocab_size
    )
    loop = autoregressive.AutoregressiveLoop(
      model_static=self._target_split[0],
      max_new_tokens=int(max_new_tokens),
      sampling=sampling,
      eos_id=autoregressive.stop_ids(self.eos_id),
      pad_id=int(self.pad_id),
      cache_length=int(cache_length),
    )
    batch = prompts.shape[0]
    key = ("autoregressive", batch, cache_length)
    cache = self._caches.pop(key, None)
    if cache is None:  # The first call of this shape allocates (after the memory check).
      self._make_room()
      autoregressive.check_cache_fits(self.target, batch, cache_length)
      cache = jax.jit(self.target.init_cache, static_argnums=(0, 1))(batch, cache_length)
    output, cache = speculative.run_loop(
      lambda: loop.reusing(self._target_split[1], cache, prompts, prompt_lengths, rng),
      f"{batch} rows x {cache_length} cache slots",
      check_nan=False,
    )
    return self._keep(key, as_speculative_output(output), cache)
