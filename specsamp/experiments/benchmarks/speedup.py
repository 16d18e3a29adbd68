"""The speedup speculative sampling should reach, from the acceptance rate and measured costs.

Leviathan et al. 2023 (Theorem 3.8), with the cost of scoring K+1 tokens
measured instead of assumed equal to one step (on a CPU it is not):

  E[tokens per target call] = (1 - alpha^(K+1)) / (1 - alpha)
  speedup = E[tokens per target call] * t_target_step / (K * t_draft_step + t_score(K+1))

A tree proposal of N nodes and depth D scores N+1 tokens and makes D draft
calls; its tokens per call have no closed form here, so the tree's prediction
takes the MEASURED tokens per call (``StepCosts.predicted_from_tokens_per_call``),
with each draft call timed as one draft step (a lower bound on wider calls).

``harness.Bench.step_costs`` times the three model calls the formula needs with
``timing.time_calls`` (a jitted chain of dependent calls, compilation
excluded, median of repeats); ``choose_draft_length`` is the automatic K.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np


def expected_tokens_per_call(alpha: float, num_draft_tokens: int) -> float:
  """Expected tokens per target call with i.i.d. acceptance ``alpha`` (bonus token included)."""
  if not 0 <= alpha <= 1:
    raise ValueError(f"alpha must be in [0, 1], got {alpha}.")
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


@dataclasses.dataclass(frozen=True)
class StepCosts:
  """Seconds per model call at one batch size."""

  target_step_s: float  # Target, one token per row.
  draft_step_s: float  # Draft, one token per row.
  target_score_s: float  # Target, K+1 tokens per row (N+1 for a tree).
  num_draft_tokens: int
  score_tokens: int = 0  # Tokens scored per target call; 0 means K+1.

  @property
  def draft_ratio(self) -> float:
    """c: a draft step over a target step."""
    return self.draft_step_s / self.target_step_s

  @property
  def score_ratio(self) -> float:
    """Scoring K+1 tokens over scoring 1 (near 1 on accelerators at small batch)."""
    return self.target_score_s / self.target_step_s

  def predicted_speedup(self, alpha: float) -> float:
    return predicted_speedup(
      alpha, self.num_draft_tokens, self.target_step_s, self.draft_step_s, self.target_score_s
    )

  def predicted_from_tokens_per_call(self, tokens_per_call: float) -> float:
    """The speedup these costs give at a measured tokens per target call (trees)."""
    iteration_s = self.num_draft_tokens * self.draft_step_s + self.target_score_s
    return tokens_per_call * self.target_step_s / iteration_s


def iteration_tokens(alpha: float, num_draft_tokens: int) -> np.ndarray:
  """P(an iteration appends j + 1 tokens), j = 0..K, with i.i.d. acceptance ``alpha``: the
  first rejection at position j + 1 (or all K accepted, plus the bonus token)."""
  if not 0 <= alpha <= 1:
    raise ValueError(f"alpha must be in [0, 1], got {alpha}.")
  accepted_first = alpha ** np.arange(num_draft_tokens + 1)
  probs = accepted_first * (1 - alpha)
  probs[-1] = alpha**num_draft_tokens
  return probs


def slowest_row_iterations(
  row_alphas: Sequence[float], num_draft_tokens: int, max_new_tokens: int
) -> float:
  """Expected iterations of a batched call: the loop runs until its slowest row has
  ``max_new_tokens``, each row with its own i.i.d. acceptance (rows independent).

  Exactly, by dynamic programming over each row's tokens so far (capped at N): with
  ``done_r(n) = P(row r has N tokens after n iterations)``, E[max_r T_r] =
  sum_{n >= 0} (1 - prod_r done_r(n)). One row at alpha = 0 needs N; every row at alpha = 1
  needs ceil(N / (K + 1)).
  """
  n_max = int(max_new_tokens)
  if n_max < 1 or not len(row_alphas):
    raise ValueError("Needs max_new_tokens >= 1 and at least one row.")
  all_done = np.ones(n_max + 1)
  for alpha in row_alphas:
    probs = iteration_tokens(float(alpha), num_draft_tokens)
    tokens = np.zeros(n_max + 1)
    tokens[0] = 1.0
    done = [0.0]
    for _ in range(n_max):  # Every iteration appends >= 1 token: N iterations finish a row.
      after = np.zeros(n_max + 1)
      after[n_max] = tokens[n_max]
      for j, p in enumerate(probs):
        step = j + 1
        after[step:n_max] += p * tokens[: n_max - step]
        after[n_max] += p * tokens[max(n_max - step, 0) : n_max].sum()
      tokens = after
      done.append(tokens[n_max])
    all_done *= np.asarray(done)
  return float((1.0 - all_done[:-1]).sum())


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


def choose_draft_length(predictions: dict[int, float], min_speedup: float = 1.05) -> int:
  """The automatic draft length: the K with the best predicted speedup among
  ``predictions`` (K -> speedup; 0 is autoregressive, 1.0), or 0 when none is predicted at
  least ``min_speedup`` (a margin for what the prediction leaves out); ties go to the
  smaller K."""
  if any(k < 0 for k in predictions):
    raise ValueError(f"Draft lengths must be >= 0, got {sorted(predictions)}.")
  predictions = {0: 1.0, **predictions}
  best = max(predictions, key=lambda k: (predictions[k], -k))
  return best if predictions[best] >= min_speedup else 0
