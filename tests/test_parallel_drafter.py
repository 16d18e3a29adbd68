"""The parallel drafter (PARD style, specsamp/sampling/parallel_drafter.py): the call's layout,
its q against plain forward passes, exactness under sampling against enumeration, greedy
identity, one draft call per iteration, and a wrong-position q rejected."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_follows, sampled_counts, tiny_config

from specsamp.models import transformer
from specsamp.sampling import generate, speculative_generate, warping
from specsamp.sampling import tree as tree_lib
from specsamp.sampling.parallel_drafter import ParallelDrafter, window
from specsamp.testing import exactness

MASK = 7  # The exact pair's 8-token vocabulary: its last row stands in for the placeholder.
EXACT_PROMPT = np.array([3, 6, 3])


def test_the_window_refeeds_k_plus_one_committed_tokens_then_k_minus_one_placeholders():
  tokens = jnp.asarray([[10, 11, 12, 13, 14, 15, 0], [20, 21, 0, 0, 0, 0, 0]])
  lengths = jnp.asarray([6, 2])
  ids, positions = window(tokens, lengths, 3, mask_token_id=99)
  np.testing.assert_array_equal(ids, [[12, 13, 14, 15, 99, 99], [20, 20, 20, 21, 99, 99]])
  np.testing.assert_array_equal(positions, [[2, 3, 4, 5, 6, 7], [0, 0, 0, 1, 2, 3]])


@pytest.mark.slow
def test_each_q_is_the_models_distribution_after_the_committed_tokens_and_placeholders(
  small_pair,
):
  """Over iterations with different accepted counts, q_k from the cached call equals a plain
  forward pass over the committed tokens and k - 1 placeholders: the re-fed window and the
  stale placeholder entries never make the cache disagree with the sequence."""
  _, draft = small_pair
  drafter = ParallelDrafter(draft, mask_token_id=MASK)
  K, width = 3, 24
  rng = np.random.default_rng(0)
  sequence = rng.integers(0, MASK, size=(1, width))
  n = 4
  state, _ = drafter.init(jnp.asarray(sequence[:, :n]), jnp.asarray([n]), width + K, K)
  sampling = warping.SamplingConfig(1.0)
  # Both compiled once: the reference pads every prefix to one width (a causal model's output
  # at a position does not see what follows it).
  propose = jax.jit(drafter.propose, static_argnums=(4, 6, 7))
  forward = jax.jit(lambda tokens: jax.nn.softmax(draft(tokens)[0], axis=-1))
  for accepted in (0, 3, 1, 2, 3):
    proposal, state = propose(
      state,
      jnp.asarray(sequence),
      jnp.asarray([n]),
      jax.random.key(n),
      K,
      jnp.asarray([K]),
      sampling,
      8,
    )
    for k in range(K):
      tokens = np.concatenate([sequence[:, :n], np.full((1, k), MASK)], axis=1)
      padded = np.pad(tokens, ((0, 0), (0, width + K - tokens.shape[1])))
      probs = forward(jnp.asarray(padded))
      np.testing.assert_allclose(
        proposal.probs[0, k], probs[0, tokens.shape[1] - 1], rtol=1e-5, atol=1e-6
      )
    assert int(proposal.model_calls) == 1
    state = drafter.rollback(state, jnp.asarray([n + accepted + 1]))
    n += accepted + 1


# Every q_k comes from one call before any draft is drawn: exact with real q under token,
# block and tree verification (scripts/certify.py certifies the same at 10^6 draws).
# Block verification's and the tree's cases are the extended command's (the suite keeps the
# chain; a parallel draft's tree, with a sequential head, is test_sequential_head.py's).
EXACT_CASES = [  # (verifier, tree, sampling, proposal)
  ("token", None, warping.SamplingConfig(1.0), "sampled"),
  pytest.param(
    "block", None, warping.SamplingConfig(0.7, top_p=0.9), "sampled", marks=pytest.mark.extended
  ),
  pytest.param(
    "traversal", "tree:2,2,1", warping.SamplingConfig(1.0), "sampled", marks=pytest.mark.extended
  ),
]


@pytest.mark.slow
@pytest.mark.parametrize("verifier, tree, sampling, proposal", EXACT_CASES)
def test_samples_follow_the_exact_target_distribution(
  small_pair, verifier, tree, sampling, proposal
):
  target, draft = small_pair
  counts, stats = sampled_counts(
    target,
    ParallelDrafter(draft, mask_token_id=MASK, proposal=proposal),
    EXACT_PROMPT,
    num_draft_tokens=3,
    tree=None if tree is None else tree_lib.parse(tree),
    temperature=sampling.temperature,
    top_p=sampling.top_p,
    verifier=verifier,
  )
  assert 0.05 < stats["acceptance_rate"] < 0.98, stats
  assert stats["draft_calls"] == stats["target_calls"]  # one draft call per iteration
  assert_follows(counts, target, EXACT_PROMPT, sampling)


# The suite rejects this planted bug (parallel_wrong_q) in tests/test_certify.py's certificate;
# this enumeration run of the same bug is the extended command's.
@pytest.mark.slow
@pytest.mark.extended
def test_a_q_from_the_wrong_position_is_rejected(small_pair):
  target, draft = small_pair
  sampling = warping.SamplingConfig(1.0)
  with exactness.planted("parallel_wrong_q"):
    counts, _ = sampled_counts(
      target, ParallelDrafter(draft, mask_token_id=MASK), EXACT_PROMPT, num_draft_tokens=3
    )
  probs = exactness.exact_distribution(target, tuple(EXACT_PROMPT), sampling, 3)
  assert exactness.g_test(counts, probs, 1e-3)["rejected"]


PROMPTS = np.array([[5, 9, 14, 5, 9, 7, 40], [8, 8, 31, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0]])
LENGTHS = np.array([7, 3, 1])


def _greedy_identity(target, drafter, tree):
  """Greedy speculative sampling with ``drafter`` (a chain, or the ``tree`` spec) gives the
  greedy autoregressive tokens; returns the speculative run's statistics."""
  ar = generate(target, PROMPTS, LENGTHS, jax.random.key(0), max_new_tokens=13, temperature=0)
  out = speculative_generate(
    target,
    drafter,
    PROMPTS,
    LENGTHS,
    jax.random.key(1),
    max_new_tokens=13,
    num_draft_tokens=3,
    tree=None if tree is None else tree_lib.parse(tree),
    temperature=0,
  )
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ar.tokens))
  return out.summary()


# The dynamic tree is the extended command's: without a head a static and a dynamic tree take
# the same drafter branch (tree:2,1,1 stays), and dynamic growth is test_tree.py's and
# test_feature_drafter.py's.
@pytest.mark.parametrize(
  "tree", [None, "tree:2,1,1", pytest.param("dynamic:3x3", marks=pytest.mark.extended)]
)
def test_greedy_speculative_equals_greedy_autoregressive(tree):
  target = transformer.create(tiny_config(), seed=0)
  proposal = "greedy" if tree and tree.startswith("dynamic") else "sampled"  # chosen tokens
  drafter = ParallelDrafter(
    exactness.noisy_copy(target, 0.1, seed=4), mask_token_id=263, proposal=proposal
  )
  stats = _greedy_identity(target, drafter, tree)
  assert stats["tokens_per_target_call"] > 1.0
  assert stats["draft_calls"] == stats["target_calls"]


def test_a_placeholder_outside_the_vocabulary_is_refused(small_pair):
  target, draft = small_pair
  with pytest.raises(ValueError, match="mask_token_id 8 is not a row"):
    speculative_generate(
      target,
      ParallelDrafter(draft, mask_token_id=8),
      EXACT_PROMPT[None],
      np.array([3]),
      jax.random.key(0),
      max_new_tokens=2,
      num_draft_tokens=2,
    )
  # 2.5 passed the range check and drafted with token 2 (2026-11-30).
  with pytest.raises(ValueError, match="mask_token_id 2.5 is not a row"):
    ParallelDrafter(draft, mask_token_id=2.5).check(target)
  # None given: refused (the default was token 0, a real token of most vocabularies).
  with pytest.raises(ValueError, match="needs mask_token_id: the placeholder token"):
    ParallelDrafter(draft).check(target)


@pytest.mark.slow
def test_the_training_layout_is_what_each_placeholder_sees_when_drafting():
  """Query (m, j) of the one training call equals the draft's logits at the m-th placeholder
  after x_0..x_{j-m}, as a plain forward pass of that sequence computes them."""
  from specsamp.training import parallel

  model = transformer.create(tiny_config(), seed=3)
  K, L = 3, 9
  tokens = np.random.default_rng(1).integers(0, 256, size=(2, L))
  logits_BKLV = parallel.parallel_logits(model, jnp.asarray(tokens), K, mask_token_id=263)
  # One compiled reference: each sequence padded to L + K (causal: the padding is unseen).
  forward = jax.jit(lambda sequence: model(sequence)[0])
  for m in range(K):
    for j in range(m, L):
      sequence = np.concatenate([tokens[:, : j - m + 1], np.full((2, m), 263)], axis=1)
      expected = forward(jnp.asarray(np.pad(sequence, ((0, 0), (0, L + K - sequence.shape[1])))))
      np.testing.assert_allclose(
        logits_BKLV[:, m, j], expected[:, sequence.shape[1] - 1], rtol=2e-4, atol=2e-4
      )


def test_parallel_distillation_lowers_the_kl_at_every_draft_position():
  from flax import nnx

  from specsamp import sharding
  from specsamp.training import train

  target = transformer.create(tiny_config(), seed=0)
  config = train.TrainConfig(
    steps=30,
    batch_size=4,
    seq_len=17,
    learning_rate=1e-2,
    warmup_steps=2,
    distill_mode="parallel",
    distill_parallel_tokens=3,
    distill_mask_token=263,
  )
  mesh = sharding.make_mesh({"data": 1}, jax.devices()[:1])
  trainer = train.Trainer(tiny_config(num_layers=1), config, mesh, teacher=target, seed=1)
  state = trainer.init_state()
  batch = np.random.default_rng(0).integers(0, 256, size=(4, 17))
  state, first = trainer.train_step(state, batch)
  for _ in range(config.steps - 1):
    state, metrics = trainer.train_step(state, batch)
  assert set(first) >= {"kl", "kl_1", "kl_2", "kl_3", "ce"}
  for k in (1, 2, 3):
    assert float(metrics[f"kl_{k}"]) < 0.7 * float(first[f"kl_{k}"]), (k, first, metrics)
  assert np.isfinite(trainer.evaluate(state.params, [batch]))
  assert isinstance(trainer.model(state.params), nnx.Module)


def test_parallel_distillation_needs_a_placeholder():
  from specsamp.training import train

  with pytest.raises(ValueError, match="needs distill.mask_token"):
    train.TrainConfig(
      steps=1,
      batch_size=1,
      seq_len=8,
      learning_rate=1e-3,
      warmup_steps=0,
      distill_mode="parallel",
    )


def test_the_pass_benchmark_times_a_step_and_each_parallel_call(small_pair):
  from specsamp.experiments.benchmarks import parallel_pass

  _, draft = small_pair
  result = parallel_pass.time_pass(
    ParallelDrafter(draft, mask_token_id=MASK), [2, 4], position=12, cache_length=32, calls=2
  )
  assert result["step_ms"] > 0 and set(result["calls"]) == {2, 4}
  for cost in result["calls"].values():
    assert cost["ms"] > 0 and cost["draft_steps"] == pytest.approx(cost["ms"] / result["step_ms"])
  # A width-2K call does more arithmetic than a 1-token step, and more at K=4 than at K=2;
  # it reads the same weights, so its bytes grow far less than its FLOPs.
  calls = result["calls"]
  assert result["step_gflop"] > 0 and result["step_mb"] > 0
  assert result["step_gflop"] < calls[2]["gflop"] < calls[4]["gflop"]
  assert calls[4]["mb"] / result["step_mb"] < calls[4]["gflop"] / result["step_gflop"]


# --- Form (b): a parallel feature head (DFlash / PARD style) on the target's features. --------


def _parallel_head(target, seed=5, **changes):
  from specsamp.models import feature_head
  from specsamp.sampling.feature_drafter import FeatureDrafter

  config = feature_head.FeatureHeadConfig(parallel=True, **changes)
  head = feature_head.create(config, target.config, seed=seed)
  return FeatureDrafter(feature_head.FeatureDraftModel(head, target))


@pytest.mark.slow
def test_a_parallel_heads_q_are_what_training_unrolls_with_placeholders():
  """q_1..q_K from the one call equal the training view (``unrolled(parallel=True)``): the
  last caught-up pair's output, then the placeholders' after it."""
  target = transformer.create(tiny_config(), seed=0)
  drafter = _parallel_head(target)
  head, K, n = drafter.model.head, 3, 9
  tokens = jnp.asarray(np.random.default_rng(2).integers(0, 256, size=(1, n + 4)), jnp.int32)

  @jax.jit  # One program, not an eager run of every operation.
  def drafted_and_unrolled(tokens):
    scored = target(tokens[:, :n], capture_layers=head.config.feature_layers)
    state, _ = drafter.init(tokens[:, :n], jnp.asarray([n]), 32, K, features_BTF=scored.features)
    proposal, _ = drafter.propose(
      state,
      tokens,
      jnp.asarray([n]),
      jax.random.key(0),
      K,
      jnp.asarray([K]),
      warping.SamplingConfig(1.0),
      target.vocab_size,
    )
    embedded = target.embedder.encode(jnp.pad(tokens[:, 1:n], ((0, 0), (0, 1))))
    hidden = head.unrolled(jnp.stack([embedded] * K), head.fuse(scored.features), K, parallel=True)
    expected = [jax.nn.softmax(drafter.model.logits(h[:, n - 2 : n - 1])[0, 0]) for h in hidden]
    return proposal.probs, proposal.model_calls, jnp.stack(expected)

  probs, model_calls, expected = drafted_and_unrolled(tokens)
  assert int(model_calls) == 1
  for k in range(K):
    np.testing.assert_allclose(probs[0, k], expected[k], rtol=1e-4, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize(
  "verifier, tree",
  [("token", None), pytest.param("traversal", "tree:2,2,1", marks=pytest.mark.extended)],
)
def test_a_parallel_heads_samples_follow_the_exact_target_distribution(small_pair, verifier, tree):
  target, _ = small_pair
  counts, stats = sampled_counts(
    target,
    _parallel_head(target),
    EXACT_PROMPT,
    num_draft_tokens=3,
    tree=None if tree is None else tree_lib.parse(tree),
    temperature=1.0,
    verifier=verifier,
  )
  assert 0.05 < stats["acceptance_rate"] < 0.98, stats
  assert stats["draft_calls"] == stats["target_calls"], stats
  assert_follows(counts, target, EXACT_PROMPT, warping.SamplingConfig(1.0))


@pytest.mark.parametrize("tree", [None, "tree:2,1,1"])
def test_a_parallel_heads_greedy_equals_greedy_autoregressive(tree):
  target = transformer.create(tiny_config(), seed=0)
  stats = _greedy_identity(target, _parallel_head(target), tree)
  assert stats["draft_calls"] == stats["target_calls"]


def test_answer_weights_count_each_query_by_the_token_it_predicts():
  """On regenerated answers, query (m, j) counts with the weight of x_{j+1} and only for
  j >= m: the per-position means against a loop over the queries; weights of ones give the
  unweighted loss."""
  from specsamp.training import parallel as parallel_training

  rng = np.random.default_rng(0)
  B, K, L = 2, 3, 7
  loss = rng.random((B, K, L)).astype(np.float32)
  weights = (rng.random((B, L)) < 0.6).astype(np.float32)
  weights[:, -1] = 1.0  # Every segment keeps a counted query.
  position = np.asarray([1.0, 0.5, 0.25], np.float32)
  total, per_K = parallel_training._weighted_position_mean(loss, position, weights)
  expected = []
  for m in range(K):
    picked = [(loss[b, m, j], weights[b, j]) for b in range(B) for j in range(m, L)]
    expected.append(sum(v * w for v, w in picked) / sum(w for _, w in picked))
  np.testing.assert_allclose(per_K, expected, rtol=1e-6)
  np.testing.assert_allclose(total, (position * expected).sum() / position.sum(), rtol=1e-6)
  unweighted = parallel_training._weighted_position_mean(loss, position)
  ones = parallel_training._weighted_position_mean(loss, position, np.ones((B, L), np.float32))
  np.testing.assert_allclose(ones[1], unweighted[1], rtol=1e-6)
