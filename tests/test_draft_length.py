"""The automatic draft length (specsamp/sampling/draft_length.py): pure functions, no models."""

import math

import pytest

from specsamp.sampling import draft_length


def test_the_iteration_cost_is_a_line_through_the_probed_loops():
  # A loop whose iteration costs 3 ms + 0.5 ms per draft token, probed at K = 2 and 4.
  probes = [
    draft_length.Probe(2, seconds=0.004 * 30, iterations=30),
    draft_length.Probe(4, seconds=0.005 * 20, iterations=20),
  ]
  cost = draft_length.IterationCost.fit(probes)
  assert math.isclose(cost.fixed_s, 0.003) and math.isclose(cost.per_draft_token_s, 0.0005)
  assert math.isclose(cost(3), 0.0045)
  # Noise that makes a longer draft look cheaper is read as no cost per draft token.
  noisy = [draft_length.Probe(2, 0.12, 30), draft_length.Probe(4, 0.07, 20)]
  flat = draft_length.IterationCost.fit(noisy)
  assert flat.per_draft_token_s == 0 and math.isclose(flat.fixed_s, (0.004 + 0.0035) / 2)


@pytest.mark.parametrize(
  "probes, message",
  [
    ([draft_length.Probe(4, 0.1, 20)], "two draft lengths"),
    ([draft_length.Probe(4, 0.1, 20), draft_length.Probe(4, 0.1, 21)], "two draft lengths"),
    ([draft_length.Probe(2, 0.1, 0), draft_length.Probe(4, 0.1, 20)], "positive"),
  ],
)
def test_a_cost_cannot_be_fitted_to_less_than_two_lengths(probes, message):
  with pytest.raises(ValueError, match=message):
    draft_length.IterationCost.fit(probes)


def test_predictions_follow_the_formula_and_the_choice_takes_the_best():
  cost = draft_length.IterationCost(fixed_s=0.003, per_draft_token_s=0.0005)
  ar_s = 64 * 0.0025  # 64 autoregressive steps of 2.5 ms.
  predicted = draft_length.predict_speedups([0.8], 64, ar_s, cost, range(0, 7))
  assert predicted[0] == 1.0 and set(predicted) == set(range(7))
  for k in range(1, 7):
    iterations = draft_length.slowest_row_iterations([0.8], k, 64)
    assert math.isclose(predicted[k], ar_s / (iterations * (0.003 + 0.0005 * k)))
  chosen = draft_length.choose(predicted)
  assert predicted[chosen] == max(predicted.values()) and chosen > 0
  # A draft that is never accepted never pays: autoregressive.
  useless = draft_length.predict_speedups([0.0], 64, ar_s, cost, range(1, 7))
  assert draft_length.choose(useless) == 0


def test_the_probed_lengths():
  assert draft_length.probe_lengths(1) == (1,)
  assert draft_length.probe_lengths(2) == (1, 2)
  assert draft_length.probe_lengths(4) == (2, 4)
  assert draft_length.probe_lengths(7) == (4, 7)
  with pytest.raises(ValueError, match="largest K >= 1"):
    draft_length.probe_lengths(0)
