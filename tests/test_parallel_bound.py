"""The target-marginal parallel drafter (experiments/benchmarks/parallel_bound.py): its tokens per
call against an exact enumeration, and the cases where it is exact by construction."""

import itertools

import jax
import numpy as np
import pytest
from conftest import tiny_config

from specsamp.experiments.benchmarks import parallel_bound
from specsamp.experiments.proofs import certify
from specsamp.models import transformer
from specsamp.sampling import warping

CONTEXT = (3, 6, 1, 3)


def _exact_tokens_per_call(logits_PVV: np.ndarray, context, sampling, num_draft_tokens: int):
  """Enumerated over every draft chain: the marginal drafter's expected tokens per call."""
  vocab = logits_PVV.shape[1]
  # The warped law after every (previous, current) pair, in one call.
  table = np.asarray(
    warping.probabilities(logits_PVV.reshape(-1, vocab), sampling), np.float64
  ).reshape(logits_PVV.shape)

  def law(prefix):  # p(. | context, prefix)
    tokens = (*context, *prefix)
    return table[tokens[-2], tokens[-1]]

  # m_k: the mean of p(. | context, y_<k) over the target's own y_<k.
  marginals = []
  for k in range(num_draft_tokens):
    m = np.zeros(vocab)
    for prefix in itertools.product(range(vocab), repeat=k):
      weight = np.prod([law(prefix[:i])[prefix[i]] for i in range(k)])
      m += weight * law(prefix)
    marginals.append(m)
  expected = 1.0
  for chain in itertools.product(range(vocab), repeat=num_draft_tokens):
    weight = np.prod([marginals[k][chain[k]] for k in range(num_draft_tokens)])
    if weight == 0:
      continue
    reached = 1.0
    for k in range(num_draft_tokens):
      reached *= min(1.0, law(chain[:k])[chain[k]] / marginals[k][chain[k]])
      expected += weight * reached
  return expected


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.8, 0.9)])
def test_tokens_per_call_are_the_enumerated_marginal_drafters(temperature, top_p):
  target = certify.make_setup("trigram", "1").target
  sampling = warping.SamplingConfig(temperature, top_p=top_p)
  exact = _exact_tokens_per_call(np.asarray(target.logits_PVV), CONTEXT, sampling, 3)
  got = parallel_bound.marginal_drafter(
    target, CONTEXT, 3, sampling, jax.random.key(0), paths=8192, chains=8192
  )
  # Standard error of the chains' mean below 0.5 / sqrt(8192) = 0.0055 per position.
  assert abs(got["tokens_per_call"] - exact) < 0.03, (got["tokens_per_call"], exact)
  assert exact < 3.5  # The drafts' dependence costs acceptance: the intrinsic loss is there.
  assert got["accepted"][0] == pytest.approx(1.0)  # m_1 is the target's own law.
  np.testing.assert_allclose(got["marginals"].sum(axis=1), 1.0, rtol=1e-5)


def test_a_deterministic_target_and_one_draft_are_always_accepted():
  """Greedy: m_k is the one-hot of the target's greedy path, so every draft is accepted; and
  K = 1 drafts from m_1 = p itself."""
  model = transformer.create(tiny_config(), seed=0)
  greedy = parallel_bound.over_contexts(
    model, [[5, 9, 14], [8, 8, 31, 2, 7]], 4, warping.SamplingConfig(0.0), paths=4, chains=4
  )
  assert greedy["tokens_per_call"] == 5.0 and greedy["accepted"] == [1.0] * 4
  one = parallel_bound.marginal_drafter(
    model, [5, 9, 14], 1, warping.SamplingConfig(1.0), jax.random.key(1)
  )
  assert one["tokens_per_call"] == pytest.approx(2.0)
  sampled = parallel_bound.marginal_drafter(
    model, [5, 9, 14], 4, warping.SamplingConfig(1.0), jax.random.key(1)
  )
  assert 2.0 < sampled["tokens_per_call"] < 5.0
  assert np.all(np.diff(sampled["accepted"]) <= 0)  # Reaching position k needs k - 1 accepted.


def test_bad_arguments_are_clear_errors():
  target = certify.make_setup("trigram", "1").target
  sampling = warping.SamplingConfig(1.0)
  with pytest.raises(ValueError, match="num_draft_tokens must be >= 1"):
    parallel_bound.marginal_drafter(target, CONTEXT, 0, sampling, jax.random.key(0))
  with pytest.raises(ValueError, match="at least one token"):
    parallel_bound.marginal_drafter(target, (), 2, sampling, jax.random.key(0))
  with pytest.raises(ValueError, match="paths and chains"):
    parallel_bound.marginal_drafter(target, CONTEXT, 2, sampling, jax.random.key(0), paths=0)
