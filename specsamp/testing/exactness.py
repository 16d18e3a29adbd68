r"""The exactness toolkit: what every exactness check in specsamp is made of.

  exact_distribution   P(x_1..x_N | prompt) under a warped target, every continuation
                       enumerated (float64 chain-rule products)
  count_continuations  drawn continuations -> counts in the same lexicographic cells
  g_test               counts against exact probabilities:
                         G = 2 sum_cells O log(O / E), cells expected < 5 times pooled,
                         rejected  <=>  G >= chi2.isf(level, cells - 1),
                       and a draw in a cell of probability 0 is rejected outright
  fit_null             G's distribution under exact draws of the same rows (a parametric
                       bootstrap), fitted by a scaled chi-square: the threshold that has
                       the level it claims when many cells are sparse
  calibrated_g_test    g_test with that threshold (what the certificate uses)
  planted              a context that breaks the sampler on purpose (BUGS), so that a check
                       shows it has the power to see a real fault
  noisy_copy           a draft that agrees with its target often but not always
  throughput_compiled  a sampler compiled for speed whatever XLA_FLAGS asks

The certificate (``experiments/proofs/certify.py``, ``scripts/certify.py``), the real-target
certificate (``certify_real.py``), the keras-hub comparison and the test suite all use these,
so a G-test means the same thing everywhere.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from scipy import stats

from specsamp.sampling import drafters, draws, proposals, verification, warping

# --- The exact distribution. ---------------------------------------------------------------------


def vocab_size(model: Any) -> int:
  """A decode-protocol model's vocabulary: ``model.vocab_size``, else its config's."""
  size = getattr(model, "vocab_size", None)
  return int(size if size is not None else model.config.vocab_size)


@functools.partial(jax.jit, static_argnames=("sampling", "count"))
def last_distributions(
  model: Any, tokens_BT: jax.Array, sampling: warping.SamplingConfig, count: int
) -> jax.Array:
  """[B, count, V]: the warped next-token distributions at each row's last ``count``
  positions, through the decode protocol (one causal pass gives every prefix's)."""
  batch, length = tokens_BT.shape
  positions_BT = jnp.broadcast_to(jnp.arange(length), (batch, length))
  logits_BTV, _ = model(tokens_BT, positions_BT, model.init_cache(batch, length))
  return warping.probabilities(logits_BTV[:, length - count :], sampling)


def exact_distribution(
  target: Any,
  prompt: tuple[int, ...],
  sampling: warping.SamplingConfig,
  new_tokens: int,
) -> np.ndarray:
  """P(x_1..x_N | prompt) under the warped target, [V^N] in lexicographic order (float64),
  N = ``new_tokens`` and V the target's vocabulary.

  One forward pass over the V^(N-1) sequences prompt + x_1..x_{N-1} gives every factor
  p(x_t | prompt, x_<t) of the chain rule at positions L-1..L+N-2.
  """
  vocab = vocab_size(target)
  prefixes = np.asarray(list(itertools.product(range(vocab), repeat=new_tokens - 1)), np.int32)
  prefixes = prefixes.reshape(vocab ** (new_tokens - 1), new_tokens - 1)  # [1, 0] for N = 1.
  seqs = np.concatenate(
    [np.tile(np.asarray(prompt, np.int32), (len(prefixes), 1)), prefixes], axis=1
  )
  step = np.asarray(last_distributions(target, jnp.asarray(seqs), sampling, new_tokens), np.float64)
  step /= step.sum(-1, keepdims=True)
  rows = np.arange(len(prefixes))
  probs = np.ones(len(prefixes))
  for t in range(new_tokens - 1):
    probs *= step[rows, t, prefixes[:, t]]
  return (probs[:, None] * step[:, -1]).reshape(-1)


# --- Counting and the G-test. ------------------------------------------------------------------


def codes(continuations: np.ndarray, vocab: int) -> np.ndarray:
  """Lexicographic index in 0..V^N-1 of each continuation (the last axis, N tokens)."""
  length = continuations.shape[-1]
  return np.asarray(continuations).astype(np.int64) @ (vocab ** np.arange(length - 1, -1, -1))


def count_continuations(continuations: np.ndarray, vocab: int) -> np.ndarray:
  """[V^N] counts of the continuations [..., N]: the cells of ``exact_distribution``."""
  length = np.shape(continuations)[-1]
  return np.bincount(codes(continuations, vocab).reshape(-1), minlength=vocab**length)


def _pooled(x_N: np.ndarray, big_C: np.ndarray, small_C: np.ndarray) -> np.ndarray:
  """[..., C] -> [..., cells]: the big cells, then the small ones summed into one."""
  return np.concatenate([x_N[..., big_C], x_N[..., small_C].sum(-1, keepdims=True)], -1)


def _g(observed: np.ndarray, expected: np.ndarray) -> np.ndarray:
  """G = 2 sum O log(O / E) over the last axis (cells never observed add 0)."""
  ratio = np.where(observed > 0, observed / np.where(expected > 0, expected, 1.0), 1.0)
  return 2.0 * np.sum(observed * np.log(ratio), axis=-1)


def g_test(counts: np.ndarray, probs: np.ndarray, level: float) -> dict[str, Any]:
  """G-test of ``counts`` against ``probs`` (same shape, flattened); small cells pooled.
  Returns G, cells, the threshold at ``level``, the p-value, the count of draws in cells of
  probability 0 (``impossible``: any such draw fails outright, G = inf, p-value 0) and
  ``rejected`` (G >= threshold)."""
  counts, probs = np.reshape(counts, -1).astype(np.float64), np.reshape(probs, -1)
  probs = probs / probs.sum()
  expected = probs * counts.sum()
  big = expected >= 5
  small = ~big & (probs > 0)
  cells = int(big.sum()) + int(expected[small].sum() > 0)
  # One cell (a deterministic law: top-k 1, a tiny temperature): G is 0 whatever is drawn,
  # and only a draw in a cell of probability 0 fails (the chi-square of 0 degrees is NaN).
  threshold = float(stats.chi2.isf(level, cells - 1)) if cells > 1 else math.inf
  if np.any(counts[probs <= 0] > 0):
    return {
      "G": math.inf,
      "cells": cells,
      "threshold": threshold,
      "p_value": 0.0,
      "impossible": int(counts[probs <= 0].sum()),
      "rejected": True,
    }
  g = float(_g(_pooled(counts, big, small), _pooled(expected, big, small)))
  return {
    "G": g,
    "cells": cells,
    "threshold": threshold,
    "p_value": float(stats.chi2.sf(g, cells - 1)) if cells > 1 else 1.0,
    "impossible": 0,
    "rejected": not g < threshold,
  }


def null_g_values(
  probs_BC: np.ndarray, draws_per_row: int | np.ndarray, repeats: int = 200, seed: int = 0
) -> np.ndarray:
  """``repeats`` values of G when the counts ARE drawn from the exact distribution (a
  parametric bootstrap): row b of ``probs_BC`` (one row's exact distribution over C cells) gets
  ``draws_per_row`` (one number, or one per row) multinomial draws, scored as ``g_test`` scores
  a certificate case's rows (each row weighted by its draws). The cells pooled depend only on
  the expected counts, so every value pools the same cells as the case itself."""
  rng = np.random.default_rng(seed)
  probs_BC = np.asarray(probs_BC, np.float64)
  rows = probs_BC / probs_BC.sum(axis=-1, keepdims=True)
  draws_B = np.broadcast_to(np.asarray(draws_per_row, np.int64), (len(rows),))
  probs = (rows * (draws_B / draws_B.sum())[:, None]).reshape(-1)
  expected = probs * draws_B.sum()
  big, small = expected >= 5, (expected < 5) & (probs > 0)
  expected_cells = _pooled(expected, big, small)
  chunk = max(1, 2**24 // probs.size)  # About 128 MiB of counts at a time.
  values = []
  for start in range(0, repeats, chunk):
    drawn = rng.multinomial(draws_B, rows, size=(min(chunk, repeats - start), len(rows)))
    values.append(_g(_pooled(drawn.reshape(len(drawn), -1), big, small), expected_cells))
  return np.concatenate(values)


def null_g(
  probs_BC: np.ndarray, draws_per_row: int | np.ndarray, repeats: int = 200, seed: int = 0
) -> dict[str, float]:
  """G's null distribution (``null_g_values``) summarised: with many sparse cells G runs above
  its chi-square mean: on the certificate's ragged Transformer cases at T = 1 (20,663 cells at
  10^6 draws) its mean is about 20,950, and the chi-square threshold at level 10^-4 is exceeded
  by about 1% of exact draws (docs/certificate.md, "Calibrated thresholds"). Returns the mean,
  the standard deviation and the largest G: a case's G is then read as (G - mean) / sd."""
  values = null_g_values(probs_BC, draws_per_row, repeats, seed)
  return {"mean": float(values.mean()), "sd": float(values.std()), "max": float(values.max())}


@dataclasses.dataclass(frozen=True)
class NullFit:
  """G's null distribution fitted by a scaled chi-square, G ~ scale * chi2(dof), with the mean
  and variance of the bootstrap (``fit_null``): scale = var / (2 mean), dof = 2 mean^2 / var.
  Filled cells give scale ~ 1 and dof ~ cells - 1 (the chi-square itself); sparse cells a
  larger mean and spread, which the plain chi-square threshold ignores."""

  scale: float
  dof: float
  mean: float
  sd: float

  def threshold(self, level: float) -> float:
    return float(self.scale * stats.chi2.isf(level, self.dof))

  def p_value(self, g: float) -> float:
    return float(stats.chi2.sf(g / self.scale, self.dof))


def fit_null(
  probs_BC: np.ndarray, draws_per_row: int | np.ndarray, repeats: int = 1000, seed: int = 0
) -> NullFit:
  """``NullFit`` from ``repeats`` bootstrap values of G (``null_g_values``)."""
  values = null_g_values(probs_BC, draws_per_row, repeats, seed)
  mean, var = float(values.mean()), float(values.var(ddof=1))
  if var <= 0:  # One pooled cell (or none): G is 0 whatever is drawn.
    return NullFit(1.0, max(mean, 1.0), mean, 0.0)
  return NullFit(var / (2 * mean), 2 * mean**2 / var, mean, var**0.5)


def calibrated_g_test(
  counts: np.ndarray, probs: np.ndarray, level: float, null: NullFit
) -> dict[str, Any]:
  """``g_test`` with the threshold and p-value of ``null`` (the same rows' bootstrap,
  ``fit_null``) instead of the chi-square's; the chi-square's threshold stays in the result as
  ``chi2_threshold``, the null's mean and spread as ``null_mean`` and ``null_sd``. A draw in a
  cell of probability 0 still fails outright."""
  test = g_test(counts, probs, level)
  calibrated = dict(test, chi2_threshold=test["threshold"], null_mean=null.mean, null_sd=null.sd)
  if test["impossible"]:
    return calibrated
  threshold = null.threshold(level)
  return dict(
    calibrated,
    threshold=threshold,
    p_value=null.p_value(test["G"]),
    rejected=not test["G"] < threshold,
  )


def g_test_cells(
  observed: Mapping[Any, int], expected: Mapping[Any, float], level: float
) -> dict[str, Any]:
  """``g_test`` over named cells: observed counts and exact probabilities keyed by outcome
  (a verifier's verdict, an accepted count). An outcome observed but not expected is a cell
  of probability 0."""
  cells = list(expected) + [cell for cell in observed if cell not in expected]
  counts = np.asarray([observed.get(cell, 0) for cell in cells])
  return g_test(counts, np.asarray([expected.get(cell, 0.0) for cell in cells]), level)


# --- Models and samplers. ----------------------------------------------------------------------


def noisy_copy(model: nnx.Module, scale: float, seed: int) -> nnx.Module:
  """``model`` with Gaussian noise of ``scale`` x each tensor's std: a draft that agrees with
  the target often but not always. Keeps each parameter's sharding."""
  graphdef, state = nnx.split(model)
  leaves, treedef = jax.tree.flatten(state)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  noisy = [
    _like(x, x + scale * jnp.std(x) * jax.random.normal(k, x.shape, x.dtype))
    for x, k in zip(leaves, keys)
  ]
  return nnx.merge(graphdef, jax.tree.unflatten(treedef, noisy))


def perturbed_sequential_head(d_model: int, seed: int = 0, scale: float = 0.5) -> nnx.Module:
  """A sequential head (``models/sequential_head.py``) whose correction is not zero (an
  untrained head proposes the parallel draft's own q_k): Gaussian ``down`` weights of
  ``scale``, so its q_k depend on the drafts before k, as a trained head's do."""
  from specsamp.models.sequential_head import SequentialHead

  head = SequentialHead(d_model, rngs=nnx.Rngs(seed))
  shape = head.down_DD[...].shape
  head.down_DD[...] = scale * jax.random.normal(jax.random.key(seed + 1), shape)
  return head


def _like(x: jax.Array, y: jax.Array) -> jax.Array:
  """``y`` placed as ``x`` is: on x's devices when x is sharded over several; left
  uncommitted when x lives on one device, so it can join any mesh (as x can)."""
  return jax.device_put(y, x.sharding) if len(x.sharding.device_set) > 1 else y


def throughput_compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
  """``jax.jit(fn)``, compiled on its first call with LLVM at full optimization whatever
  XLA_FLAGS asks. The test suite compiles at -O0 (its programs are many and short), but a
  G-test's sampler runs for tens of seconds: a certificate case took 44 s at -O0 and 26 s
  with this (2026-11-26, this repository's 2-core CPU). One shape per sampler."""
  jitted, compiled = jax.jit(fn), {}

  def call(*args):
    if "program" not in compiled:
      compiled["program"] = jitted.lower(*args).compile(
        compiler_options={"xla_backend_optimization_level": 2}
      )
    return compiled["program"](*args)

  return call


# --- Planted bugs. ------------------------------------------------------------------------------

# Each is a fault a real implementation could have; a check that cannot reject it cannot
# certify the sampler either.
BUGS = {
  "residual_from_p": "resample from p instead of norm(max(0, w p - q))  (verifiers)",
  "unweighted_block": "block verification's residual without the weight w  (block)",
  "coarse_le": "8-bit uniform draws compared with r <= a  (random draws)",
  "bits8": "every draw from 8 random bits  (random draws, coins and tokens)",
  "misreported_q": "prompt lookup reports a uniform q for its one-hot proposal  (drafters)",
  "sibling_against_p": "a tree's later siblings tried against the unchanged distribution "
  "instead of the residual left by the rejected ones  (tree verifiers)",
  "siblings_full_q": "siblings drawn without replacement report their parent's whole q "
  "instead of the renormalised one they were drawn from  (tree drafting)",
  "chosen_real_q": "a greedy choice verified with the drafter's warped q, which it was not "
  "drawn from, instead of the one-hot q  (proposal modes)",
  "parallel_wrong_q": "a parallel drafter reports each draft token with the q of the position "
  "before it instead of the q it was drawn from  (parallel drafting)",
  "sequential_head_pass_q": "a parallel draft with a sequential head reports the pass's q_k "
  "for tokens drawn from the head's corrected q_k  (parallel drafting)",
  "copied_drawn_q": "lookup with the feature head elsewhere verifies a copied token with the "
  "head's q instead of the point mass  (feature+lookup)",
  "narrow_one_short": "narrow scoring one position short of the longest proposal, so a fully "
  "accepted row's next token comes from a position never scored  (narrow scoring)",
}
TREE_BUGS = ("sibling_against_p", "siblings_full_q")


@contextlib.contextmanager
def planted(bug: str | None) -> Iterator[None]:
  """Temporarily breaks the sampler as ``bug`` names (None: as it is); clears jit caches on
  the way in and out, so no compiled program outlives its patch."""
  if bug is None:
    yield
    return
  saved = []

  def patch(module, name, value):
    saved.append((module, name, getattr(module, name)))
    setattr(module, name, value)

  if bug in ("residual_from_p", "sibling_against_p"):
    # After a rejection (or a rejected sibling), draw from p as it is.
    patch(verification, "residual", lambda p_BV, q_BV, weight_B=1.0, token_B=None, on_B=None: p_BV)
  elif bug == "unweighted_block":
    original = verification.residual
    patch(
      verification,
      "residual",
      lambda p_BV, q_BV, weight_B=1.0, token_B=None, on_B=None: original(
        p_BV, q_BV, 1.0, token_B, on_B
      ),
    )
  elif bug == "coarse_le":
    patch(
      draws,
      "bernoulli_from_words",
      lambda words, a: (
        (words[0] >> 24).astype(jnp.float32) / 256.0 <= jnp.asarray(a, jnp.float32)
      ),
    )
  elif bug == "bits8":
    patch(
      draws,
      "random_words",
      lambda key, shape: jax.random.bits(key, (2, *shape), jnp.uint32)
      & jnp.asarray([[0xFF000000], [0]], jnp.uint32).reshape((2,) + (1,) * len(shape)),
    )
  elif bug == "misreported_q":
    original_propose = drafters.PromptLookupDrafter.propose

    def propose(self, *args, **kwargs):
      proposal, state = original_propose(self, *args, **kwargs)
      vocab = args[-1] if args else kwargs["vocab_size"]  # propose(..., vocab_size)
      uniform = jnp.full((*proposal.tokens.shape, vocab), 1.0 / vocab, jnp.float32)
      return proposal.replace(probs=uniform), state

    patch(drafters.PromptLookupDrafter, "propose", propose)
  elif bug == "parallel_wrong_q":
    from specsamp.sampling import parallel_drafter

    original_parallel = parallel_drafter.ParallelDrafter.propose

    def propose_parallel(self, *args, **kwargs):
      proposal, state = original_parallel(self, *args, **kwargs)
      return proposal.replace(probs=jnp.roll(proposal.probs, 1, axis=1)), state

    patch(parallel_drafter.ParallelDrafter, "propose", propose_parallel)
  elif bug == "sequential_head_pass_q":
    from specsamp.sampling import parallel_drafter

    original_propose = parallel_drafter.ParallelDrafter.propose

    def propose_sequential(self, cache, *args):
      proposal, state = original_propose(self, cache, *args)
      if self.head is None:
        return proposal, state
      plain, _ = original_propose(dataclasses.replace(self, head=None), cache, *args)
      return proposal.replace(probs=plain.probs), state

    patch(parallel_drafter.ParallelDrafter, "propose", propose_sequential)
  elif bug == "siblings_full_q":
    original_draw = proposals.draw_depth

    def draw_depth(key, tree, depth, parent_q_BnV, tokens_BN, greedy_logits_BnV=None):
      tokens_Bn, _ = original_draw(key, tree, depth, parent_q_BnV, tokens_BN, greedy_logits_BnV)
      return tokens_Bn, parent_q_BnV

    patch(proposals, "draw_depth", draw_depth)
  elif bug == "narrow_one_short":
    from specsamp.sampling import chain_step

    def one_short(proposed_B, widths):
      return jnp.sum(jnp.asarray(widths, jnp.int32) < jnp.max(proposed_B)).astype(jnp.int32)

    patch(chain_step, "scoring_width", one_short)
  elif bug == "copied_drawn_q":
    from specsamp.sampling import lookup_feature_drafter

    patch(lookup_feature_drafter, "copied_q", lambda point_BKV, drawn_BKV: drawn_BKV)
  elif bug == "chosen_real_q":
    # Chains, static trees and dynamic trees all report chosen tokens through chosen_q.
    patch(proposals, "chosen_q", lambda tokens, warped_q: warped_q)
  else:
    raise ValueError(f"Unknown planted bug {bug!r}; known: {tuple(BUGS)}.")
  jax.clear_caches()
  try:
    yield
  finally:
    for module, name, value in reversed(saved):
      setattr(module, name, value)
    jax.clear_caches()
