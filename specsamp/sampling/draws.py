r"""Random draws at 64-bit resolution: every coin and every token specsamp samples.

Exact speculative sampling compares random draws with probabilities, and
float32 uniforms are too coarse for that: ``jax.random.uniform`` returns
multiples of 2^-23, so ``P(r < a) = ceil(a 2^23) / 2^23``, and an acceptance
probability of 1e-9 comes out 8,400 times too large. Gumbel-max sampling from
float32 uniforms likewise cannot draw a token of probability below about 1e-7
at its true rate. Everything here draws from 64 random bits instead:

  random_words(key, shape)          uint32 [2, *shape]: X = hi 2^32 + lo, uniform on
                                    0..2^64-1, one 64-bit integer per element.
  bernoulli(key, a)                 r < a with r = X / 2^64, compared in integers:
                                    P = floor(a 2^64) / 2^64, i.e. a - e, 0 <= e < 2^-64.
  exponential(key, shape)           E = -log U, U = (X + 1/2) / 2^64, precise in both tails:
                                    E from 2.7e-20 to 45.1 with float32 relative precision.
  categorical(key, probs)           argmin_x E_x / p(x) (the exponential race, which is
                                    Gumbel-max: argmax log p(x) - log E_x); P(x) = p(x) to
                                    float32 relative precision; p(x) = 0 is never drawn.
                                    Above 512 tokens the race runs over blocks of about
                                    sqrt(V) tokens, then the winning block's tokens: the same
                                    law from 2 sqrt(V) draws instead of V.

The resolution that remains (docs/how_it_works.md, "Exactness"): a coin is off
by less than 2^-64 = 5.4e-20 absolute; a categorical draw is off by a relative
error of order 2^-24 (6e-8) of each probability, from float32 rounding of
E_x / p(x), and tokens of probability below ~1e-19 are drawn too rarely. Both
are far below anything a sampler's user can measure (10^12 draws resolve a
probability to ~1e-6).

The ``*_from_words`` forms are pure functions of given bits, so each edge
(X = 0, X = 2^64-1, a just above or below a multiple of 2^-64) has a
deterministic test.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specsamp.sampling import threefry

_TWO_32 = 2.0**32


def random_words(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """Two uint32 words per element, [2, *shape]: the hi and lo halves of a uniform 64-bit X."""
  return threefry.bits(key, (2, *shape))


def bernoulli_from_words(words: jax.Array, probability: jax.Array) -> jax.Array:
  """True with probability ``probability`` (clipped to [0, 1]) to within 2^-64.

  r = X / 2^64 < a is decided in integers: a 2^32 and its fraction times 2^32 are exact
  in float32 (scaling by powers of two and taking the integer part never round), so
  A = floor(a 2^64) is exact and ``X < A`` holds for exactly A of the 2^64 values of X.
  a = 0 is never accepted, a = 1 always, and a NaN never (it was always accepted: clip keeps a
  NaN, and a NaN is not below one; the loops refuse NaN logits before any coin, but a caller
  of this function had no such guard; 2026-11-30).
  """
  a = jnp.asarray(probability, jnp.float32)
  a = jnp.clip(jnp.where(jnp.isnan(a), 0.0, a), 0.0, 1.0)
  hi, lo = words[0], words[1]
  scaled = a * _TWO_32  # < 2^32 for a < 1, exact.
  a_hi = jnp.floor(scaled)
  a_lo = jnp.floor((scaled - a_hi) * _TWO_32)
  # a < 1 keeps both parts below 2^32 (float32's largest below 2^32 is 2^32 - 256).
  below_one = a < 1.0
  a_hi = jnp.where(below_one, a_hi, 0.0).astype(jnp.uint32)
  a_lo = jnp.where(below_one, a_lo, 0.0).astype(jnp.uint32)
  return ~below_one | (hi < a_hi) | ((hi == a_hi) & (lo < a_lo))


def bernoulli(key: jax.Array, probability: jax.Array) -> jax.Array:
  """One coin per element of ``probability``: True with that probability (to 2^-64)."""
  probability = jnp.asarray(probability, jnp.float32)
  return bernoulli_from_words(random_words(key, probability.shape), probability)


def exponential_from_words(words: jax.Array) -> jax.Array:
  """E = -log U ~ Exp(1), U = (X + 1/2) / 2^64, float32, precise in both tails.

  For U < 1/2, E = -log U from U itself; for U >= 1/2, E = -log1p(-(1 - U)) with
  1 - U = (~X + 1/2) / 2^64 formed from the complemented bits, so a U next to 1 gives a
  small positive E, never 0 (a float32 U would round to 1 there and give E = 0: a token
  that wins whatever its probability).
  """
  hi, lo = words[0], words[1]
  upper = hi >= jnp.uint32(2**31)
  hi = jnp.where(upper, ~hi, hi)
  lo = jnp.where(upper, ~lo, lo)
  # min(U, 1 - U) in (0, 1/2], to float32 relative precision.
  small = hi.astype(jnp.float32) * 2.0**-32 + lo.astype(jnp.float32) * 2.0**-64 + 2.0**-65
  return jnp.where(upper, -jnp.log1p(-small), -jnp.log(small))


def exponential(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """Exp(1) draws of ``shape`` from 64 random bits each."""
  return exponential_from_words(random_words(key, shape))


def categorical_from_words(words: jax.Array, probs: jax.Array) -> jax.Array:
  """argmin_x E_x / p(x) over the last axis: token x with probability p(x) (rows need not sum
  to 1, they are read as proportions). Tokens with p(x) = 0 are never drawn."""
  exponentials = exponential_from_words(words)
  race = jnp.where(probs > 0, exponentials / jnp.where(probs > 0, probs, 1.0), jnp.inf)
  return jnp.argmin(race, axis=-1).astype(jnp.int32)


# Above this vocabulary the race runs in two stages (``categorical``); at or below, flat. The two
# stages take less time from V = 64 up (a CPU, one row, 200 draws inside one loop, 2026-11-28,
# scripts/benchmark_draws.py: 7.3 against 12.0 us at 128 tokens, 18.0 against 102.9 at 1,024,
# 42.4 against 497.3 at 8,192; at 8 rows 64.9 against 323.7 us at 1,024); the flat race stays
# at 512 tokens and below, where the test models' 264 tokens are.
FLAT_RACE_MAX = 512
MAX_BLOCK = 256  # The largest block (the previous fixed size; 49,152 tokens still race in 256).


def race_block(vocab: int) -> int:
  """Tokens per block of the two-stage race over ``vocab`` tokens: the smallest power of two
  whose square is at least ``vocab`` (V / b blocks and b tokens: about 2 sqrt(V) entrants),
  at most ``MAX_BLOCK``. 1,024 tokens race in 32 blocks of 32; 8,192 in 64 of 128; 49,152 in
  192 of 256."""
  block = 1
  while block * block < vocab and block < MAX_BLOCK:
    block *= 2
  return block


def block_masses(probs_BV: jax.Array, block: int) -> jax.Array:
  """[..., V / block] each block's total, summed pairwise (log2(block) levels, 8 for 256
  tokens: a relative error below 8 float32 roundings, 5e-7, whatever the backend's reduction
  order). ``block`` is a power of two and divides V."""
  blocks = probs_BV.reshape(*probs_BV.shape[:-1], -1, block)
  while blocks.shape[-1] > 1:
    blocks = blocks[..., 0::2] + blocks[..., 1::2]
  return blocks[..., 0]


def categorical(key: jax.Array, probs: jax.Array) -> jax.Array:
  """One index per row of ``probs`` [..., V], drawn in proportion to it.

  For V > ``FLAT_RACE_MAX`` the race runs in two stages, which is the same distribution:
  a block b of B = ``race_block(V)`` tokens wins the race among blocks with probability
  M_b / sum M (its mass M_b, ``block_masses``), then a token of that block wins a race among
  its B tokens with probability p(x) / M_b, so P(x) = p(x) / sum M. Each stage is an
  exponential race from 64 random bits per entrant, so a token keeps its rate to float32
  relative precision (the block sum adds at most 5e-7 relative), down to probabilities of
  1e-19 as the flat race. It draws V / B + B exponentials instead of V: for 1,024 tokens 64
  instead of 1,024 (5.7x less time on a CPU), for 49,152 tokens 448 instead of 49,152, which on
  a CPU is 2.6 ms per row less (22x), and more with every row of a batch.
  """
  probs = jnp.asarray(probs, jnp.float32)
  vocab = probs.shape[-1]
  if vocab <= FLAT_RACE_MAX:
    return categorical_from_words(random_words(key, probs.shape), probs)
  return two_stage_categorical(key, probs, race_block(vocab))


def two_stage_categorical(key: jax.Array, probs: jax.Array, size: int) -> jax.Array:
  """``categorical``'s two-stage race with blocks of ``size`` tokens (a power of two), at any
  vocabulary: the blocks by their masses, then the winning block's tokens."""
  probs = jnp.asarray(probs, jnp.float32)
  vocab = probs.shape[-1]
  num_blocks = -(-vocab // size)
  padded = jnp.pad(probs, [(0, 0)] * (probs.ndim - 1) + [(0, num_blocks * size - vocab)])
  masses = block_masses(padded, size)
  block_key, token_key = threefry.fold_in(key, 0), threefry.fold_in(key, 1)
  block = categorical_from_words(random_words(block_key, masses.shape), masses)
  members = padded.reshape(*probs.shape[:-1], num_blocks, size)
  chosen = jnp.take_along_axis(members, block[..., None, None], axis=-2)[..., 0, :]
  token = categorical_from_words(random_words(token_key, chosen.shape), chosen)
  return block * size + token
