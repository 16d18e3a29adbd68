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

from specsamp.sampling.draft_length import choose as choose_draft_length  # noqa: F401
from specsamp.sampling.draft_length import (  # noqa: F401 (re-exported)
  expected_tokens_per_call,
  iteration_tokens,
  predicted_batch_speedup,
  predicted_speedup,
  slowest_row_iterations,
)


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

  def predicted_batch_speedup(self, row_alphas, max_new_tokens: int) -> float:
    """``predicted_speedup`` for a call of ``max_new_tokens`` per row: the loop pays its
    slowest row's iterations, each row at its own alpha (at batch 1, the last iterations
    max_new_tokens cuts short)."""
    return predicted_batch_speedup(
      row_alphas,
      self.num_draft_tokens,
      max_new_tokens,
      self.target_step_s,
      self.draft_step_s,
      self.target_score_s,
    )

  def predicted_from_tokens_per_call(self, tokens_per_call: float) -> float:
    """The speedup these costs give at a measured tokens per target call (trees)."""
    iteration_s = self.num_draft_tokens * self.draft_step_s + self.target_score_s
    return tokens_per_call * self.target_step_s / iteration_s
