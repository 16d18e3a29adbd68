r"""Verification of a draft block: pure functions on probabilities.

Notation (Chen et al. 2023, Algorithm 2). The draft model proposed
x~_1..x~_K, each x~_t sampled from q_t = q(. | x, x~_<t); the target scored
all K+1 positions in one call, giving p_t = p(. | x, x~_<t), t = 1..K+1.
Both p and q are the WARPED distributions (temperature / top-k / top-p) that
target and draft actually sample from. Arrays are 0-based: ``q_BGV[:, t-1]``
is q_t and ``p_BGV1[:, t-1]`` is p_t (G = K draft tokens, G+1 target rows).

Token-wise (Chen et al. Algorithm 2):
  for t = 1..K:
    r ~ U[0, 1)
    if r < min(1, p_t(x~_t) / q_t(x~_t)): accept x~_t          (strict: a = 0 never accepts)
    else: emit x ~ norm(max(0, p_t - q_t)) and stop
  if all K accepted: emit x ~ p_{K+1}                          (the bonus token)

Block verification (Sun et al. 2024, arXiv 2403.10444, Algorithm 2) accepts
the longest prefix the joint coupling allows, never fewer tokens in
expectation than token-wise, and is exact too:
  w_0 = 1;  w_i = min(1, w_{i-1} p_i(x~_i) / q_i(x~_i))         i = 1..K
  h_i = m_i / (m_i + 1 - w_i),  m_i = sum_x max(0, w_i p_{i+1}(x) - q_{i+1}(x))   i < K
  h_K = w_K
  eta_i ~ U[0, 1);  tau = max{i : eta_i < h_i}  (0 if none; strict, so h_i = 0 never stops at i)
  accept x~_1..x~_tau; emit x ~ norm(max(0, w_tau p_{tau+1} - q_{tau+1}))  (q_{K+1} := 0)

Greedy (temperature 0): accept while x~_t == argmax p_t; emit argmax p_{n+1}.
This is token-wise verification with one-hot p and q, and reproduces
autoregressive greedy decoding token for token.

Synthetic acceptance (for benchmarks only, NOT exact; vLLM's synthetic
sampler does the same): accept each x~_t independently with a fixed
probability a, n = the leading run of accepts, then emit from the residual at
n+1 as token-wise does. The iteration does the same work as a real one, and
n follows the i.i.d. law of Leviathan et al. exactly, so the loop's systems
cost can be measured apart from the draft's quality.

Shorter proposals (adaptive draft length, a lookup that found fewer tokens):
with ``num_proposed`` = k < K for a row, only x~_1..x~_k are verified. This is
the same algorithm on a block of length k, in static shapes: q_t := 0 for
t > k, so the residual after x~_k is p_{k+1} (the bonus token), and nothing
beyond k can be accepted (token-wise: forced rejection; block: h_i := 0 for
i > k, and h_k = w_k follows from q_{k+1} = 0).

Random draws (``draws.py``): every coin r < a compares 64 random bits with
a 2^64 in integers, so P(accept) = a to within 2^-64 (float32 uniforms would
round every a up to a multiple of 2^-23), and every token is drawn by an
exponential race from 64-bit draws, so tokens keep their probability down to
~1e-19 (and p(x) = 0 is never drawn).

One-hot q without the one-hot (``q_BGV = None``): a CHOSEN token (greedy proposals, prompt
lookup) was drawn from the point mass at it (``proposals.py``), so q_t(x~_t) = 1 and
max(0, w p_t - q_t) is w p_t with w p_t(x~_t) - 1 (<= 0, so 0) at the token. Every verifier
reads q only through these two (``q_at``, ``excess``), so ``None`` gives the verdicts an
explicit one-hot q gives, bit for bit, without a [B, K, V] array of zeros and ones.

Numerics: q(x) = 0 never divides (the ratio is taken as 1 where p > 0, 0
where p = 0); a residual with no mass (p == q) falls back to p; h_i
with m_i = 0 is 0.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import struct

from specsamp.sampling import draws, threefry


@struct.dataclass
class Verdict:
  """The outcome of verifying one draft block per row.

  Attributes:
    num_accepted: [B] int32, n in 0..K: draft tokens accepted.
    next_token: [B] int32, the token emitted after them (resampled or bonus).
  """

  num_accepted: jax.Array
  next_token: jax.Array


def _gather(probs_BGV: jax.Array, tokens_BG: jax.Array) -> jax.Array:
  return jnp.take_along_axis(probs_BGV, tokens_BG[..., None], axis=-1)[..., 0]


def _at(x_BG, index_B):
  return jnp.take_along_axis(x_BG, index_B[:, None], axis=1)[:, 0]


def q_at(q_BV: jax.Array | None, token_B: jax.Array, on_B: jax.Array | None = None) -> jax.Array:
  """q(x~) at each row's token, [...]; q = None is the point mass at the token (1 where
  ``on_B``, default everywhere, and 0 elsewhere: a position past the proposal)."""
  if q_BV is None:
    on_B = jnp.ones(token_B.shape, bool) if on_B is None else on_B
    return on_B.astype(jnp.float32)
  return jnp.take_along_axis(q_BV, token_B[..., None], axis=-1)[..., 0]


def excess(
  mass_BV: jax.Array,
  q_BV: jax.Array | None,
  token_B: jax.Array | None = None,
  on_B: jax.Array | None = None,
) -> jax.Array:
  """max(0, mass - q) over the last axis; q = None is the point mass at ``token_B`` where
  ``on_B`` (default everywhere) and 0 elsewhere (module docstring)."""
  if q_BV is not None:
    return jnp.maximum(mass_BV - q_BV, 0.0)
  at_BV = jnp.arange(mass_BV.shape[-1]) == token_B[..., None]
  if on_B is not None:
    at_BV &= on_B[..., None]
  return jnp.maximum(mass_BV - at_BV.astype(mass_BV.dtype), 0.0)


def residual(
  p_BV: jax.Array,
  q_BV: jax.Array | None,
  weight_B: jax.Array | float = 1.0,
  token_B: jax.Array | None = None,
  on_B: jax.Array | None = None,
) -> jax.Array:
  """norm(max(0, w p - q)); rows with no residual mass fall back to p. q = None: the point
  mass at ``token_B`` where ``on_B`` (``excess``)."""
  weight_B = jnp.broadcast_to(jnp.asarray(weight_B, p_BV.dtype), p_BV.shape[:1])
  mass_BV = excess(weight_B[:, None] * p_BV, q_BV, token_B, on_B)
  total_B = jnp.sum(mass_BV, axis=-1, keepdims=True)
  return jnp.where(total_B > 0, mass_BV / jnp.where(total_B > 0, total_B, 1.0), p_BV)


def expected_acceptance(p_V: jax.Array, q_V: jax.Array) -> jax.Array:
  """alpha = sum_x min(p(x), q(x)): the probability a token drawn from q is accepted under p
  (over the last axis)."""
  return jnp.minimum(p_V, q_V).sum(-1)


def sample_from(key: jax.Array, probs_BV: jax.Array) -> jax.Array:
  """One token per row from explicit probabilities (zeros are never drawn; 64-bit draws)."""
  return draws.categorical(key, probs_BV)


def _clipped_ratio(numerator: jax.Array, q: jax.Array) -> jax.Array:
  """min(1, numerator / q), with q = 0 read as 1 where numerator > 0 and 0 where it is 0."""
  safe_q = jnp.where(q > 0, q, 1.0)
  return jnp.minimum(jnp.where(q > 0, numerator / safe_q, jnp.where(numerator > 0, 1.0, 0.0)), 1.0)


def _proposed(proposed_BG: jax.Array | None, tokens_BG: jax.Array) -> jax.Array:
  """The [B, G] proposed mask, every position where None."""
  if proposed_BG is None:
    return jnp.ones(tokens_BG.shape, bool)
  return jnp.broadcast_to(proposed_BG, tokens_BG.shape)


def _leading_count(flags_BG: jax.Array) -> jax.Array:
  """How many leading entries of each row are True."""
  return jnp.sum(jnp.cumprod(flags_BG, axis=1), axis=1).astype(jnp.int32)


def mask_unproposed(
  q_BGV: jax.Array | None, num_proposed_B: jax.Array | None, num_draft_tokens: int
) -> tuple[jax.Array | None, jax.Array]:
  """(q with rows zeroed past each row's proposal, the [B, G] proposed mask). q = None stays
  None: ``q_at`` and ``excess`` read the mask instead."""
  if num_proposed_B is None:
    proposed_BG = jnp.ones((1, num_draft_tokens), bool)
  else:
    proposed_BG = jnp.arange(num_draft_tokens)[None, :] < num_proposed_B[:, None]
  if q_BGV is None:
    return None, proposed_BG
  return jnp.where(proposed_BG[..., None], q_BGV, 0.0), proposed_BG


def _emit(
  key: jax.Array, num_accepted_B, p_BG1V, q_BGV, draft_tokens_BG, proposed_BG, weight_B=1.0
) -> Verdict:
  """The token after n = ``num_accepted_B`` accepted ones: from norm(max(0, w p_{n+1} -
  q_{n+1})), with q_{K+1} := 0, so that after all K the bonus comes from p_{K+1}."""
  batch, num_draft = draft_tokens_BG.shape
  index_B = num_accepted_B.astype(jnp.int32)
  p_BV = jnp.take_along_axis(p_BG1V, index_B[:, None, None], axis=1)[:, 0]
  inside_B = index_B < num_draft
  at_B = jnp.minimum(index_B, num_draft - 1)
  on_B = inside_B & _at(jnp.broadcast_to(proposed_BG, (batch, num_draft)), at_B)
  if q_BGV is None:
    mass_BV = residual(p_BV, None, weight_B, _at(draft_tokens_BG, at_B), on_B)
  else:
    q_BV = jnp.take_along_axis(q_BGV, at_B[:, None, None], axis=1)[:, 0]
    q_BV = jnp.where(inside_B[:, None], q_BV, 0.0)
    mass_BV = residual(p_BV, q_BV, weight_B)
  return Verdict(num_accepted=index_B, next_token=sample_from(key, mass_BV))


def acceptance_probabilities(
  draft_tokens_BG: jax.Array, q_BGV: jax.Array | None, p_BG1V: jax.Array
) -> jax.Array:
  """min(1, p_t(x~_t) / q_t(x~_t)) per draft position (1 where q = 0 < p; p where q = None,
  the point mass at the token)."""
  return _clipped_ratio(_gather(p_BG1V[:, :-1], draft_tokens_BG), q_at(q_BGV, draft_tokens_BG))


def token_verify(
  key: jax.Array,
  draft_tokens_BG: jax.Array,
  q_BGV: jax.Array | None,
  p_BG1V: jax.Array,
  num_proposed_B: jax.Array | None = None,
) -> Verdict:
  """Chen et al. Algorithm 2: accept each x~_t w.p. min(1, p/q), resample at the first rejection.
  ``num_proposed_B``: verify only each row's first k tokens (default all K)."""
  q_BGV, proposed_BG = mask_unproposed(q_BGV, num_proposed_B, draft_tokens_BG.shape[1])
  accept_key, emit_key = threefry.split(key)
  accepted_BG = (
    draws.bernoulli(accept_key, acceptance_probabilities(draft_tokens_BG, q_BGV, p_BG1V))
    & proposed_BG
  )
  count_B = _leading_count(accepted_BG)
  return _emit(emit_key, count_B, p_BG1V, q_BGV, draft_tokens_BG, proposed_BG)


def block_weights(
  draft_tokens_BG: jax.Array,
  q_BGV: jax.Array | None,
  p_BG1V: jax.Array,
  proposed_BG: jax.Array | None = None,
) -> jax.Array:
  """w_0..w_K of block verification, [B, K+1]: w_i = min(1, w_{i-1} p_i(x~_i) / q_i(x~_i))
  (q = None: the point mass at x~_i where ``proposed_BG``, default everywhere)."""
  p_x = _gather(p_BG1V[:, :-1], draft_tokens_BG)
  q_x = q_at(q_BGV, draft_tokens_BG, _proposed(proposed_BG, draft_tokens_BG))
  weights = [jnp.ones(draft_tokens_BG.shape[:1], p_BG1V.dtype)]
  for t in range(draft_tokens_BG.shape[1]):
    weights.append(_clipped_ratio(weights[-1] * p_x[:, t], q_x[:, t]))
  return jnp.stack(weights, axis=1)


def block_stop_probabilities(
  weights_BG1: jax.Array,
  q_BGV: jax.Array | None,
  p_BG1V: jax.Array,
  draft_tokens_BG: jax.Array | None = None,
  proposed_BG: jax.Array | None = None,
) -> jax.Array:
  """h_1..h_K of block verification, [B, K] (q = None: the point mass at each draft token,
  ``draft_tokens_BG``, where ``proposed_BG``)."""
  w_BG = weights_BG1[:, 1:]
  # m_i uses the distributions at position i+1 (after x~_i), i = 1..K-1.
  wp_BGV = w_BG[:, :-1, None] * p_BG1V[:, 1:-1]
  if q_BGV is None:
    on_BG = _proposed(proposed_BG, draft_tokens_BG)[:, 1:]
    m_BG = jnp.sum(excess(wp_BGV, None, draft_tokens_BG[:, 1:], on_BG), axis=-1)
  else:
    m_BG = jnp.sum(excess(wp_BGV, q_BGV[:, 1:]), axis=-1)
  denominator = m_BG + 1.0 - w_BG[:, :-1]
  h_inner = jnp.where(m_BG > 0, m_BG / jnp.where(denominator > 0, denominator, 1.0), 0.0)
  return jnp.concatenate([h_inner, w_BG[:, -1:]], axis=1)


def block_verify(
  key: jax.Array,
  draft_tokens_BG: jax.Array,
  q_BGV: jax.Array | None,
  p_BG1V: jax.Array,
  num_proposed_B: jax.Array | None = None,
) -> Verdict:
  """Sun et al. 2024 block verification: tau = max{i : eta_i < h_i}, residual weighted by w_tau.
  ``num_proposed_B``: verify only each row's first k tokens (default all K)."""
  q_BGV, proposed_BG = mask_unproposed(q_BGV, num_proposed_B, draft_tokens_BG.shape[1])
  stop_key, emit_key = threefry.split(key)
  weights_BG1 = block_weights(draft_tokens_BG, q_BGV, p_BG1V, proposed_BG)
  h_BG = block_stop_probabilities(weights_BG1, q_BGV, p_BG1V, draft_tokens_BG, proposed_BG)
  h_BG = jnp.where(proposed_BG, h_BG, 0.0)
  lengths_G = jnp.arange(1, h_BG.shape[1] + 1)
  # eta_i < h_i, strictly: a stop probability of 0 (a token outside p's support, a position
  # past the proposal) is never taken, whatever eta is drawn.
  stop_BG = draws.bernoulli(stop_key, h_BG)
  tau_B = jnp.max(jnp.where(stop_BG, lengths_G, 0), axis=1)
  return _emit(
    emit_key, tau_B, p_BG1V, q_BGV, draft_tokens_BG, proposed_BG, _at(weights_BG1, tau_B)
  )


def greedy_verify(
  key: jax.Array,
  draft_tokens_BG: jax.Array,
  q_BGV: jax.Array | None,
  p_BG1V: jax.Array,
  num_proposed_B: jax.Array | None = None,
) -> Verdict:
  """Accept while the draft token is the target's argmax; emit the argmax after them.

  Under greedy sampling p is one-hot on the target's argmax (``warping``), so argmax p is
  argmax of the logits; key and q are not needed.
  """
  del key, q_BGV
  best_BG1 = jnp.argmax(p_BG1V, axis=-1).astype(jnp.int32)
  matches_BG = draft_tokens_BG == best_BG1[:, :-1]
  if num_proposed_B is not None:
    matches_BG &= jnp.arange(matches_BG.shape[1])[None, :] < num_proposed_B[:, None]
  num_accepted_B = _leading_count(matches_BG)
  return Verdict(num_accepted=num_accepted_B, next_token=_at(best_BG1, num_accepted_B))


def synthetic_verify(
  key: jax.Array,
  draft_tokens_BG: jax.Array,
  q_BGV: jax.Array | None,
  p_BG1V: jax.Array,
  num_proposed_B: jax.Array | None = None,
  *,
  acceptance: jax.Array | float,
) -> Verdict:
  """Accepts each draft token with probability ``acceptance`` regardless of p and q; emits from
  the residual at the first rejection (the bonus token after a full accept). Benchmarks only:
  the output is NOT distributed as the target's."""
  q_BGV, proposed_BG = mask_unproposed(q_BGV, num_proposed_B, draft_tokens_BG.shape[1])
  accept_key, emit_key = threefry.split(key)
  accepted_BG = draws.bernoulli(
    accept_key, jnp.broadcast_to(jnp.asarray(acceptance, jnp.float32), draft_tokens_BG.shape)
  )
  count_B = _leading_count(accepted_BG & proposed_BG)
  return _emit(emit_key, count_B, p_BG1V, q_BGV, draft_tokens_BG, proposed_BG)


Verifier = Callable[[jax.Array, jax.Array, jax.Array | None, jax.Array, jax.Array | None], Verdict]
"""Every verifier: (key, draft_tokens_BG, q_BGV, p_BG1V, num_proposed_B) -> Verdict; q_BGV =
None is the one-hot q of chosen tokens."""

VERIFIERS: dict[str, Verifier] = {
  "token": token_verify,
  "block": block_verify,
  "argmax": greedy_verify,
}
"""The exact verifiers by name; 'greedy' is what any of them amounts to at temperature 0."""


def synthetic_verifier(acceptance: jax.Array | float) -> Verifier:
  """The synthetic (benchmark-only, NOT exact) verifier at a fixed acceptance rate."""
  return functools.partial(synthetic_verify, acceptance=acceptance)
