"""The verification math against float64 NumPy references and exact enumeration."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsamp.sampling import verification, warping


def _random_dists(rng, shape, sparsity=0.3):
  x = rng.random(shape) ** 3
  x[rng.random(shape) < sparsity] = 0.0  # zeros, as top-k / top-p leave them
  x[..., 0] += 1e-3  # never an all-zero row
  return x / x.sum(-1, keepdims=True)


def _case(seed, batch=64, num_draft_tokens=4, vocab=7):
  rng = np.random.default_rng(seed)
  q = _random_dists(rng, (batch, num_draft_tokens, vocab))
  p = _random_dists(rng, (batch, num_draft_tokens + 1, vocab))
  tokens = np.array(
    [[rng.choice(vocab, p=q[b, t]) for t in range(num_draft_tokens)] for b in range(batch)]
  )
  return tokens, q, p


def test_acceptance_probabilities_match_float64():
  tokens, q, p = _case(0)
  expected = np.array(
    [[min(1.0, p[b, t, x] / q[b, t, x]) for t, x in enumerate(row)] for b, row in enumerate(tokens)]
  )
  got = verification.acceptance_probabilities(
    jnp.asarray(tokens), jnp.asarray(q, jnp.float32), jnp.asarray(p, jnp.float32)
  )
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_acceptance_guards_q_zero():
  q = jnp.array([[[0.0, 1.0]], [[0.0, 1.0]]])
  p = jnp.array([[[0.5, 0.5], [1.0, 0.0]], [[0.0, 1.0], [1.0, 0.0]]])
  got = verification.acceptance_probabilities(jnp.array([[0], [0]]), q, p)
  np.testing.assert_array_equal(got, [[1.0], [0.0]])


def test_residual_matches_float64_and_falls_back_to_p():
  _, q, p = _case(1)
  p_BV, q_BV = p[:, 0], q[:, 0]
  mass = np.maximum(p_BV - q_BV, 0.0)
  expected = mass / mass.sum(-1, keepdims=True)
  np.testing.assert_allclose(
    verification.residual(jnp.asarray(p_BV, jnp.float32), jnp.asarray(q_BV, jnp.float32)),
    expected,
    rtol=1e-5,
    atol=1e-6,
  )
  same = jnp.asarray(p_BV[:3], jnp.float32)
  np.testing.assert_allclose(verification.residual(same, same), same)


def _block_reference(tokens, q, p):
  """float64 NumPy block verification quantities: w_0..w_K and h_1..h_K."""
  batch, num_draft_tokens = tokens.shape
  w = np.ones((batch, num_draft_tokens + 1))
  h = np.zeros((batch, num_draft_tokens))
  for b in range(batch):
    for i in range(1, num_draft_tokens + 1):
      x = tokens[b, i - 1]
      w[b, i] = min(1.0, w[b, i - 1] * p[b, i - 1, x] / q[b, i - 1, x])
    for i in range(1, num_draft_tokens):
      m = np.maximum(w[b, i] * p[b, i] - q[b, i], 0.0).sum()
      h[b, i - 1] = m / (m + 1.0 - w[b, i]) if m > 0 else 0.0
    h[b, -1] = w[b, -1]
  return w, h


def test_block_weights_and_stop_probabilities_match_float64():
  tokens, q, p = _case(2)
  w_ref, h_ref = _block_reference(tokens, q, p)
  q32, p32 = jnp.asarray(q, jnp.float32), jnp.asarray(p, jnp.float32)
  w = verification.block_weights(jnp.asarray(tokens), q32, p32)
  np.testing.assert_allclose(w, w_ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(
    verification.block_stop_probabilities(w, q32, p32), h_ref, rtol=1e-4, atol=1e-6
  )


def _enumerated(seed, vocab=4, num_draft_tokens=3):
  """Every draft block with its probability, and context-dependent p and q for it."""
  rng = np.random.default_rng(seed)
  tables = {}

  def dist(kind, context):
    if (kind, context) not in tables:
      tables[kind, context] = _random_dists(rng, (vocab,), sparsity=0.2)
      if kind == "p":  # a target that overlaps the draft, as a useful draft does
        tables[kind, context] = 0.5 * tables[kind, context] + 0.5 * dist("q", context)
    return tables[kind, context]

  drafts = np.array(list(itertools.product(range(vocab), repeat=num_draft_tokens)))
  q = np.array([[dist("q", tuple(d[:t])) for t in range(num_draft_tokens)] for d in drafts])
  p = np.array([[dist("p", tuple(d[:t])) for t in range(num_draft_tokens + 1)] for d in drafts])
  prob = np.prod(
    [q[np.arange(len(drafts)), t, drafts[:, t]] for t in range(num_draft_tokens)], axis=0
  )
  return drafts, q, p, prob


@pytest.mark.parametrize("seed", range(5))
def test_block_accepts_at_least_as_many_tokens_as_token_wise(seed):
  """Exact expectations over every draft block (Sun et al. 2024, Theorem 2)."""
  drafts, q, p, prob = _enumerated(seed)
  q32, p32, d = jnp.asarray(q, jnp.float32), jnp.asarray(p, jnp.float32), jnp.asarray(drafts)
  a = np.asarray(verification.acceptance_probabilities(d, q32, p32), np.float64)
  token_expected = (prob * np.cumprod(a, axis=1).sum(1)).sum()
  h = np.asarray(
    verification.block_stop_probabilities(verification.block_weights(d, q32, p32), q32, p32),
    np.float64,
  )
  num_draft_tokens = drafts.shape[1]
  # P(tau = i) = h_i * prod_{j > i} (1 - h_j)
  later_miss = np.concatenate(
    [np.cumprod((1 - h)[:, ::-1], axis=1)[:, ::-1][:, 1:], np.ones((len(h), 1))], axis=1
  )
  block_expected = (prob * (h * later_miss * np.arange(1, num_draft_tokens + 1)).sum(1)).sum()
  assert block_expected >= token_expected - 1e-6
  assert token_expected > 0.3  # a non-trivial case


def test_token_and_block_reduce_to_greedy_on_one_hot_distributions():
  rng = np.random.default_rng(3)
  batch, num_draft_tokens, vocab = 32, 4, 5
  target_logits = jnp.asarray(rng.normal(size=(batch, num_draft_tokens + 1, vocab)), jnp.float32)
  best = np.argmax(np.asarray(target_logits), -1)
  # Drafts agree with the target's argmax on a random prefix, then differ.
  tokens = best[:, :-1].copy()
  for b in range(batch):
    cut = rng.integers(0, num_draft_tokens + 1)
    if cut < num_draft_tokens:
      tokens[b, cut] = (tokens[b, cut] + 1) % vocab
  tokens = jnp.asarray(tokens)
  q = jax.nn.one_hot(tokens, vocab)
  p = warping.probabilities(target_logits, warping.SamplingConfig(temperature=0))
  np.testing.assert_array_equal(p, jax.nn.one_hot(best, vocab))
  greedy = jax.jit(verification.greedy_verify)(jax.random.key(0), tokens, q, p)
  for verify in (verification.token_verify, verification.block_verify):  # Each one program.
    verdict = jax.jit(verify)(jax.random.key(0), tokens, q, p)
    np.testing.assert_array_equal(verdict.num_accepted, greedy.num_accepted)
    np.testing.assert_array_equal(verdict.next_token, greedy.next_token)
  assert len(set(np.asarray(greedy.num_accepted).tolist())) > 2


@pytest.mark.parametrize("name", ["token", "block", "argmax", "synthetic"])
def test_q_none_verifies_as_the_one_hot_q_bit_for_bit(name):
  """Chosen tokens carry q = None, the point mass at each token: every verifier gives the
  verdicts the explicit one-hot q gives, on full and on shorter proposals."""
  verify = (
    verification.synthetic_verifier(0.6) if name == "synthetic" else verification.VERIFIERS[name]
  )
  run = jax.jit(verify)
  rng = np.random.default_rng(5)
  accepted = []
  for seed in range(6):
    tokens, _, p = _case(seed, batch=64, num_draft_tokens=4, vocab=7)
    # Drafts that agree with the target's likely tokens often, so some runs are accepted.
    likely = np.argmax(p[:, :-1] + 0.3 * rng.random(p[:, :-1].shape), -1)
    tokens = np.where(rng.random(tokens.shape) < 0.7, likely, tokens).astype(np.int32)
    one_hot = jax.nn.one_hot(tokens, 7, dtype=jnp.float32)
    p32 = jnp.asarray(p, jnp.float32)
    for num_proposed in (None, jnp.asarray(rng.integers(0, 5, 64), jnp.int32)):
      key = jax.random.key(seed)
      want = run(key, jnp.asarray(tokens), one_hot, p32, num_proposed)
      got = run(key, jnp.asarray(tokens), None, p32, num_proposed)
      np.testing.assert_array_equal(got.num_accepted, want.num_accepted)
      np.testing.assert_array_equal(got.next_token, want.next_token)
      accepted += np.asarray(got.num_accepted).tolist()
  assert set(accepted) == set(range(5))  # Every outcome, from none accepted to all four.
