"""The automatic draft length (specsamp/sampling/draft_length.py): pure functions, no models."""

import math

import numpy as np
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
  # An iteration whose cost more than doubles from K = 2 to 4 (timing noise): the free line
  # crossed zero before K = 1, whose prediction was 6e15x or negative. The fit with a fixed
  # cost >= 0 is the line through the origin: 0.01 s at K = 2, 0.032 at 4 -> (2*.01 + 4*.032) / 20.
  steep = [draft_length.Probe(2, 1.0, 100), draft_length.Probe(4, 1.6, 50)]
  origin = draft_length.IterationCost.fit(steep)
  assert origin.fixed_s == 0 and math.isclose(origin.per_draft_token_s, 0.148 / 20)
  assert all(origin(k) > 0 for k in range(1, 9))


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
  # A row measured at K = 6 with i.i.d. acceptance 0.8: its histogram is the formula's law.
  iid = 1000 * draft_length.iteration_tokens(0.8, 6)
  predicted = draft_length.predict_speedups([iid], 64, ar_s, cost, range(0, 7))
  assert predicted[0] == 1.0 and set(predicted) == set(range(7))
  for k in range(1, 7):
    iterations = draft_length.slowest_row_iterations([0.8], k, 64)
    assert math.isclose(predicted[k], ar_s / (iterations * (0.003 + 0.0005 * k)))
  chosen = draft_length.choose(predicted)
  assert predicted[chosen] == max(predicted.values()) and chosen > 0
  # A draft that is never accepted never pays: autoregressive.
  useless = draft_length.predict_speedups([[50, 0, 0, 0, 0, 0, 0]], 64, ar_s, cost, range(1, 7))
  assert draft_length.choose(useless) == 0
  # K beyond the measured histogram cannot be predicted from it.
  with pytest.raises(ValueError, match="measured range"):
    draft_length.predict_speedups([iid], 64, ar_s, cost, [7])
  # A negative K was -2.81 tokens per call, or an IndexError (2026-11-30).
  for law in (draft_length.expected_tokens_per_call, draft_length.iteration_tokens):
    for k in (-3, 1.5):
      with pytest.raises(ValueError, match="num_draft_tokens must be an int >= 0"):
        law(0.8, k)
  assert draft_length.expected_tokens_per_call(0.8, 0) == 1.0


def test_predictions_are_scaled_to_what_the_probes_measured():
  # SmolLM2 at T=0.8, feature+lookup (2026-12-01): modelled K=4 1.06x, measured 0.96x there and
  # 1.01x at K=2; unscaled the choice was K=4, which ran at 0.88x.
  modelled = {0: 1.0, 1: 0.93, 2: 1.04, 3: 1.05, 4: 1.06}
  assert draft_length.choose(modelled) == 4
  scaled = draft_length.calibrated(modelled, {2: 1.01, 4: 0.96})
  assert scaled[0] == 1.0 and set(scaled) == set(modelled)
  assert math.isclose(scaled[2], 1.01) and math.isclose(scaled[4], 0.96)
  # Between the probes the ratio is interpolated in K; below them the nearest probe's ratio.
  between = (1.01 / 1.04 + 0.96 / 1.06) / 2
  assert math.isclose(scaled[3], 1.05 * between)
  assert math.isclose(scaled[1], 0.93 * 1.01 / 1.04)
  assert draft_length.choose(scaled) == 0
  # Beyond the largest probe (a prediction past it): that probe's ratio.
  beyond = draft_length.calibrated({1: 1.2, 2: 1.5, 3: 1.8}, {1: 1.3, 2: 1.2})
  assert math.isclose(beyond[3], 1.8 * 1.2 / 1.5)
  # One probe (largest K = 1): the one ratio everywhere.
  assert draft_length.calibrated({0: 1.0, 1: 2.0}, {1: 1.5}) == {0: 1.0, 1: 1.5}
  # A model that agrees with the probes is left as it was.
  agree = {1: 1.3, 2: 1.6, 3: 1.7, 4: 1.75}
  assert all(
    math.isclose(v, agree[k]) for k, v in draft_length.calibrated(agree, {2: 1.6, 4: 1.75}).items()
  )
  for measured, message in [
    ({}, "measured speedups at predicted K"),
    ({5: 1.0}, "measured speedups at predicted K"),
    ({0: 1.0}, "measured speedups at predicted K"),
    ({2: 0.0}, "must be finite and > 0"),
    ({2: float("nan")}, "must be finite and > 0"),
    ({2: float("inf")}, "must be finite and > 0"),
  ]:
    with pytest.raises(ValueError, match=message):
      draft_length.calibrated(modelled, measured)


def test_the_choice_from_probes_reads_the_scaled_predictions():
  # One row at i.i.d. acceptance 0.56 measured at K = 4; 48 new tokens at 30 ms a step.
  histogram = [1000 * draft_length.iteration_tokens(0.56, 4)]
  ar_s, n = 48 * 0.03, 48
  expected = {
    k: draft_length.iterations_until_done([draft_length.truncated(histogram[0], k)], n)
    for k in (2, 4)
  }
  # The probes counted 12% more iterations than expected at K = 4 and measured 1.01x (K = 2)
  # and 0.96x (K = 4): the model (the same cost line) reads 1.075x at K = 4 and chooses it.
  probes = [
    draft_length.Probe(2, seconds=ar_s / 1.01, iterations=expected[2]),
    draft_length.Probe(4, seconds=ar_s / 0.96, iterations=1.12 * expected[4]),
  ]
  choice = draft_length.choose_from_probes(ar_s, probes, histogram, n, largest=4)
  assert set(choice.predicted) == set(choice.modelled) == {0, 1, 2, 3, 4}
  assert math.isclose(choice.modelled[4], 0.96 * 1.12)
  assert draft_length.choose(choice.modelled) == 4
  for probe in probes:
    assert math.isclose(choice.predicted[probe.num_draft_tokens], ar_s / probe.seconds)
  assert choice.num_draft_tokens == draft_length.choose(choice.predicted) == 0
  assert choice.cost == draft_length.IterationCost.fit(probes)
  # One probe (the largest K is 1): its own cost per iteration, and its measured speedup.
  one = draft_length.Probe(1, seconds=ar_s / 1.3, iterations=30)
  single = draft_length.choose_from_probes(ar_s, [one], histogram, n, largest=1)
  assert single.cost.per_draft_token_s == 0 and math.isclose(single.cost(1), one.seconds / 30)
  assert math.isclose(single.predicted[1], 1.3) and single.num_draft_tokens == 1


def test_a_histogram_truncates_to_a_shorter_draft():
  # i.i.d. acceptance: truncating the law at K_max gives the law at K, for every K.
  for k in range(0, 7):
    law = draft_length.truncated(draft_length.iteration_tokens(0.7, 6), k)
    assert np.allclose(law, draft_length.iteration_tokens(0.7, k)), k
  # Runs of easy tokens: every iteration accepts none or all 4 drafts (alpha 0.5 over the
  # drafts). The formula at alpha 0.5 gives K=2 1.75 tokens per iteration; truncation gives
  # 0.5 * 1 + 0.5 * 3 = 2, as a loop at K = 2 would append.
  runs = draft_length.truncated([5, 0, 0, 0, 5], 2)
  assert runs.tolist() == [0.5, 0.0, 0.5]
  assert math.isclose(float(runs @ np.arange(1, 4)), 2.0)
  assert math.isclose(draft_length.expected_tokens_per_call(0.5, 2), 1.75)
  # One row: the iterations to 64 tokens are 64 over the tokens per iteration, plus the last
  # iteration's overshoot.
  one = draft_length.iterations_until_done([runs], 64)
  assert 64 / 2 <= one < 64 / 2 + 1
  for bad, message in [([0, 0, 0], "with iterations"), ([1, -1, 2], "with iterations")]:
    with pytest.raises(ValueError, match=message):
      draft_length.truncated(bad, 1)
  with pytest.raises(ValueError, match="measured range"):
    draft_length.truncated([1, 2, 3], 3)


def test_the_probed_lengths():
  assert draft_length.probe_lengths(1) == (1,)
  assert draft_length.probe_lengths(2) == (1, 2)
  assert draft_length.probe_lengths(4) == (2, 4)
  assert draft_length.probe_lengths(7) == (4, 7)
  with pytest.raises(ValueError, match="largest K >= 1"):
    draft_length.probe_lengths(0)
