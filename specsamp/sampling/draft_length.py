"""The automatic draft length: which K to speculate with, from measured loops.

The speedup formula (Leviathan et al. 2023, Theorem 3.8, with the scoring call's cost measured
rather than assumed equal to a step):

  E[tokens per target call] = (1 - alpha^(K+1)) / (1 - alpha)
  speedup = E[tokens per target call] * t_target_step / (K * t_draft_step + t_score(K+1))

and its batched form (the loop runs until its slowest row is done: ``slowest_row_iterations``).

Choosing K from separately timed single model calls trusts a handful of noisy numbers: on a
shared 2-core CPU a fresh clone's main command predicted 2.37x for K=3 from them and measured
1.51x. ``choose`` instead fits the cost of a loop iteration to loops that ran: probe the loop
at two draft lengths (``Probe``: seconds per call and iterations per call, from real calls),
fit seconds per iteration = a + b K (``IterationCost``: what scoring K + 1 tokens, K draft
steps and the loop's own work cost together, however they split), and predict every K's call
as its slowest row's expected iterations (``iterations_until_done``) times that cost. At a
probed K the cost per iteration is the measured one (two probes and an unclamped fit: the
line passes through both), so the model differs from the probe's own speedup only by its
iterations, expected where the probe counted them; between and beyond the probes the cost is
that line, not a sum of single-call timings. The model is then scaled to the probes
(``calibrated``, ``choose_from_probes``): the measured speedup at a probed K, the ratio
measured / modelled interpolated between them, so no prediction overrules a loop that ran.

A row's tokens per iteration at K come from its histogram of accepted counts at the largest
probed K, truncated to K (``truncated``), not from the i.i.d. formula at its alpha: the
histogram is what the loop did, runs of easy tokens included, and truncating it is exact in
law for a chain drafter, where the i.i.d. formula is a model of it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from specsamp.config_fields import is_int


def _check_law(alpha: float, num_draft_tokens: int) -> None:
  if not 0 <= alpha <= 1:
    raise ValueError(f"alpha must be in [0, 1], got {alpha}.")
  if not is_int(num_draft_tokens) or num_draft_tokens < 0:  # -3 gave -2.81 tokens per call.
    raise ValueError(f"num_draft_tokens must be an int >= 0, got {num_draft_tokens!r}.")


def expected_tokens_per_call(alpha: float, num_draft_tokens: int) -> float:
  """Expected tokens per target call with i.i.d. acceptance ``alpha`` (bonus token included)."""
  _check_law(alpha, num_draft_tokens)
  if alpha == 1:
    return num_draft_tokens + 1.0
  return (1 - alpha ** (num_draft_tokens + 1)) / (1 - alpha)


def predicted_speedup(
  alpha: float,
  num_draft_tokens: int,
  target_step_s: float,
  draft_step_s: float,
  target_score_s: float,
) -> float:
  """Speedup over autoregressive sampling predicted from acceptance and costs."""
  iteration_s = num_draft_tokens * draft_step_s + target_score_s
  return expected_tokens_per_call(alpha, num_draft_tokens) * target_step_s / iteration_s


def iteration_tokens(alpha: float, num_draft_tokens: int) -> np.ndarray:
  """P(an iteration appends j + 1 tokens), j = 0..K, with i.i.d. acceptance ``alpha``: the
  first rejection at position j + 1 (or all K accepted, plus the bonus token)."""
  _check_law(alpha, num_draft_tokens)
  accepted_first = alpha ** np.arange(num_draft_tokens + 1)
  probs = accepted_first * (1 - alpha)
  probs[-1] = alpha**num_draft_tokens
  return probs


def truncated(accepted_histogram: Sequence[float], num_draft_tokens: int) -> np.ndarray:
  """P(an iteration appends j + 1 tokens), j = 0..K, read from a histogram of accepted draft
  counts measured at a draft length K_max >= K: a chain drafter's first K drafts are the
  same at K and at K_max (each q_k sees only the drafts before it), so an iteration that
  accepted n of K_max would have accepted min(n, K) of K. Unlike ``iteration_tokens`` this
  keeps what real acceptance does and i.i.d. acceptance does not: runs of easy tokens, where
  acceptance given the earlier drafts accepted rises with the position."""
  counts = np.asarray(accepted_histogram, np.float64)
  if counts.ndim != 1 or counts.sum() <= 0 or (counts < 0).any():
    raise ValueError(f"Needs a histogram of accepted counts with iterations, got {counts}.")
  if not 0 <= num_draft_tokens < len(counts):
    raise ValueError(f"K={num_draft_tokens} is not in 0..{len(counts) - 1}, the measured range.")
  probs = counts[: num_draft_tokens + 1] / counts.sum()
  probs[num_draft_tokens] += counts[num_draft_tokens + 1 :].sum() / counts.sum()
  return probs


def slowest_row_iterations(
  row_alphas: Sequence[float], num_draft_tokens: int, max_new_tokens: int
) -> float:
  """Expected iterations of a batched call: the loop runs until its slowest row has
  ``max_new_tokens``, each row with its own i.i.d. acceptance (rows independent)
  (``iterations_until_done`` at ``iteration_tokens``). One row at alpha = 0 needs N; every
  row at alpha = 1 needs ceil(N / (K + 1))."""
  rows = [iteration_tokens(float(alpha), num_draft_tokens) for alpha in row_alphas]
  return iterations_until_done(rows, max_new_tokens)


# A row's probability of a token count below this is dropped from the ends of its live window:
# each dropped mass moves E[iterations] by less than it times max_new_tokens.
NEGLIGIBLE_MASS = 1e-30


def iterations_until_done(row_tokens: Sequence[np.ndarray], max_new_tokens: int) -> float:
  """Expected iterations until every row has ``max_new_tokens``, row r appending j + 1 tokens
  per iteration with probability ``row_tokens[r][j]`` (rows independent).

  By dynamic programming over each row's tokens so far: with ``done_r(n) = P(row r has N
  tokens after n iterations)``, E[max_r T_r] = sum_{n >= 0} (1 - prod_r done_r(n)). Each
  iteration convolves the row's live token counts (fewer than N) with its step law and moves
  what reaches N into ``done_r``; only the counts between the first and last of mass above
  ``NEGLIGIBLE_MASS`` are kept, so an iteration costs the spread of the counts (which grows as
  sqrt(n)), not N, and a row stops once it is done. Against the whole range every iteration
  (2026-11-30, one core): 8 rows at N = 2,048 and K = 8 1.20 -> 0.085 s, 4 rows at N = 100,000
  37 -> 2.8 s; the same to 1.4e-14 over 500 random cases (tests/test_perf_model.py).
  """
  n_max = int(max_new_tokens)
  if n_max < 1 or not len(row_tokens):
    raise ValueError("Needs max_new_tokens >= 1 and at least one row.")
  dones = [_row_done(np.asarray(probs, np.float64), n_max) for probs in row_tokens]
  all_done = np.ones(max(len(done) for done in dones))
  for done in dones:  # A row past its last iteration is done (all but a negligible mass).
    all_done[: len(done)] *= done
  return float((1.0 - all_done).sum())


def _row_done(probs: np.ndarray, n_max: int) -> np.ndarray:
  """[done(0), done(1), ...] of one row until its live counts are all negligible (or gone):
  P(the row has ``n_max`` tokens after n iterations). ``probs[j]``: P(j + 1 tokens)."""
  live, lowest = np.ones(1), 0  # P(lowest + i tokens so far), every count below n_max.
  done, reached = [0.0], 0.0
  while True:
    after = np.convolve(live, probs)  # after[m]: P(lowest + 1 + m tokens).
    lowest += 1  # Every iteration appends at least one token.
    cut = max(n_max - lowest, 0)  # after[cut:] reached n_max (one of N or more finishes it).
    reached += float(after[cut:].sum())
    done.append(reached)
    kept = np.flatnonzero(after[:cut] > NEGLIGIBLE_MASS)
    if not len(kept):
      return np.asarray(done)
    live, lowest = after[kept[0] : kept[-1] + 1], lowest + int(kept[0])


def predicted_batch_speedup(
  row_alphas: Sequence[float],
  num_draft_tokens: int,
  max_new_tokens: int,
  target_step_s: float,
  draft_step_s: float,
  target_score_s: float,
) -> float:
  """``predicted_speedup`` for a batched call of ``max_new_tokens`` per row: the loop pays the
  slowest row's iterations (``slowest_row_iterations``), the autoregressive loop N steps."""
  if num_draft_tokens == 0:
    return 1.0
  iterations = slowest_row_iterations(row_alphas, num_draft_tokens, max_new_tokens)
  iteration_s = num_draft_tokens * draft_step_s + target_score_s
  return max_new_tokens * target_step_s / (iterations * iteration_s)


@dataclasses.dataclass(frozen=True)
class Probe:
  """One draft length's measured loop: seconds per call and loop iterations per call (target
  calls less the prefill, the slowest row's), each the mean over the probe's calls."""

  num_draft_tokens: int
  seconds: float
  iterations: float


@dataclasses.dataclass(frozen=True)
class IterationCost:
  """Seconds per loop iteration at draft length K: ``fixed_s + per_draft_token_s * K``."""

  fixed_s: float
  per_draft_token_s: float

  def __call__(self, num_draft_tokens: int) -> float:
    return self.fixed_s + self.per_draft_token_s * num_draft_tokens

  @classmethod
  def fit(cls, probes: Sequence[Probe]) -> IterationCost:
    """Least squares over the probes' seconds per iteration (two distinct K at least); a
    negative slope (noise) is clamped to 0: drafting more never makes an iteration cheaper.
    A negative intercept (an iteration whose cost more than doubles between the probes, which
    2-core timing noise gives) is refitted through the origin, the least squares line with a
    fixed cost >= 0: extrapolated below the probes, the free line made cost(1) zero or
    negative, and K = 1 was predicted 6e15x (chosen) or -62x (never chosen; 2026-11-30)."""
    ks = np.asarray([p.num_draft_tokens for p in probes], np.float64)
    if len(set(ks.tolist())) < 2:
      raise ValueError(f"The iteration cost needs probes at two draft lengths, got {ks.tolist()}.")
    if any(p.seconds <= 0 or p.iterations <= 0 for p in probes):
      raise ValueError(f"Probes need positive seconds and iterations, got {list(probes)}.")
    per_iteration = np.asarray([p.seconds / p.iterations for p in probes])
    slope, intercept = np.polyfit(ks, per_iteration, 1)
    if slope < 0:
      return cls(fixed_s=float(per_iteration.mean()), per_draft_token_s=0.0)
    if intercept < 0:
      through_origin = float(np.dot(ks, per_iteration) / np.dot(ks, ks))
      return cls(fixed_s=0.0, per_draft_token_s=through_origin)
    return cls(fixed_s=float(intercept), per_draft_token_s=float(slope))


def predict_speedups(
  row_histograms: Sequence[Sequence[float]],
  max_new_tokens: int,
  autoregressive_s: float,
  cost: IterationCost,
  draft_lengths: Sequence[int],
) -> dict[int, float]:
  """{K: predicted speedup} for each K >= 1 of ``draft_lengths`` (and 0: 1.0): the measured
  autoregressive call over the slowest row's expected iterations times ``cost(K)``. Each row's
  tokens per iteration at K are its histogram of accepted counts at the largest probed K,
  truncated to K (``truncated``); every K must be at most that largest K."""
  predictions = {0: 1.0}
  for k in draft_lengths:
    if k < 1:
      continue
    rows = [truncated(histogram, k) for histogram in row_histograms]
    predictions[k] = autoregressive_s / (iterations_until_done(rows, max_new_tokens) * cost(k))
  return predictions


def probe_lengths(largest: int) -> tuple[int, ...]:
  """The draft lengths the automatic choice probes: the largest allowed and about half of it
  (one K when the largest is 1)."""
  if largest < 1:
    raise ValueError(f"The automatic draft length needs a largest K >= 1, got {largest}.")
  return (largest,) if largest == 1 else tuple(sorted({max(1, (largest + 1) // 2), largest}))


def calibrated(predictions: dict[int, float], measured: dict[int, float]) -> dict[int, float]:
  """``predictions`` (K -> speedup) scaled to what the probes measured (K -> speedup): at a
  probed K its measured speedup; between two probes the prediction times the ratio
  measured / predicted, interpolated linearly in K; beyond the probes the nearest probe's
  ratio; K = 0 stays 1.0.

  Why: at a probed K the model and the probe share the cost per iteration (an unclamped fit
  passes through both probes), so they differ in iterations: the expected ones, each row's
  iterations drawn independently from its histogram pooled over the probe calls, against the
  mean the probe calls counted. SmolLM2 at T=0.8 (feature+lookup) modelled 1.06x at K=4
  where its probes had measured 1.01x at K=2 and 0.96x at K=4, chose K=4, and ran at 0.88x
  (2026-12-01): scaled, no K reaches the margin and the loop is autoregressive. The cost: for a
  chain at T > 0 the expectation is the better estimate of one call's iterations in law, and
  the scaling trusts the mean of a few sampled calls instead; and where ``IterationCost.fit``
  was clamped (a negative slope or intercept: timing noise) the scaling restores each probe's
  own time, which the clamped line had smoothed. Accepted: at a probed K the prediction is
  what that K measured, never more."""
  if not measured or any(k < 1 or k not in predictions for k in measured):
    raise ValueError(
      f"Needs measured speedups at predicted K >= 1, got {sorted(measured)} of "
      f"{sorted(predictions)}."
    )
  values = (*measured.values(), *(predictions[k] for k in measured))
  if not all(math.isfinite(value) and value > 0 for value in values):
    raise ValueError(
      f"Speedups must be finite and > 0, got measured {measured}, predicted {predictions}."
    )
  probed = sorted(measured)
  ratios = [measured[k] / predictions[k] for k in probed]
  return {
    k: value if k == 0 else value * float(np.interp(k, probed, ratios))
    for k, value in predictions.items()
  }


# The speedup a K must be predicted to be chosen over autoregressive sampling: a margin for
# what the prediction leaves out.
MIN_SPEEDUP = 1.05


@dataclasses.dataclass(frozen=True)
class Choice:
  """The automatic draft length and why: the fitted cost of an iteration, the modelled
  speedups (K -> speedup) and the predicted ones (the model scaled to the probes), which the
  choice reads."""

  num_draft_tokens: int
  cost: IterationCost
  modelled: dict[int, float]
  predicted: dict[int, float]


def choose_from_probes(
  autoregressive_s: float,
  probes: Sequence[Probe],
  row_histograms: Sequence[Sequence[float]],
  max_new_tokens: int,
  largest: int,
  min_speedup: float = MIN_SPEEDUP,
) -> Choice:
  """The automatic draft length from loops that ran: the autoregressive call's seconds, the
  probes (``probe_lengths(largest)``) and each row's histogram of accepted counts at
  ``largest``. Fits the cost of an iteration (one probe: its own cost per iteration, flat),
  models every K in 1..largest (``predict_speedups``), scales the model to the probes
  (``calibrated``) and chooses from the scaled values (``choose``)."""
  if len({p.num_draft_tokens for p in probes}) > 1:
    cost = IterationCost.fit(probes)
  else:  # K = 1 only: nothing to fit, the one probe is the cost.
    cost = IterationCost(probes[0].seconds / probes[0].iterations, 0.0)
  modelled = predict_speedups(
    row_histograms, max_new_tokens, autoregressive_s, cost, range(1, largest + 1)
  )
  predicted = calibrated(
    modelled, {p.num_draft_tokens: autoregressive_s / p.seconds for p in probes}
  )
  return Choice(choose(predicted, min_speedup), cost, modelled, predicted)


def choose(predictions: dict[int, float], min_speedup: float = MIN_SPEEDUP) -> int:
  """The automatic draft length: the K with the best predicted speedup among
  ``predictions`` (K -> speedup; 0 is autoregressive, 1.0), or 0 when none is predicted at
  least ``min_speedup`` (a margin for what the prediction leaves out); ties go to the
  smaller K."""
  if any(k < 0 for k in predictions):
    raise ValueError(f"Draft lengths must be >= 0, got {sorted(predictions)}.")
  predictions = {0: 1.0, **predictions}
  best = max(predictions, key=lambda k: (predictions[k], -k))
  return best if predictions[best] >= min_speedup else 0
