"""Logits -> sampling distribution: temperature, top-k, top-p (nucleus), greedy.

The warped distribution is what a model actually samples from; speculative
verification compares the *warped* target and draft distributions, so these
functions are the single definition of both.

Order (as in Hugging Face transformers): divide by the temperature, keep the
top_k largest logits, then keep the smallest prefix of the remaining tokens
(sorted by probability, ties broken by token id) whose mass reaches top_p.
Temperature 0 means greedy: a one-hot distribution on the argmax.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from specsamp.sampling import draws


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """How to turn logits into a distribution. Hashable: a static jit argument.

  Attributes:
    temperature: >= 0; 0 is greedy (argmax).
    top_k: keep the k most likely tokens; 0 keeps all.
    top_p: keep the smallest set of most likely tokens with mass >= top_p; in (0, 1].
  """

  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    if (
      not isinstance(self.temperature, (int, float))
      or not math.isfinite(self.temperature)
      or self.temperature < 0
    ):
      raise ValueError(
        f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}."
      )
    if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
      raise ValueError(f"top_k must be an int >= 0 (0 = no top-k), got {self.top_k!r}.")
    if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
      raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}.")

  @property
  def greedy(self) -> bool:
    return self.temperature == 0


def warp_logits(logits_BV: jax.Array, sampling: SamplingConfig) -> jax.Array:
  """Float32 logits of the warped distribution; excluded tokens are -inf.

  For greedy sampling only the argmax keeps a finite logit.
  """
  logits_BV = logits_BV.astype(jnp.float32)
  vocab = logits_BV.shape[-1]
  if sampling.greedy:
    best = jnp.argmax(logits_BV, axis=-1)
    return jnp.where(jax.nn.one_hot(best, vocab, dtype=bool), 0.0, -jnp.inf)
  logits_BV = logits_BV / sampling.temperature
  # Both cuts are threshold searches, not sorts (a sort, lax.top_k's too, costs 10x on a CPU).
  if 0 < sampling.top_k < vocab:
    logits_BV = jnp.where(top_k_mask(logits_BV, sampling.top_k), logits_BV, -jnp.inf)
  if sampling.top_p < 1.0:
    logits_BV = jnp.where(nucleus_mask(logits_BV, sampling.top_p), logits_BV, -jnp.inf)
  return logits_BV


def _ordered_bits(values: jax.Array) -> jax.Array:
  """uint32 keys ordered like the float32 ``values`` (-inf lowest; NaN is checked elsewhere)."""
  values = values.astype(jnp.float32)
  values = jnp.where(values == 0, 0.0, values)  # -0.0 ties with 0.0, as it compares.
  bits = jax.lax.bitcast_convert_type(values, jnp.int32)
  signed = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # Negative floats count down: flip them.
  return jax.lax.bitcast_convert_type(signed, jnp.uint32) ^ jnp.uint32(0x80000000)


def top_k_mask(logits_BV: jax.Array, top_k: int) -> jax.Array:
  """[..., V] bool: the ``top_k`` largest logits, ties broken by token id (as a stable sort
  would), found without sorting.

  The k-th largest value's key t* is the largest t with #(key >= t) >= k; it is built bit by
  bit from the top, 32 masked counts over the vocabulary. Tokens above t* are kept, and those
  tied at t* in token-id order until k are kept. On a CPU this is 12x faster than a sort for
  256 rows of 49,152 (0.23 s against 2.8 s; lax.top_k sorts too, 2.1 s).
  """
  keys = _ordered_bits(logits_BV)

  def grow(bit, threshold):
    candidate = threshold | (jnp.uint32(1) << (jnp.uint32(31) - bit.astype(jnp.uint32)))
    enough = jnp.sum(keys >= candidate[..., None], axis=-1) >= top_k
    return jnp.where(enough, candidate, threshold)

  start = jnp.zeros(keys.shape[:-1], jnp.uint32)
  threshold = jax.lax.fori_loop(0, 32, grow, start)[..., None]
  above, tied = keys > threshold, keys == threshold
  room = top_k - jnp.sum(above, axis=-1, keepdims=True)
  return above | (tied & (jnp.cumsum(tied, axis=-1) <= room))


def nucleus_mask(logits_BV: jax.Array, top_p: float) -> jax.Array:
  """[..., V] bool: the nucleus of softmax(logits), the smallest set of most likely tokens
  (ties broken by token id) whose mass reaches ``top_p``, found without sorting.

  Token i is kept iff the mass of the tokens ranked before it is below top_p. With
  m(t) = sum of the probabilities above t (a non-increasing step function), that is
  p_i >= t* for t* the smallest t with m(t) < top_p, ties at t* aside. A bisection over the
  bit patterns of float32 (ordered like the non-negative floats they encode) finds t* exactly
  in 31 masked sums over the vocabulary; the tokens tied at t* are then kept in token-id order
  while m(t*) + their mass before stays below top_p. On a CPU this costs 0.2 ms for 40 rows of
  1024 where sorting them cost 5.9 ms; accelerators sort slowly too.
  """
  probs = jax.nn.softmax(logits_BV.astype(jnp.float32), axis=-1)
  bits = jax.lax.bitcast_convert_type(probs, jnp.int32)  # Monotone in probs >= 0.

  def mass_above(threshold):
    return jnp.sum(jnp.where(bits > threshold[..., None], probs, 0.0), axis=-1)

  def halve(_, bounds):  # Invariant: m(lo) >= top_p > m(hi).
    lo, hi = bounds
    mid = lo + (hi - lo) // 2
    below = mass_above(mid) < top_p
    return jnp.where(below, lo, mid), jnp.where(below, mid, hi)

  lo = jnp.full(bits.shape[:-1], -1, jnp.int32)  # m(-1) = 1 >= top_p: every token is above.
  hi = jnp.full(bits.shape[:-1], 0x3F800000, jnp.int32)  # 1.0: no probability is above it.
  _, hi = jax.lax.fori_loop(0, 32, halve, (lo, hi))
  tied = bits == hi[..., None]
  tied_before = jnp.cumsum(tied, axis=-1) - tied  # Tokens tied at t* with a smaller id.
  before = mass_above(hi)[..., None] + tied_before * probs
  return (bits > hi[..., None]) | (tied & (before < top_p))


def probabilities(logits_BV: jax.Array, sampling: SamplingConfig) -> jax.Array:
  """The warped distribution as float32 probabilities."""
  return jax.nn.softmax(warp_logits(logits_BV, sampling), axis=-1)


def sample(key: jax.Array, logits_BV: jax.Array, sampling: SamplingConfig) -> jax.Array:
  """One token per row from the warped distribution (argmax when greedy), drawn from 64 random
  bits (``draws.categorical``), so even a token of probability 1e-12 keeps its rate."""
  if sampling.greedy:
    return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
  return draws.categorical(key, probabilities(logits_BV, sampling))
