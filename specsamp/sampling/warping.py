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
import numpy as np

from specsamp.sampling import draws

MIN_TEMPERATURE = float(jnp.finfo(jnp.float32).tiny)
"""The smallest temperature above 0 (greedy): below the smallest normal float32 a device's
arithmetic flushes it to 0, and the division by it gives NaN."""


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """How to turn logits into a distribution. Hashable: a static jit argument.

  Attributes:
    temperature: 0 (greedy: argmax) or >= ``MIN_TEMPERATURE``.
    top_k: keep the k most likely tokens; 0 keeps all.
    top_p: keep the smallest set of most likely tokens with mass >= top_p; in (0, 1].
  """

  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    # NumPy scalars (a sweep over np.linspace) as the Python numbers they hold: the config is
    # a static jit argument, hashed and compared by value.
    for name, kind, python in (
      ("temperature", (np.floating, np.integer), float),
      ("top_k", np.integer, int),
      ("top_p", (np.floating, np.integer), float),
    ):
      if isinstance(getattr(self, name), kind):
        object.__setattr__(self, name, python(getattr(self, name)))
    if (
      not isinstance(self.temperature, (int, float))
      or not math.isfinite(self.temperature)
      or self.temperature < 0
    ):
      raise ValueError(
        f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}."
      )
    if 0 < self.temperature < MIN_TEMPERATURE:
      raise ValueError(
        f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:.4g}, the smallest normal "
        f"float32 (a device flushes a smaller one to 0), got {self.temperature!r}."
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
  # The row's largest logit is 0 before the division. Compiled, a softmax of x / T fuses the
  # division into its exp(x / T - max) as one fused multiply-add, whose exact product against
  # the rounded max leaves the largest entry up to half an ulp of max / T: at T = 1e-9 and
  # logits near 10, exp(512) overflows and every probability was NaN (token 0 drawn each
  # step). Shifted first, the largest is exactly 0 at any T, and the rest keep their order
  # (logits closer than float32 resolves at their distance from the max may tie, and a tie is
  # broken by token id: one function warps the target's and the draft's, so exactness holds).
  logits_BV = (logits_BV - jnp.max(logits_BV, axis=-1, keepdims=True)) / sampling.temperature
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


def _with_ties_cut(keys: jax.Array, threshold: jax.Array, whole: jax.Array, cut) -> jax.Array:
  """[..., V] bool: the tokens above ``threshold`` and those tied at it, in token-id order as
  ``cut()`` keeps them. ``whole`` [...] says every tied token is kept (the usual case: one
  token sits at the threshold). On a CPU, where the running count over the vocabulary that
  ``cut`` needs costs more than everything else here (4.2 ms for 5 rows of 49,152, where a
  masked sum costs 0.19 ms), it runs only when a row needs it; elsewhere it always runs (a
  ``lax.cond`` may cost a GPU a round trip to the host)."""

  def on_cpu():
    kept = keys >= threshold[..., None]
    return jax.lax.cond(
      jnp.all(whole), lambda: kept, lambda: jnp.where(whole[..., None], kept, cut())
    )

  return jax.lax.platform_dependent(cpu=on_cpu, default=cut)


def _kth_largest(keys: jax.Array, k: int) -> jax.Array:
  """[...] uint32: the k-th largest of ``keys`` [..., N], the largest t with #(key >= t) >= k,
  built bit by bit from the top in 32 masked counts."""

  def grow(bit, threshold):
    candidate = threshold | (jnp.uint32(1) << (jnp.uint32(31) - bit.astype(jnp.uint32)))
    enough = jnp.sum(keys >= candidate[..., None], axis=-1) >= k
    return jnp.where(enough, candidate, threshold)

  return jax.lax.fori_loop(0, 32, grow, jnp.zeros(keys.shape[:-1], jnp.uint32))


def top_k_mask(logits_BV: jax.Array, top_k: int) -> jax.Array:
  """[..., V] bool: the ``top_k`` largest logits, ties broken by token id (as a stable sort
  would), found without sorting.

  The k-th largest value's key t* is the largest t with #(key >= t) >= k; it is built bit by
  bit from the top, 32 masked counts over the vocabulary. Tokens above t* are kept, and those
  tied at t* in token-id order until k are kept. On a CPU this is 12x faster than a sort for
  256 rows of 49,152 (0.23 s against 2.8 s; lax.top_k sorts too, 2.1 s).
  """
  keys = _ordered_bits(logits_BV)
  threshold = _kth_largest(keys, top_k)
  above, tied = keys > threshold[..., None], keys == threshold[..., None]
  room = top_k - jnp.sum(above, axis=-1)
  return _with_ties_cut(
    keys,
    threshold,
    jnp.sum(tied, axis=-1) <= room,
    lambda: above | (tied & (jnp.cumsum(tied, axis=-1) <= room[..., None])),
  )


NUCLEUS_BLOCK = 32
"""``nucleus_mask`` looks for the nucleus in blocks of this many consecutive token ids ..."""
NUCLEUS_BLOCKS = 128
"""... and first in the ``NUCLEUS_BLOCKS`` blocks with the largest probabilities (4,096 tokens;
on SmolLM2's answers at T = 0.8, the 99th percentile of the nucleus at top_p 0.95 is 102
tokens)."""

_ONE = 0x3F800000  # The bits of 1.0: no probability is above it.


def _nucleus_threshold(keys, probs, low, top_p):
  """(t*, m(t*)) per row: the smallest key t > ``low`` with m(t) = mass of the keys above t
  below top_p, by bisection over the bit patterns of float32 (ordered like the non-negative
  floats they encode); needs m(low) >= top_p. ``keys`` and ``probs`` may be any part of the
  vocabulary that holds every key above ``low``."""

  def mass_above(threshold):
    return jnp.sum(jnp.where(keys > threshold[..., None], probs, 0.0), axis=-1)

  def halve(_, bounds):  # Invariant: m(lo) >= top_p > m(hi).
    lo, hi = bounds
    mid = lo + (hi - lo) // 2
    below = mass_above(mid) < top_p
    return jnp.where(below, lo, mid), jnp.where(below, mid, hi)

  hi = jnp.full(low.shape, _ONE, jnp.int32)
  _, hi = jax.lax.fori_loop(0, 32, halve, (low, hi))
  return hi, mass_above(hi)


def _nucleus_in_top_blocks(keys, probs, top_p):
  """(t*, m(t*), found) per row, looking only in the NUCLEUS_BLOCKS blocks with the largest
  keys. L, the largest key of the other blocks, is at least every key outside the chosen
  ones; if the chosen keys above L hold top_p of the mass, m(L) >= top_p, so t* > L and every
  key at or above t* is among the chosen: the bisection over them (32 steps over 4,096 tokens
  instead of the vocabulary) finds the same t*. ``found`` is False for the rows where the
  nucleus reaches below L (flat distributions)."""
  *lead, vocab = keys.shape
  shape = (*lead, vocab // NUCLEUS_BLOCK, NUCLEUS_BLOCK)
  keys_BNW, probs_BNW = keys.reshape(shape), probs.reshape(shape)
  tops_BN = jnp.max(keys_BNW, axis=-1)
  # L: the (NUCLEUS_BLOCKS + 1)-th largest block maximum; at most NUCLEUS_BLOCKS blocks have a
  # key above it. Their indices, in order (a sort or lax.top_k costs 8x this on a CPU).
  low = _kth_largest(tops_BN.astype(jnp.uint32), NUCLEUS_BLOCKS + 1).astype(jnp.int32)
  rank_BN = jnp.cumsum(tops_BN > low[..., None], axis=-1, dtype=jnp.int32)
  slots = jnp.arange(1, NUCLEUS_BLOCKS + 1, dtype=jnp.int32)
  find = jax.vmap(lambda rank_N: jnp.searchsorted(rank_N, slots))  # Past the end: no block.
  blocks = find(rank_BN.reshape(-1, rank_BN.shape[-1])).reshape(*lead, NUCLEUS_BLOCKS)

  def chosen(values_BNW, padding):
    picked = jnp.take_along_axis(
      values_BNW, blocks[..., None], axis=-2, mode="fill", fill_value=padding
    )
    return picked.reshape(*lead, NUCLEUS_BLOCKS * NUCLEUS_BLOCK)

  keys_BC, probs_BC = chosen(keys_BNW, -1), chosen(probs_BNW, 0.0)
  found = jnp.sum(jnp.where(keys_BC > low[..., None], probs_BC, 0.0), axis=-1) >= top_p
  threshold, mass = _nucleus_threshold(keys_BC, probs_BC, low, top_p)
  return threshold, mass, found


def nucleus_mask(
  logits_BV: jax.Array, top_p: float, *, blocks_first: bool | None = None
) -> jax.Array:
  """[..., V] bool: the nucleus of softmax(logits), the smallest set of most likely tokens
  (ties broken by token id) whose mass reaches ``top_p``, found without sorting.

  Token i is kept iff the mass of the tokens ranked before it is below top_p. With
  m(t) = sum of the probabilities above t (a non-increasing step function), that is
  p_i >= t* for t* the smallest t with m(t) < top_p, ties at t* aside. A bisection over the
  bit patterns of float32 (ordered like the non-negative floats they encode) finds t* exactly
  in 31 masked sums; the tokens tied at t* are then kept in token-id order while m(t*) + their
  mass before stays below top_p. On a CPU a large vocabulary is searched first in its most
  likely blocks (``_nucleus_in_top_blocks``), and in whole only for the rows whose nucleus is
  not there; accelerators search the whole vocabulary for every row (the same set, up to the
  float32 rounding of the masses); ``blocks_first`` True or False forces one way anywhere.
  Under ``jax.vmap`` both ways and the tie count run for every row (``lax.cond`` becomes a
  select). On a CPU the bisection over 40 rows of 1024 cost 0.2 ms where sorting them cost
  5.9 ms; accelerators sort slowly too. The blocks cut SmolLM2's nucleus at T = 0.8, top-p
  0.95 from 7.7 to 1.4 ms for 5 rows of 49,152
  (docs/benchmarks.md, "The nucleus in its most likely blocks").
  """
  probs = jax.nn.softmax(logits_BV.astype(jnp.float32), axis=-1)
  keys = jax.lax.bitcast_convert_type(probs, jnp.int32)  # Monotone in probs >= 0.
  vocab = keys.shape[-1]

  def whole_vocabulary():
    return _nucleus_threshold(keys, probs, jnp.full(keys.shape[:-1], -1, jnp.int32), top_p)

  def blocks_then_whole():
    threshold, mass, found = _nucleus_in_top_blocks(keys, probs, top_p)
    return jax.lax.cond(
      jnp.all(found),
      lambda: (threshold, mass),
      lambda: jax.tree.map(
        lambda a, b: jnp.where(found, a, b), (threshold, mass), whole_vocabulary()
      ),
    )

  large = vocab % NUCLEUS_BLOCK == 0 and vocab >= 4 * NUCLEUS_BLOCKS * NUCLEUS_BLOCK
  if large and blocks_first is None:
    # On a CPU the passes' bytes are the cost. On an accelerator the 32 passes are dependent
    # small reductions, and the blocks would add 32 more (L) and a lax.cond: not measured
    # there yet, so accelerators keep the whole-vocabulary search.
    threshold, mass = jax.lax.platform_dependent(cpu=blocks_then_whole, default=whole_vocabulary)
  elif large and blocks_first:
    threshold, mass = blocks_then_whole()
  else:
    threshold, mass = whole_vocabulary()
  tied_mass = jax.lax.bitcast_convert_type(threshold, jnp.float32)  # Each tied token's.

  def cut():
    tied = keys == threshold[..., None]
    before = mass[..., None] + (jnp.cumsum(tied, axis=-1) - tied) * probs
    return (keys > threshold[..., None]) | (tied & (before < top_p))

  last_tied = jnp.sum(keys == threshold[..., None], axis=-1) - 1
  return _with_ties_cut(keys, threshold, mass + last_tied * tied_mass < top_p, cut)


def probabilities(logits_BV: jax.Array, sampling: SamplingConfig) -> jax.Array:
  """The warped distribution as float32 probabilities."""
  return jax.nn.softmax(warp_logits(logits_BV, sampling), axis=-1)


def sample(key: jax.Array, logits_BV: jax.Array, sampling: SamplingConfig) -> jax.Array:
  """One token per row from the warped distribution (argmax when greedy), drawn from 64 random
  bits (``draws.categorical``), so even a token of probability 1e-12 keeps its rate.

  Logits that are no distribution (a NaN, a +inf, or -inf at every token of a row) raise
  ``FloatingPointError`` when called on concrete arrays. Under ``jit`` nothing can raise: such a
  row draws token 0, and the samplers report it themselves (``model_protocol.has_nan``)."""
  if not isinstance(logits_BV, jax.core.Tracer):  # One flag per row comes to the host.
    broken = np.asarray(~jnp.isfinite(jnp.max(logits_BV, axis=-1)))
    if broken.any():
      rows = np.argwhere(broken).tolist() if broken.ndim > 1 else np.flatnonzero(broken).tolist()
      raise FloatingPointError(
        f"sample: the logits of rows {rows} are NaN, +inf, or -inf for every token: no "
        "distribution to draw from (check the model's weights and inputs)."
      )
  if sampling.greedy:
    return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
  return draws.categorical(key, probabilities(logits_BV, sampling))
