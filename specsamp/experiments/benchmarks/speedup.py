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


def choose_draft_length(
  alpha: float,
  target_step_s: float,
  draft_step_s: float,
  score_s: dict[int, float],
  min_speedup: float = 1.05,
) -> tuple[int, dict[int, float]]:
  """The automatic draft length: the K of ``score_s`` (K -> seconds to score K + 1 tokens)
  with the best predicted speedup at acceptance ``alpha``, or 0 (autoregressive sampling)
  when none is predicted at least ``min_speedup`` (a margin for what the model leaves out).

  Returns:
    (K, {K: predicted speedup}), with 0 -> 1.0 among the predictions.
  """
  predictions = {0: 1.0}
  for k, seconds in sorted(score_s.items()):
    if k < 1:
      raise ValueError(f"Candidate draft lengths must be >= 1, got {k}.")
    predictions[k] = predicted_speedup(alpha, k, target_step_s, draft_step_s, seconds)
  best = max(predictions, key=lambda k: (predictions[k], -k))
  return (best if predictions[best] >= min_speedup else 0), predictions
