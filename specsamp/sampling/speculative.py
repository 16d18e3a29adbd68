r"""Speculative sampling (Chen et al. 2023) as ONE jitted ``lax.while_loop`` on device.

Per row b with ``n_b`` tokens so far (prompt + generated), both KV caches hold
positions 0..n_b-2: the last token, at n_b-1, is not yet fed. One iteration:

  1. Draft: the drafter (``drafters.py``: a draft model, the target's own
     first layers, or prompt lookup) proposes up to K tokens x~_t with the
     distributions q_t they were drawn from, k_b <= K of them for row b
     (the draft-length schedule's limit, or fewer if the drafter stops).
  2. Score: ONE target call on [x_{n_b-1}, x~_1..x~_K] at positions
     n_b-1..n_b-1+K gives p_1..p_{K+1}.
  3. Verify (``verification.py``: token-wise, block or greedy) the first k_b
     tokens: n accepted draft tokens and one emitted token per row.
  4. Append x~_1..x~_n and the emitted token to each row (cut at EOS and at
     max_new_tokens), and roll both caches back to the row's new length - 1
     by resetting their ``lengths``: rejected entries are never read again.

Every row accepts its own count; rows stop independently; finished rows ride
along without advancing. Nothing returns to the host until the loop ends.

Draft-length schedules (per row, in static shapes: K is the compiled maximum,
a shorter draft is masked in verification and, for a model drafter, its
scan stops when no row needs more):
  'fixed'      k_b = K every iteration;
  'heuristic'  HF's: start at K; +2 (capped at K) after a fully accepted
               draft, -1 (floor 1) otherwise.
k_b depends only on the past, so every schedule is exact.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from specsamp import sharding
from specsamp.config_fields import is_int
from specsamp.sampling import (
  chain_step,
  drafters,
  memory,
  model_protocol,
  threefry,
  tree_step,
)
from specsamp.sampling.autoregressive import (
  check_prompts,
  check_token_ids,
  initial_tokens,
  is_stop,
  prefill,
  run_loop,
  stop_ids,
)
from specsamp.sampling.statistics import (  # noqa: F401 (re-exported)
  STATISTICS,
  SpeculativeOutput,
  count_appended,
  summarize,
)
from specsamp.sampling.step import Step, StepInput
from specsamp.sampling.tree import TreeShape
from specsamp.sampling.warping import SamplingConfig


@struct.dataclass
class _LoopState:
  """The while_loop's carry. Statistics carry the names they have in SpeculativeOutput."""

  step: jax.Array
  tokens: jax.Array  # [B, W]
  lengths: jax.Array
  done: jax.Array
  target_cache: Any
  drafter_state: Any
  draft_limit: jax.Array  # [B] k_b, the schedule's draft length for the next iteration.
  draft_calls: jax.Array
  scored_tokens: jax.Array
  iterations: jax.Array
  accepted_histogram: jax.Array
  uncapped_histogram: jax.Array
  accepted_at_position: jax.Array
  verified_at_position: jax.Array
  proposed: jax.Array
  nan_logits: jax.Array
  accepted_at_rank: jax.Array  # [B, R]
  reached_at_rank: jax.Array  # [B, R]


def append(
  tokens_BW: jax.Array,
  lengths_B: jax.Array,
  active_B: jax.Array,
  draft_tokens_BG: jax.Array,
  accepted_B: jax.Array,
  next_token_B: jax.Array,
  limit_B: jax.Array,
  eos_id: tuple[int, ...] | None,
  pad_id: int,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Writes each active row's accepted drafts and its emitted token after its last token.

  Args:
    tokens_BW: the token buffer; every slot at or past a row's length holds ``pad_id``.
    lengths_B: tokens per row so far.
    active_B: rows still generating (the others append nothing).
    draft_tokens_BG: this iteration's accepted path (a chain: its proposals), in order.
    accepted_B: n, the draft tokens accepted per row.
    next_token_B: the emitted token per row.
    limit_B: the most tokens a row may take (what max_new_tokens leaves it).
    eos_id: a row ends after emitting this id, or any of these ids (None: never).
    pad_id: written past each row's appended tokens.

  Returns:
    (tokens_BW, count_B, ended_B): the buffer, the tokens appended per row (0 for an inactive
    row; cut after the first EOS), and whether the row emitted EOS.
  """
  rows_B = jnp.arange(tokens_BW.shape[0])
  offsets_G1 = jnp.arange(draft_tokens_BG.shape[1] + 1)
  emitted_BG1 = jnp.where(
    offsets_G1 < accepted_B[:, None],
    jnp.concatenate([draft_tokens_BG, draft_tokens_BG[:, :1]], axis=1),
    next_token_B[:, None],
  )
  count_B = jnp.minimum(accepted_B + 1, limit_B)
  ended_B = jnp.zeros_like(active_B)
  if eos_id is not None:
    is_eos_BG1 = is_stop(emitted_BG1, eos_id) & (offsets_G1 < count_B[:, None])
    ended_B = jnp.any(is_eos_BG1, axis=1)
    count_B = jnp.where(ended_B, jnp.argmax(is_eos_BG1, axis=1) + 1, count_B)
  count_B = jnp.where(active_B, count_B, 0)
  keep_BG1 = offsets_G1 < count_B[:, None]
  tokens_BW = tokens_BW.at[rows_B[:, None], lengths_B[:, None] + offsets_G1].set(
    jnp.where(keep_BG1, emitted_BG1, pad_id)
  )
  return tokens_BW, count_B, ended_B & active_B


SCHEDULES = ("fixed", "heuristic")
EXACT_VERIFIERS = chain_step.VERIFIERS  # A user's choice; temperature 0 verifies by argmax.


def next_draft_limit(
  schedule: str,
  limit_B: jax.Array,
  proposed_B: jax.Array,
  accepted_B: jax.Array,
  num_draft_tokens: int,
) -> jax.Array:
  """k_b for the next iteration. 'heuristic' (HF's): +2 after a fully accepted non-empty
  draft, -1 otherwise, within [1, K]."""
  if schedule == "fixed":
    return limit_B
  full_B = (accepted_B == proposed_B) & (proposed_B > 0)
  return jnp.clip(jnp.where(full_B, limit_B + 2, limit_B - 1), 1, num_draft_tokens).astype(
    jnp.int32
  )


@dataclasses.dataclass(frozen=True)
class SpeculativeLoop:
  """The speculative loop's static settings, hashable; calling it runs the jitted loop.

  One compiled program per distinct loop (settings and model structures) and shapes, as
  gemma's SamplerLoop: the loop object itself is jit's static argument.

  Attributes:
    target_static: the target's structure (``model_protocol.split_model``).
    drafter_static: the drafter's structure (``Drafter.split``).
    max_new_tokens: tokens generated per row at most.
    num_draft_tokens: K, the most draft tokens proposed per iteration.
    sampling: the warping both models sample with.
    verifier: 'token', 'block' or 'synthetic' (greedy sampling verifies by argmax).
    schedule: the draft-length schedule, one of SCHEDULES.
    eos_id: a row ends after emitting this id, or any of these ids (None: never).
    pad_id: fills each row after its last token.
    cache_length: KV cache slots per row.
    tree: a tree proposal's shape (``tree.py``), or None for a single chain of K; with a
      tree, K is its depth and the verifier 'token' (recursive rejection sampling) or
      'traversal'.
    narrow_scoring: score each iteration with the narrowest of 1..K + 1 tokens that holds
      every row's proposal (``chain_step.score_narrow``; chains only), not always K + 1.
  """

  target_static: Any
  drafter_static: Any
  max_new_tokens: int
  num_draft_tokens: int
  sampling: SamplingConfig
  verifier: str
  schedule: str
  eos_id: tuple[int, ...] | None
  pad_id: int
  cache_length: int
  tree: TreeShape | None = None
  narrow_scoring: bool = False

  @classmethod
  def for_models(
    cls,
    target: Any,
    drafter: drafters.Drafter,
    *,
    max_new_tokens: int,
    num_draft_tokens: int,
    sampling: SamplingConfig,
    verifier: str,
    schedule: str,
    eos_id: int | Sequence[int] | None,
    pad_id: int,
    cache_length: int,
    tree: TreeShape | None = None,
    narrow_scoring: bool = False,
  ) -> tuple[SpeculativeLoop, Any, Any]:
    """(loop, target arrays, drafter arrays): what ``speculative_generate`` calls, and what
    ``experiments.aot`` lowers for a TPU slice."""
    target_static, target_dynamic = model_protocol.split_model(target)
    drafter_static, drafter_dynamic = drafter.split()
    loop = cls(
      target_static=target_static,
      drafter_static=drafter_static,
      max_new_tokens=int(max_new_tokens),
      num_draft_tokens=int(num_draft_tokens),
      sampling=sampling,
      verifier=verifier,
      schedule=schedule,
      eos_id=stop_ids(eos_id),
      pad_id=int(pad_id),
      cache_length=int(cache_length),
      tree=tree,
      narrow_scoring=bool(narrow_scoring),
    )
    return loop, target_dynamic, drafter_dynamic

  @property
  def step(self) -> Step:
    """This loop's step, chosen once: one chain of K (``chain_step``) or a tree
    (``tree_step``); the same call and result either way."""
    if self.tree is None:
      return chain_step.ChainStep(
        self.num_draft_tokens, self.sampling, self.verifier, self.narrow_scoring
      )
    return tree_step.TreeStep(self.tree, self.sampling, self.verifier)

  @functools.partial(jax.jit, static_argnums=0)
  def __call__(
    self,
    target_dynamic: Any,
    drafter_dynamic: Any,
    prompts_BT: jax.Array,
    prompt_lengths_B: jax.Array,
    rng: jax.Array,
    synthetic_acceptance: jax.Array,
  ) -> SpeculativeOutput:
    """Runs the loop on right-padded prompts; iteration i uses ``fold_in(rng, i)``."""
    output, _ = self._run(
      target_dynamic,
      drafter_dynamic,
      None,
      prompts_BT,
      prompt_lengths_B,
      rng,
      synthetic_acceptance,
    )
    return output

  @functools.partial(jax.jit, static_argnums=0, donate_argnums=3)
  def reusing(
    self,
    target_dynamic: Any,
    drafter_dynamic: Any,
    caches: tuple[Any, Any],
    prompts_BT: jax.Array,
    prompt_lengths_B: jax.Array,
    rng: jax.Array,
    synthetic_acceptance: jax.Array,
  ) -> tuple[SpeculativeOutput, tuple[Any, Any]]:
    """``__call__`` on the (target cache, drafter state) of an earlier call of this loop, which
    are donated and come back for the next call: no cache is allocated or zeroed, so a call
    costs what its context costs. Old entries lie beyond every row's length, where nothing
    reads them (as after a rollback), so the output is bit-identical to ``__call__``'s."""
    return self._run(
      target_dynamic,
      drafter_dynamic,
      caches,
      prompts_BT,
      prompt_lengths_B,
      rng,
      synthetic_acceptance,
    )

  def _run(
    self,
    target_dynamic: Any,
    drafter_dynamic: Any,
    caches: tuple[Any, Any] | None,
    prompts_BT: jax.Array,
    prompt_lengths_B: jax.Array,
    rng: jax.Array,
    synthetic_acceptance: jax.Array,
  ) -> tuple[SpeculativeOutput, tuple[Any, Any]]:
    batch, prompt_width = prompts_BT.shape
    num_draft_tokens = self.num_draft_tokens
    target = model_protocol.merge_model(self.target_static, target_dynamic)
    drafter = drafters.Drafter.merge(self.drafter_static, drafter_dynamic)
    step = self.step
    with jax.named_scope("prefill"):
      # Both take the prompt; the last prompt token is fed by the first iteration.
      target_cache, drafter_state = caches if caches is not None else (None, None)
      if target_cache is None:
        target_cache = target.init_cache(batch, self.cache_length)
      # A feature drafter starts from the prompt's features (None for any other).
      prefilled = prefill(
        target, prompts_BT, prompt_lengths_B, target_cache, drafter.feature_layers
      )
      target_logits, target_cache = prefilled
      drafter_state, drafter_nan = drafter.init(
        prompts_BT,
        prompt_lengths_B,
        self.cache_length,
        num_draft_tokens,
        state=drafter_state,
        features_BTF=prefilled.features,
      )
    width = prompt_width + self.max_new_tokens + num_draft_tokens + 1
    zeros_B = jnp.zeros((batch,), jnp.int32)
    ranks = step.ranks
    state = _LoopState(
      step=jnp.int32(0),
      tokens=initial_tokens(prompts_BT, prompt_lengths_B, width, self.pad_id),
      lengths=prompt_lengths_B,
      done=jnp.zeros((batch,), bool),
      target_cache=target_cache.replace(lengths=prompt_lengths_B - 1),
      drafter_state=drafter_state,
      draft_limit=jnp.full((batch,), num_draft_tokens, jnp.int32),
      draft_calls=jnp.int32(drafter.model_calls_per_prefill),
      scored_tokens=jnp.int32(0),
      iterations=zeros_B,
      accepted_histogram=jnp.zeros((batch, num_draft_tokens + 1), jnp.int32),
      uncapped_histogram=jnp.zeros((batch, num_draft_tokens + 1), jnp.int32),
      accepted_at_position=jnp.zeros((batch, num_draft_tokens), jnp.int32),
      verified_at_position=jnp.zeros((batch, num_draft_tokens), jnp.int32),
      proposed=zeros_B,
      nan_logits=model_protocol.has_nan(target_logits) | drafter_nan,
      accepted_at_rank=jnp.zeros((batch, ranks), jnp.int32),
      reached_at_rank=jnp.zeros((batch, ranks), jnp.int32),
    )

    def body(state: _LoopState) -> _LoopState:
      target = model_protocol.merge_model(self.target_static, target_dynamic)
      drafter = drafters.Drafter.merge(self.drafter_static, drafter_dynamic)
      key = threefry.fold_in(rng, state.step)
      lengths_B, active_B = state.lengths, ~state.done
      # Never draft past max_new_tokens: with r tokens left, r - 1 drafts and the emitted
      # token fill the row. The limit depends on the past only, so it keeps exactness.
      remaining_B = self.max_new_tokens - (lengths_B - prompt_lengths_B)
      limit_B = jnp.where(active_B, jnp.minimum(state.draft_limit, remaining_B - 1), 0)
      inputs = StepInput(
        tokens=state.tokens,
        lengths=lengths_B,
        limit=limit_B,
        target_cache=state.target_cache,
        drafter_state=state.drafter_state,
      )
      result = step(target, drafter, inputs, key, synthetic_acceptance)
      with jax.named_scope("append"):
        tokens_BW, count_B, ended_B = append(
          state.tokens,
          lengths_B,
          active_B,
          result.path_tokens,
          result.num_accepted,
          result.next_token,
          remaining_B,
          self.eos_id,
          self.pad_id,
        )
        new_lengths_B = lengths_B + count_B
        done_B = state.done | ended_B | (new_lengths_B - prompt_lengths_B >= self.max_new_tokens)
      with jax.named_scope("statistics"):
        counted = count_appended(
          active_B,
          result.draft_depth,
          result.num_accepted,
          count_B,
          num_draft_tokens,
          result.num_proposed,
          result.rank_counts,
          capped_B=remaining_B - 1 < state.draft_limit,
        )
      return state.replace(
        step=state.step + 1,
        tokens=tokens_BW,
        lengths=new_lengths_B,
        done=done_B,
        target_cache=result.target_cache.replace(lengths=new_lengths_B - 1),
        drafter_state=drafter.rollback(result.drafter_state, new_lengths_B),
        draft_limit=next_draft_limit(
          self.schedule,
          state.draft_limit,
          result.draft_depth,
          result.num_accepted,
          num_draft_tokens,
        ),
        draft_calls=state.draft_calls + result.draft_calls,
        scored_tokens=state.scored_tokens + result.scored_tokens,
        nan_logits=state.nan_logits | (active_B & result.nan),
        **{name: getattr(state, name) + counted[name] for name in STATISTICS},
      )

    state = jax.lax.while_loop(lambda state: ~jnp.all(state.done), body, state)
    output = sharding.replicated(
      SpeculativeOutput(
        tokens=state.tokens[:, : prompt_width + self.max_new_tokens],
        lengths=state.lengths,
        num_generated=state.lengths - prompt_lengths_B,
        model_calls=state.step + 1,
        draft_calls=state.draft_calls,
        scored_tokens=state.scored_tokens,
        nan_logits=state.nan_logits,
        **{name: getattr(state, name) for name in STATISTICS},
      )
    )
    return output, (state.target_cache, state.drafter_state)


def check_request(
  target: Any,
  drafter: drafters.Drafter,
  prompts: Any,
  prompt_lengths: Any,
  *,
  max_new_tokens: int,
  num_draft_tokens: int,
  verifier: str,
  schedule: str,
  cache_length: int | None,
  synthetic_acceptance: float | None = None,
  tree: str | TreeShape | None = None,
  check_memory: bool = True,
  narrow_scoring: bool = False,
) -> tuple[jax.Array, jax.Array, int, TreeShape | None, str]:
  """Validates one speculative request (``speculative_generate``'s arguments, the models
  already checked) with a one-line error for each bad input, and checks that its buffers fit.

  Returns:
    (prompts, prompt_lengths, cache_length, tree, shape): int32 prompts, the cache length,
    the parsed tree (or None), and the request's shape in words for error messages.
  """
  if not is_int(num_draft_tokens) or num_draft_tokens < 1:  # Before the tree's depth is held
    raise ValueError(  # against it: num_draft_tokens='2' read "=2 must equal ... depth, 2".
      f"num_draft_tokens (K) must be an int >= 1, got {num_draft_tokens!r}."
    )
  tree = tree_step.check_tree(tree, num_draft_tokens, verifier, target, drafter)
  if narrow_scoring and tree is not None:
    raise ValueError(
      "narrow_scoring applies to chains: a tree's scoring call is as wide as its nodes."
    )
  if schedule not in SCHEDULES:
    raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}.")
  if tree is None and verifier not in (*EXACT_VERIFIERS, "synthetic"):
    raise ValueError(
      f"verifier must be one of {EXACT_VERIFIERS} (both exact), got {verifier!r} "
      "('synthetic' also exists, for benchmarks only: it is not exact)."
    )
  if (verifier == "synthetic") != (synthetic_acceptance is not None):
    raise ValueError(
      "synthetic_acceptance is set with verifier='synthetic', and only then "
      f"(got verifier={verifier!r}, synthetic_acceptance={synthetic_acceptance!r})."
    )
  if synthetic_acceptance is not None and not 0.0 <= synthetic_acceptance <= 1.0:
    raise ValueError(f"synthetic_acceptance must be in [0, 1], got {synthetic_acceptance!r}.")
  prompts, prompt_lengths, cache_length = check_prompts(
    prompts,
    prompt_lengths,
    max_new_tokens,
    cache_length,
    extra_slots=(num_draft_tokens if tree is None else tree.num_nodes) + 1,
    vocab_size=target.vocab_size,
  )
  if num_draft_tokens > max_new_tokens:
    warnings.warn(
      f"num_draft_tokens={num_draft_tokens} > max_new_tokens={max_new_tokens}: a row never "
      f"drafts more than max_new_tokens - 1 = {max_new_tokens - 1} tokens, so the rest of K only "
      "enlarges the buffers.",
      stacklevel=3,
    )
  batch_size = prompts.shape[0]
  shape = f"{batch_size} rows x {cache_length} cache slots with K={num_draft_tokens}"
  if check_memory:
    check_buffers_fit(target, drafter, batch_size, cache_length, num_draft_tokens, tree, shape)
  return prompts, prompt_lengths, cache_length, tree, shape


def check_buffers_fit(
  target: Any,
  drafter: drafters.Drafter,
  batch_size: int,
  cache_length: int,
  num_draft_tokens: int,
  tree: TreeShape | None,
  shape: str,
) -> None:
  """Refuses, before anything is allocated, a request whose caches and distributions cannot
  fit the devices' memory (``memory.check_fits``)."""
  num_nodes = num_draft_tokens if tree is None else tree.num_nodes
  memory.check_fits(
    {
      "target KV cache": memory.cache_bytes(target, batch_size, cache_length),
      "drafter state": drafter.state_bytes(batch_size, cache_length),
      # q of K draft tokens (N nodes) and p of K + 1 (N + 1), float32 over the vocabulary.
      "draft and target distributions": batch_size * (2 * num_nodes + 1) * target.vocab_size * 4,
    },
    shape,
  )


def speculative_generate(
  target: Any,
  draft: Any,
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
  eos_id: int | Sequence[int] | None = None,
  pad_id: int = 0,
  cache_length: int | None = None,
  check_nan: bool = True,
  synthetic_acceptance: float | None = None,
  tree: str | TreeShape | None = None,
  narrow_scoring: bool = False,
) -> SpeculativeOutput:
  """Samples from ``target`` with drafts from ``draft``; the output is distributed as target's.

  Args:
    target: a model following the decode protocol (``model_protocol``).
    draft: a ``drafters.Drafter`` (``ModelDrafter``, ``PromptLookupDrafter``,
      ``drafters.self_speculative(target, L)``), or a decode-protocol model sharing
      the target's vocabulary (wrapped in a ``ModelDrafter``).
    prompts: [B, T] int token ids, right-padded; row b valid up to prompt_lengths[b].
    prompt_lengths: [B] ints in [1, T].
    rng: a JAX random key; iteration i uses ``fold_in(rng, i)``.
    max_new_tokens: tokens generated per row at most.
    num_draft_tokens: K >= 1, the most draft tokens proposed per iteration.
    temperature, top_k, top_p: the warping both models sample with; 0 is greedy.
    verifier: 'token' (Chen et al.) or 'block' (Sun et al.); greedy ignores it.
      'synthetic' (benchmarks only, NOT exact): each draft token is accepted
      with probability ``synthetic_acceptance`` whatever the models say, so
      the loop's cost can be timed at a chosen acceptance rate.
    schedule: the draft length per row: 'fixed' (K) or 'heuristic' (HF's
      +2 / -1 rule within [1, K]); see the module docstring.
    eos_id: a row stops after emitting this id, or any of these ids (kept in its output).
    pad_id: fills each row after its last token.
    cache_length: KV cache slots per row; default T + max_new_tokens + K + 1.
    check_nan: raise ``FloatingPointError`` if either model produced NaN logits
      (one host check after the loop).
    synthetic_acceptance: in [0, 1], with verifier='synthetic' only. A traced
      value: sweeping it does not recompile.
    tree: propose a tree of draft tokens instead of one chain (``tree.py``): a
      ``TreeShape`` or its string, e.g. 'chains:2x4' (2 independent chains of 4,
      multi-draft) or 'tree:2,2,1,1' (branching per depth). num_draft_tokens must
      equal its depth. Verifiers: 'token' (recursive rejection sampling, SpecInfer) or
      'traversal' (Weng et al. 2025). Needs a target and drafter that take tree calls
      (``model_protocol``, parts (e) and (f)).
    narrow_scoring: chains only: score each iteration with the narrowest of 1..K + 1 tokens
      that holds every row's proposal (one compiled scoring call per width, only the chosen
      one runs), so an iteration whose drafter proposed fewer than K tokens (a prompt-lookup
      miss, a confidence stop, a short schedule) pays for a narrower call. Which width runs
      depends on the proposals only, so it is as exact as K + 1 always.

  Returns:
    A ``SpeculativeOutput`` with tokens and statistics (``.summary()``).
  """
  model_protocol.check_model(target, "target")
  drafter = drafters.as_drafter(draft)
  drafter.check(target)
  threefry.check_key(rng)
  sampling = SamplingConfig(temperature, top_k, top_p)
  eos_id, pad_id = check_token_ids(eos_id, pad_id, target.vocab_size)
  prompts, prompt_lengths, cache_length, tree, shape = check_request(
    target,
    drafter,
    prompts,
    prompt_lengths,
    max_new_tokens=max_new_tokens,
    num_draft_tokens=num_draft_tokens,
    verifier=verifier,
    schedule=schedule,
    cache_length=cache_length,
    synthetic_acceptance=synthetic_acceptance,
    tree=tree,
    narrow_scoring=narrow_scoring,
  )
  loop, target_dynamic, drafter_dynamic = SpeculativeLoop.for_models(
    target,
    drafter,
    max_new_tokens=max_new_tokens,
    num_draft_tokens=num_draft_tokens,
    sampling=sampling,
    verifier=verifier,
    schedule=schedule,
    eos_id=eos_id,
    pad_id=pad_id,
    cache_length=cache_length,
    tree=tree,
    narrow_scoring=narrow_scoring,
  )
  arguments = (prompts, prompt_lengths, rng, jnp.float32(synthetic_acceptance or 0.0))
  return run_loop(lambda: loop(target_dynamic, drafter_dynamic, *arguments), shape, check_nan)
