r"""Speculative sampling (Chen et al. 2023) as ONE jitted ``lax.while_loop`` on device.

Per row b with ``n_b`` tokens so far (prompt + generated), both KV caches hold
positions 0..n_b-2: the last token, at n_b-1, is not yet fed. One iteration:

  1. Draft K tokens (lax.scan): the draft first takes the tokens at positions
     n_b-2 and n_b-1 in one call (re-feeding n_b-2 rewrites the same cache
     entry, and after a full accept it is the draft's own last token, which
     it has not seen), then each new draft token; x~_t ~ q_t, the warped
     draft distribution, which is kept for verification.
  2. Score: ONE target call on [x_{n_b-1}, x~_1..x~_K] at positions
     n_b-1..n_b-1+K gives p_1..p_{K+1}.
  3. Verify (``verification.py``: token-wise, block or greedy): n accepted
     draft tokens and one emitted token per row.
  4. Append x~_1..x~_n and the emitted token to each row (cut at EOS and at
     max_new_tokens), and roll both caches back to the row's new length - 1
     by resetting their ``lengths``: rejected entries are never read again.

Every row accepts its own count; rows stop independently; finished rows ride
along without advancing. Nothing returns to the host until the loop ends.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specsamp.sampling import model_protocol, verification
from specsamp.sampling.autoregressive import GenerationOutput, check_prompts, initial_tokens, \
    prefill
from specsamp.sampling.warping import SamplingParams, probabilities, sample


@struct.dataclass
class SpeculativeOutput(GenerationOutput):
  """Tokens and on-device statistics of a speculative run.

  Attributes (besides GenerationOutput's tokens, lengths, num_generated, and
  model_calls, which counts TARGET calls, prefill included):
    draft_calls: scalar, draft model calls (prefill included).
    iterations: [B] draft-score-verify iterations in which the row was active.
    accepted_histogram: [B, K+1] count of iterations that accepted 0..K drafts.
    accepted_at_position: [B, K] iterations in which draft token t was accepted.
    nan_logits: [B] bool, a model produced NaN logits for the row.
  """

  draft_calls: jax.Array
  iterations: jax.Array
  accepted_histogram: jax.Array
  accepted_at_position: jax.Array
  nan_logits: jax.Array

  @property
  def target_calls(self) -> jax.Array:
    return self.model_calls

  def summary(self) -> dict[str, Any]:
    """Host-side statistics over all rows."""
    return summarize([self])


def summarize(outputs: "list[SpeculativeOutput]") -> dict[str, Any]:
  """Statistics over all rows of one or more speculative runs (e.g. one per prompt batch)."""
  histogram = np.concatenate([np.asarray(o.accepted_histogram) for o in outputs]).sum(0)
  at_position = np.concatenate([np.asarray(o.accepted_at_position) for o in outputs]).sum(0)
  iterations = max(int(histogram.sum()), 1)
  reached = np.concatenate([[iterations], at_position[:-1]])
  num_draft = at_position.shape[0]
  accepted = float((histogram * np.arange(num_draft + 1)).sum())
  return {
      "num_draft_tokens": num_draft,
      "target_calls": int(sum(int(o.target_calls) for o in outputs)),
      "draft_calls": int(sum(int(o.draft_calls) for o in outputs)),
      "row_iterations": int(histogram.sum()),
      "accepted_histogram": histogram.tolist(),
      # P(draft token t accepted), t = 1..K, and P(accepted | t-1 accepted).
      "acceptance_at_position": (at_position / iterations).tolist(),
      "conditional_acceptance_at_position": (at_position / np.maximum(reached, 1)).tolist(),
      # Fraction of draft tokens accepted, and mean tokens per target call (bonus included).
      "acceptance_rate": accepted / (iterations * num_draft),
      # alpha: P(a draft token is accepted | it was verified), pooled over positions; the
      # i.i.d. acceptance of Leviathan et al. that predicts tokens per call.
      "alpha": float(at_position.sum() / max(reached.sum(), 1)),
      "tokens_per_target_call": accepted / iterations + 1.0,
      "generated_per_row": np.concatenate([np.asarray(o.num_generated) for o in outputs]).tolist(),
  }


@struct.dataclass
class _LoopState:
  step: jax.Array
  tokens: jax.Array
  lengths: jax.Array
  done: jax.Array
  target_cache: Any
  draft_cache: Any
  iterations: jax.Array
  histogram: jax.Array
  at_position: jax.Array
  nan_logits: jax.Array


def _has_nan(logits: jax.Array) -> jax.Array:
  return jnp.any(jnp.isnan(logits), axis=tuple(range(1, logits.ndim)))


def _draft(draft, cache, tokens_BW, lengths_B, key, num_draft: int, params: SamplingParams):
  """K draft tokens and their warped distributions q_1..q_K (lax.scan over K-1 steps)."""
  rows_B = jnp.arange(tokens_BW.shape[0])
  positions_B2 = jnp.stack([jnp.maximum(lengths_B - 2, 0), lengths_B - 1], axis=1)
  logits_B2V, cache = draft(tokens_BW[rows_B[:, None], positions_B2], positions_B2, cache)
  first_logits = logits_B2V[:, -1]

  def step(carry, t):
    cache, logits_BV = carry
    token_B = sample(jax.random.fold_in(key, t), logits_BV, params)
    logits_B1V, cache = draft(token_B[:, None], (lengths_B + t)[:, None], cache)
    return (cache, logits_B1V[:, 0]), (token_B, logits_BV)

  (cache, last_logits), (tokens_GB, logits_GBV) = jax.lax.scan(
      step, (cache, first_logits), jnp.arange(num_draft - 1))
  last_token = sample(jax.random.fold_in(key, num_draft - 1), last_logits, params)
  tokens_BG = jnp.concatenate([tokens_GB.T, last_token[:, None]], axis=1)
  logits_BGV = jnp.concatenate([jnp.swapaxes(logits_GBV, 0, 1), last_logits[:, None]], axis=1)
  return tokens_BG, logits_BGV, cache


@functools.partial(jax.jit, static_argnames=(
    "target_static", "draft_static", "max_new_tokens", "num_draft", "params", "verifier",
    "eos_id", "pad_id", "cache_length"))
def _speculative(target_static, target_dynamic, draft_static, draft_dynamic, prompts_BL,
                 prompt_lengths_B, rng, synthetic_acceptance, *, max_new_tokens: int,
                 num_draft: int,
                 params: SamplingParams, verifier: str, eos_id: int | None, pad_id: int,
                 cache_length: int) -> SpeculativeOutput:
  batch, length = prompts_BL.shape
  rows_B = jnp.arange(batch)
  offsets_G1 = jnp.arange(num_draft + 1)
  target = model_protocol.merge_model(target_static, target_dynamic)
  draft = model_protocol.merge_model(draft_static, draft_dynamic)
  with jax.named_scope("prefill"):
    # Both caches take the prompt; the last prompt token is fed by the first iteration.
    target_logits, target_cache = prefill(target, prompts_BL, prompt_lengths_B,
                                          target.init_cache(batch, cache_length))
    draft_logits, draft_cache = prefill(draft, prompts_BL, prompt_lengths_B,
                                        draft.init_cache(batch, cache_length))
  state = _LoopState(
      step=jnp.int32(0),
      tokens=initial_tokens(prompts_BL, prompt_lengths_B, length + max_new_tokens + num_draft + 1,
                            pad_id),
      lengths=prompt_lengths_B, done=jnp.zeros((batch,), bool),
      target_cache=target_cache.replace(lengths=prompt_lengths_B - 1),
      draft_cache=draft_cache.replace(lengths=prompt_lengths_B - 1),
      iterations=jnp.zeros((batch,), jnp.int32),
      histogram=jnp.zeros((batch, num_draft + 1), jnp.int32),
      at_position=jnp.zeros((batch, num_draft), jnp.int32),
      nan_logits=_has_nan(target_logits) | _has_nan(draft_logits))

  def cond(state: _LoopState) -> jax.Array:
    return ~jnp.all(state.done)

  def body(state: _LoopState) -> _LoopState:
    target = model_protocol.merge_model(target_static, target_dynamic)
    draft = model_protocol.merge_model(draft_static, draft_dynamic)
    key = jax.random.fold_in(rng, state.step)
    lengths_B = state.lengths
    with jax.named_scope("draft"):
      draft_tokens_BG, draft_logits_BGV, draft_cache = _draft(
          draft, state.draft_cache, state.tokens, lengths_B, jax.random.fold_in(key, 0),
          num_draft, params)
    with jax.named_scope("score"):
      last_B = state.tokens[rows_B, lengths_B - 1]
      target_logits_BG1V, target_cache = target(
          jnp.concatenate([last_B[:, None], draft_tokens_BG], axis=1),
          lengths_B[:, None] - 1 + offsets_G1, state.target_cache)
    with jax.named_scope("verify"):
      verify_key = jax.random.fold_in(key, 1)
      if verifier == "synthetic":  # Benchmarks: acceptance with a fixed rate, not exact.
        verdict = verification.synthetic_verify(
            verify_key, draft_tokens_BG, probabilities(draft_logits_BGV, params),
            probabilities(target_logits_BG1V, params), synthetic_acceptance)
      elif params.greedy:
        verdict = verification.greedy_verify(draft_tokens_BG, target_logits_BG1V)
      else:
        verdict = verification.VERIFIERS[verifier](
            verify_key, draft_tokens_BG, probabilities(draft_logits_BGV, params),
            probabilities(target_logits_BG1V, params))
    with jax.named_scope("append"):
      accepted_B = verdict.num_accepted
      emitted_BG1 = jnp.where(offsets_G1 < accepted_B[:, None],
                              jnp.concatenate([draft_tokens_BG, draft_tokens_BG[:, :1]], axis=1),
                              verdict.next_token[:, None])
      count_B = jnp.minimum(accepted_B + 1, max_new_tokens - (lengths_B - prompt_lengths_B))
      if eos_id is not None:
        is_eos_BG1 = (emitted_BG1 == eos_id) & (offsets_G1 < count_B[:, None])
        first_eos_B = jnp.argmax(is_eos_BG1, axis=1)
        count_B = jnp.where(jnp.any(is_eos_BG1, axis=1), first_eos_B + 1, count_B)
      active_B = ~state.done
      count_B = jnp.where(active_B, count_B, 0)
      keep_BG1 = offsets_G1 < count_B[:, None]
      # Every slot at or past a row's length holds pad_id, so the tail is written as pad.
      tokens_BW = state.tokens.at[rows_B[:, None], lengths_B[:, None] + offsets_G1].set(
          jnp.where(keep_BG1, emitted_BG1, pad_id))
      new_lengths_B = lengths_B + count_B
      done_B = state.done | (new_lengths_B - prompt_lengths_B >= max_new_tokens)
      if eos_id is not None:
        done_B = done_B | jnp.any(keep_BG1 & (emitted_BG1 == eos_id), axis=1)
    active_i32 = active_B.astype(jnp.int32)
    return _LoopState(
        step=state.step + 1, tokens=tokens_BW, lengths=new_lengths_B, done=done_B,
        target_cache=target_cache.replace(lengths=new_lengths_B - 1),
        draft_cache=draft_cache.replace(lengths=new_lengths_B - 1),
        iterations=state.iterations + active_i32,
        histogram=state.histogram + active_i32[:, None] * jax.nn.one_hot(
            accepted_B, num_draft + 1, dtype=jnp.int32),
        at_position=state.at_position + active_i32[:, None] * (
            offsets_G1[None, :-1] < accepted_B[:, None]),
        nan_logits=state.nan_logits | (active_B & (_has_nan(target_logits_BG1V)
                                                   | _has_nan(draft_logits_BGV))))

  state = jax.lax.while_loop(cond, body, state)
  width = length + max_new_tokens
  return SpeculativeOutput(
      tokens=state.tokens[:, :width], lengths=state.lengths,
      num_generated=state.lengths - prompt_lengths_B, model_calls=state.step + 1,
      draft_calls=1 + state.step * num_draft, iterations=state.iterations,
      accepted_histogram=state.histogram, accepted_at_position=state.at_position,
      nan_logits=state.nan_logits)


def speculative_generate(target: Any, draft: Any, prompts: Any, prompt_lengths: Any,
                         rng: jax.Array, *, max_new_tokens: int, num_draft_tokens: int,
                         temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                         verifier: str = "token", eos_id: int | None = None, pad_id: int = 0,
                         cache_length: int | None = None, check_nan: bool = True,
                         synthetic_acceptance: float | None = None) -> SpeculativeOutput:
  """Samples from ``target`` with drafts from ``draft``; the output is distributed as target's.

  Args:
    target, draft: models following the decode protocol (``model_protocol``),
      sharing one vocabulary.
    prompts: [B, L] int token ids, right-padded; row b valid up to prompt_lengths[b].
    prompt_lengths: [B] ints in [1, L].
    rng: a JAX random key; iteration i uses ``fold_in(rng, i)``.
    max_new_tokens: tokens generated per row at most.
    num_draft_tokens: K >= 1, draft tokens proposed per iteration.
    temperature, top_k, top_p: the warping both models sample with; 0 is greedy.
    verifier: 'token' (Chen et al.) or 'block' (Sun et al.); greedy ignores it.
      'synthetic' (benchmarks only, NOT exact): each draft token is accepted
      with probability ``synthetic_acceptance`` whatever the models say, so
      the loop's cost can be timed at a chosen acceptance rate.
    eos_id: a row stops after emitting this id (kept in its output).
    pad_id: fills each row after its last token.
    cache_length: KV cache slots per row; default L + max_new_tokens + K + 1.
    check_nan: raise ``FloatingPointError`` if either model produced NaN logits
      (one host check after the loop).
    synthetic_acceptance: in [0, 1], with verifier='synthetic' only. A traced
      value: sweeping it does not recompile.

  Returns:
    A ``SpeculativeOutput`` with tokens and statistics (``.summary()``).
  """
  model_protocol.check_model(target, "target")
  model_protocol.check_model(draft, "draft")
  if target.vocab_size != draft.vocab_size:
    raise ValueError(f"The draft's vocabulary ({draft.vocab_size}) differs from the target's "
                     f"({target.vocab_size}); speculative sampling needs one shared vocabulary.")
  if isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, (int, np.integer)) \
      or num_draft_tokens < 1:
    raise ValueError(f"num_draft_tokens (K) must be an int >= 1, got {num_draft_tokens!r}.")
  if verifier not in (*verification.VERIFIERS, "synthetic"):
    raise ValueError(f"verifier must be one of {sorted(verification.VERIFIERS)} or 'synthetic', "
                     f"got {verifier!r}.")
  if (verifier == "synthetic") != (synthetic_acceptance is not None):
    raise ValueError("synthetic_acceptance is set with verifier='synthetic', and only then "
                     f"(got verifier={verifier!r}, synthetic_acceptance={synthetic_acceptance!r}).")
  if synthetic_acceptance is not None and not 0.0 <= synthetic_acceptance <= 1.0:
    raise ValueError(f"synthetic_acceptance must be in [0, 1], got {synthetic_acceptance!r}.")
  params = SamplingParams(temperature, top_k, top_p)
  prompts, prompt_lengths, cache_length = check_prompts(
      prompts, prompt_lengths, max_new_tokens, cache_length, extra_slots=num_draft_tokens + 1)
  target_static, target_dynamic = model_protocol.split_model(target)
  draft_static, draft_dynamic = model_protocol.split_model(draft)
  out = _speculative(target_static, target_dynamic, draft_static, draft_dynamic, prompts,
                     prompt_lengths, rng, jnp.float32(synthetic_acceptance or 0.0),
                     max_new_tokens=int(max_new_tokens),
                     num_draft=int(num_draft_tokens), params=params, verifier=verifier,
                     eos_id=None if eos_id is None else int(eos_id), pad_id=int(pad_id),
                     cache_length=cache_length)
  if check_nan and bool(jnp.any(out.nan_logits)):
    rows = np.flatnonzero(np.asarray(out.nan_logits)).tolist()
    raise FloatingPointError(
        f"NaN logits from the target or draft model in rows {rows}: check the weights and "
        "inputs (e.g. a bad checkpoint, or float16 overflow).")
  return out
