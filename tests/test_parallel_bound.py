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


def test_a_tree_of_iid_siblings_is_the_enumerated_recursive_rejection():
  """Widths (1, 3): depth 2 tries three i.i.d. draws from m_2 against the residuals of
  recursive rejection; enumerated exactly: P(accept) = sum_j prod_{i<j} (1 - a_i) a_j, with
  a_j = sum_x min(m_2, r_j) and r_{j+1} = norm(max(0, r_j - m_2))."""
  target = certify.make_setup("trigram", "1").target
  sampling = warping.SamplingConfig(1.0)
  logits = np.asarray(target.logits_PVV)
  table = np.asarray(
    warping.probabilities(logits.reshape(-1, logits.shape[1]), sampling), np.float64
  ).reshape(logits.shape)
  p1 = table[CONTEXT[-2], CONTEXT[-1]]
  m2 = sum(p1[x] * table[CONTEXT[-1], x] for x in range(len(p1)))
  exact = 2.0
  for x1, weight in enumerate(p1):
    r, missed = table[CONTEXT[-1], x1], 1.0
    for _ in range(3):
      accept = np.minimum(m2, r).sum()
      exact += weight * missed * accept
      missed *= 1 - accept
      excess = np.maximum(r - m2, 0)
      r = excess / excess.sum() if excess.sum() > 0 else excess
  got = parallel_bound.marginal_tree(
    target, CONTEXT, (1, 3), sampling, jax.random.key(2), paths=8192, chains=8192
  )
  # The coins are drawn: standard error below 0.5 / sqrt(8192) = 0.0055.
  assert abs(got["tokens_per_call"] - exact) < 0.03, (got["tokens_per_call"], exact)
  assert got["nodes"] == 4
  chain = parallel_bound.marginal_drafter(
    target, CONTEXT, 2, sampling, jax.random.key(2), paths=8192, chains=8192
  )
  assert exact > chain["tokens_per_call"] + 0.05  # Three siblings hedge over one.
  # Widths of 1 are the chain, whose coins marginal_drafter integrates out.
  one = parallel_bound.marginal_tree(
    target, CONTEXT, (1, 1, 1), sampling, jax.random.key(3), paths=8192, chains=8192
  )
  three = parallel_bound.marginal_drafter(
    target, CONTEXT, 3, sampling, jax.random.key(3), paths=8192, chains=8192
  )
  assert abs(one["tokens_per_call"] - three["tokens_per_call"]) < 0.04


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
  with pytest.raises(ValueError, match="widths must be"):
    parallel_bound.marginal_tree(target, CONTEXT, (1, 0), sampling, jax.random.key(0))
  with pytest.raises(ValueError, match="must have num_draft_tokens=3 depths"):
    parallel_bound.over_contexts(target, [CONTEXT], 3, sampling, widths=(1, 2))
