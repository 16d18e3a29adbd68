"""The feature head (EAGLE style): the target's captured features, the head's cache against
its training-time-test unroll, the drafter in the loop (greedy equals autoregressive; the
sampled exactness is the certificate's feature cases, tests/test_certify.py), training, and
the errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from bigram import random_bigram

from specsamp.models import feature_head, transformer
from specsamp.models.config import TransformerConfig
from specsamp.sampling import autoregressive, speculative, warping
from specsamp.sampling import tree as tree_lib
from specsamp.sampling.feature_drafter import FeatureDrafter
from specsamp.training import checkpoint, feature_train
from specsamp.training import train as train_lib
from specsamp.training.data import Batches

CONFIG = TransformerConfig(
  vocab_size=64, num_layers=6, d_model=32, num_heads=4, num_kv_heads=2, ffn_dim=64
)


@pytest.fixture(scope="module")
def target():
  return transformer.create(CONFIG, seed=1)


def _drafter(target, draft_vocab_size=0, seed=2):
  config = feature_head.FeatureHeadConfig(draft_vocab_size=draft_vocab_size)
  head = feature_head.create(config, CONFIG, seed=seed)
  return FeatureDrafter(feature_head.FeatureDraftModel(head, target))


def test_captured_features_are_the_hidden_states_entering_each_layer(target):
  tokens = jax.random.randint(jax.random.key(0), (2, 7), 0, 64)
  cache = target.init_cache(2, 10)
  logits, plain_cache = target(tokens, None, cache)
  captured = target(tokens, None, cache, capture_layers=(0, 2, 5))
  captured_logits, captured_cache, features = captured.logits, captured.cache, captured.features
  np.testing.assert_array_equal(captured_logits, logits)  # Capturing changes nothing else.
  np.testing.assert_array_equal(captured_cache.keys, plain_cache.keys)
  assert features.shape == (2, 7, 3 * 32)
  np.testing.assert_array_equal(features[..., :32], target.embedder.encode(tokens))
  # Entering layer l = the unrolled reference's residual stream after layers 0..l-1.
  for index, layer in enumerate((2, 5)):
    x = jax.jit(  # One program each, not an eager run of every operation.
      lambda tokens, layer=layer: transformer.run_blocks(
        target.blocks,
        CONFIG.replace(scan_layers=False),
        target.embedder.encode(tokens),
        jnp.broadcast_to(jnp.arange(7), (2, 7)),
        cache.keys,
        cache.values,
        layer,
      )[0]
    )(tokens)
    np.testing.assert_allclose(features[..., 32 * (index + 1) : 32 * (index + 2)], x, atol=1e-5)
  for bad in ((2, 1), (0, 7), (-1,)):
    with pytest.raises(ValueError, match="capture_layers"):
      target(tokens, None, cache, capture_layers=bad)


@pytest.mark.slow
def test_training_time_test_unroll_is_what_the_head_sees_when_drafting(target):
  """Row p of TTT step k equals the cached head after catching up to p on true features and
  drafting k steps on its own hidden states (the same tokens fed): mask, positions, cache."""
  drafter = _drafter(target)
  model, head = drafter.model, drafter.model.head
  length, steps = 10, 4
  tokens = jax.random.randint(jax.random.key(3), (2, length + steps + 1), 0, 64)
  rows = (0, 4, 9)

  @jax.jit  # One program, not an eager run of every operation.
  def cached_and_unrolled(tokens):
    features = target(tokens[:, :length], capture_layers=head.config.feature_layers).features
    embedded = jnp.stack(
      [target.embedder.encode(tokens[:, 1 + k : 1 + k + length]) for k in range(steps)]
    )
    unrolled = head.unrolled(embedded, head.fuse(features), steps)
    cached = []  # [row][step]: the cached head's hidden state.
    for p in rows:
      cache = model.init_cache(2, 32)
      positions = jnp.broadcast_to(jnp.arange(p + 1), (2, p + 1))
      h, cache = model.hidden(
        tokens[:, 1 : p + 2], head.fuse(features[:, : p + 1]), positions, cache
      )
      h = h[:, p]
      cached.append([h])
      for k in range(1, steps):
        h, cache = model.hidden(
          tokens[:, p + 1 + k][:, None], h[:, None], jnp.full((2, 1), p + k), cache
        )
        h = h[:, 0]
        cached[-1].append(h)
    return cached, unrolled

  cached, unrolled = cached_and_unrolled(tokens)
  for row, p in enumerate(rows):
    for k in range(steps):
      np.testing.assert_allclose(cached[row][k], unrolled[k][:, p], atol=1e-5)


@pytest.mark.parametrize(
  "draft_vocab_size, num_draft_tokens, tree, proposal",
  [  # The suite: a chain, a static tree over a draft vocabulary, a dynamic tree.
    pytest.param(0, 1, None, "sampled", marks=pytest.mark.extended),
    (0, 4, None, "sampled"),
    pytest.param(40, 1, None, "sampled", marks=pytest.mark.extended),
    pytest.param(40, 4, None, "sampled", marks=pytest.mark.extended),
    # Trees grown by the head, in either mode.
    pytest.param(40, 3, "chains:2x3/distinct", "greedy", marks=pytest.mark.extended),
    (40, 3, "tree:2,2,1", "sampled"),
    (0, 3, "dynamic:3,3,2@0.2", "greedy"),  # EAGLE-2: parents chosen per row, sharper ranks.
  ],
)
def test_greedy_speculative_equals_autoregressive(
  target, draft_vocab_size, num_draft_tokens, tree, proposal
):
  """Ragged rows, one of a single token (no feature yet: it proposes nothing first)."""
  drafter = FeatureDrafter(_drafter(target, draft_vocab_size).model, proposal=proposal)
  prompts = jnp.asarray([[1, 2, 3, 4, 5], [7, 8, 0, 0, 0], [9, 0, 0, 0, 0]], jnp.int32)
  lengths = jnp.asarray([5, 2, 1], jnp.int32)
  out = speculative.speculative_generate(
    target,
    drafter,
    prompts,
    lengths,
    jax.random.key(0),
    max_new_tokens=12,
    num_draft_tokens=num_draft_tokens,
    temperature=0.0,
    tree=tree,
  )
  expected = autoregressive.generate(
    target, prompts, lengths, jax.random.key(0), max_new_tokens=12, temperature=0.0
  )
  np.testing.assert_array_equal(out.tokens, expected.tokens)
  assert int(out.proposed.sum()) > 0


@pytest.mark.slow
@pytest.mark.parametrize(  # The chain's and the dynamic tree's cases are the extended command's.
  "tree",
  [
    pytest.param(None, marks=pytest.mark.extended),
    "tree:3,2,1",
    pytest.param("dynamic:8,4,2", marks=pytest.mark.extended),
  ],
)
def test_the_head_reads_the_targets_features_along_the_accepted_path(target, tree):
  """After a sampled run (T=1, so paths go through later siblings), the head's pending
  features are the target's own at those positions of the output, computed afresh by one
  forward pass: the loop handed over the accepted path's features, not a rejected branch's,
  and never recomputed them. (A wrong feature would not break exactness, only acceptance, so
  the certificate cannot see it: this test does.) Runs with several keys until one accepted
  a draft token in its last iteration (the untrained head rarely gets one accepted)."""
  proposal = "greedy" if tree and tree.startswith("dynamic") else "sampled"
  drafter = FeatureDrafter(_drafter(target).model, proposal=proposal)
  prompts = jnp.asarray([[1, 2, 3, 4, 5], [7, 8, 0, 0, 0]], jnp.int32)
  lengths = jnp.asarray([5, 2], jnp.int32)
  loop, target_arrays, drafter_arrays = speculative.SpeculativeLoop.for_models(
    target,
    drafter,
    max_new_tokens=10,
    num_draft_tokens=3,
    sampling=warping.SamplingConfig(1.0),
    verifier="token",
    schedule="fixed",
    eos_id=None,
    pad_id=0,
    cache_length=32,
    tree=None if tree is None else tree_lib.parse(tree),
  )
  layers = drafter.feature_layers
  # One compiled pass over a whole output row (causal: a position's feature does not see the
  # tokens after it, so the row's tail past its length changes nothing before it).
  features_of = jax.jit(lambda tokens: target(tokens, capture_layers=layers).features)
  checked = []
  for seed in range(3, 23):
    out, (_, state) = loop.reusing(
      target_arrays,
      drafter_arrays,
      (None, None),
      prompts,
      lengths,
      jax.random.key(seed),
      jnp.float32(0.0),
    )
    for row in range(2):  # A row that finished before the last iteration has nothing pending.
      n = int(out.lengths[row])
      features = features_of(out.tokens[row : row + 1])
      start = int(state.start[row])
      count = n - 1 - start
      assert 0 <= count <= 4
      np.testing.assert_allclose(
        state.pending[row, :count], features[0, start : start + count], atol=2e-5
      )
      checked.append(count)
    if max(checked) >= 2:
      break
  assert max(checked) >= 2  # At least one accepted draft token's feature was checked.


def test_reduced_vocabulary_puts_q_only_on_mapped_tokens(target):
  drafter = _drafter(target, draft_vocab_size=5)
  head = drafter.model.head
  head.draft_to_target[...] = jnp.asarray([60, 3, 17, 9, 41], jnp.int32)
  h = jax.random.normal(jax.random.key(0), (2, 3, 32))
  q = warping.probabilities(drafter.model.logits(h), warping.SamplingConfig(1.0))
  support = np.flatnonzero(np.asarray(q).reshape(-1, 64).sum(0) > 0)
  np.testing.assert_array_equal(support, [3, 9, 17, 41, 60])
  np.testing.assert_allclose(np.asarray(q).sum(-1), 1.0, rtol=1e-6)


def test_a_target_without_features_and_bad_proposals_are_refused(target):
  drafter = _drafter(target)
  bigram = random_bigram(64, seed=0)
  prompts, lengths = jnp.asarray([[1, 2]], jnp.int32), jnp.asarray([2], jnp.int32)

  def generate(model, drafter, **options):
    return speculative.speculative_generate(
      model,
      drafter,
      prompts,
      lengths,
      jax.random.key(0),
      max_new_tokens=4,
      num_draft_tokens=2,
      **options,
    )

  with pytest.raises(TypeError, match="part \\(g\\)"):
    generate(bigram, drafter)
  with pytest.raises(ValueError, match="distinct siblings"):
    generate(target, FeatureDrafter(drafter.model, proposal="greedy"), tree="chains:2x2")
  with pytest.raises(ValueError, match="proposal must be one of"):
    generate(target, FeatureDrafter(drafter.model, proposal="top"))
  # A head paired with this target, sampling with another of the same vocabulary (it failed in
  # an einsum inside JAX until 2026-11-30).
  for other in (dict(d_model=48, ffn_dim=96), dict(num_layers=2)):
    with pytest.raises(ValueError, match="paired with a target of d_model 32 and 6 layers"):
      generate(transformer.create(CONFIG.replace(**other), seed=1), drafter)
  with pytest.raises(ValueError, match="feature_layers"):
    feature_head.FeatureHeadConfig(feature_layers=(3, 1)).resolve(CONFIG)
  with pytest.raises(ValueError, match="draft_vocab_size"):
    feature_head.FeatureHeadConfig(draft_vocab_size=65).resolve(CONFIG)


def test_frequent_tokens_picks_the_most_common_ids():
  stream = np.asarray([5, 5, 5, 2, 2, 9, 9, 1, 7])
  np.testing.assert_array_equal(feature_train.frequent_tokens(stream, 10, 3), [2, 5, 9])
  np.testing.assert_array_equal(feature_train.frequent_tokens(stream, 10, 4), [1, 2, 5, 9])


@pytest.mark.slow
@pytest.mark.parametrize(  # The whole vocabulary's case is the extended command's.
  "draft_vocab_size", [pytest.param(0, marks=pytest.mark.extended), 40]
)
def test_training_lowers_the_unrolled_kl_and_keeps_the_map(target, draft_vocab_size):
  stream = np.asarray(jax.random.randint(jax.random.key(0), (6000,), 0, 64))
  config = feature_train.FeatureTrainConfig(
    steps=30, batch_size=4, seq_len=16, learning_rate=3e-3, warmup_steps=3, ttt_steps=3
  )
  mapping = (
    feature_train.frequent_tokens(stream, 64, draft_vocab_size) if draft_vocab_size else None
  )
  trainer = feature_train.FeatureTrainer(
    feature_head.FeatureHeadConfig(draft_vocab_size=draft_vocab_size),
    target,
    config,
    checkpoint.default_mesh(),
    mapping,
  )
  batches = Batches.pack(stream, 16, 4)
  state = trainer.init_state()
  before = trainer.evaluate(state.params, batches.first(2))
  for step in range(config.steps):
    state, _ = trainer.train_step(state, batches.at(step))
  after = trainer.evaluate(state.params, batches.first(2))
  assert after < 0.85 * before, (before, after)
  if draft_vocab_size:
    np.testing.assert_array_equal(trainer.head(state.params).draft_to_target[...], mapping)


@pytest.mark.slow
def test_a_trained_head_saves_loads_and_refuses_another_target(target, tmp_path):
  stream = np.asarray(jax.random.randint(jax.random.key(1), (3000,), 0, 64))
  config = feature_train.FeatureTrainConfig(
    steps=2, batch_size=2, seq_len=16, learning_rate=1e-3, warmup_steps=1, ttt_steps=2
  )
  head_config = feature_head.FeatureHeadConfig(draft_vocab_size=40)
  mapping = feature_train.frequent_tokens(stream, 64, 40)
  trainer = feature_train.FeatureTrainer(
    head_config, target, config, checkpoint.default_mesh(), mapping
  )
  batches = Batches.pack(stream, 16, 2)
  store = checkpoint.Checkpoints(str(tmp_path / "head"))
  meta = feature_train.head_meta(head_config, target)
  state = train_lib.fit(trainer, batches, batches.first(1), store, meta, log=lambda line: None)
  model, saved = feature_train.load_head(str(tmp_path / "head"), target)
  assert saved["step"] == 2
  np.testing.assert_array_equal(model.head.draft_to_target[...], mapping)
  np.testing.assert_array_equal(model.head.fc_FD[...], state.params["fc_FD"])
  # A fresh run started from the loaded head (answers.init_from): its parameters, fresh moments,
  # step 0; its vocabulary map must be the run's, and its shapes the head's.
  loaded = train_lib.params_of(model.head)
  again = feature_train.FeatureTrainer(
    head_config, target, config, checkpoint.default_mesh(), mapping, initial_params=loaded
  ).init_state()
  assert int(again.step) == 0
  for key in ("fc_FD", "draft_to_target"):
    np.testing.assert_array_equal(again.params[key], state.params[key])
  moments = [x for x in jax.tree.leaves(again.opt_state) if jnp.issubdtype(x.dtype, jnp.floating)]
  assert moments and all(not np.asarray(x).any() for x in moments)
  with pytest.raises(ValueError, match="draft vocabulary is not this run's"):
    feature_train.FeatureTrainer(
      head_config, target, config, checkpoint.default_mesh(), mapping[::-1], initial_params=loaded
    )
  wider = feature_head.FeatureHeadConfig(draft_vocab_size=40, ffn_dim=8)
  with pytest.raises(ValueError, match="has shape"):
    feature_train.FeatureTrainer(
      wider, target, config, checkpoint.default_mesh(), mapping, initial_params=loaded
    )
  # Grown to a wider MLP (feature_train.widen_mlp): the same function, more room. Its loss and
  # greedy runs on a batch are the loaded head's; the new units' output rows are zero, their
  # input columns drawn; the old ones are kept as they were.
  grown = feature_train.widen_mlp(loaded, CONFIG.ffn_dim + 32, seed=1)
  larger = feature_head.FeatureHeadConfig(draft_vocab_size=40, ffn_dim=CONFIG.ffn_dim + 32)
  as_grown = feature_train.FeatureTrainer(
    larger, target, config, checkpoint.default_mesh(), mapping, initial_params=grown
  )
  grown_params = as_grown.init_state().params
  for name in ("gate_DF", "up_DF", "down_FD"):
    old, new = np.asarray(loaded["mlp"][name]), np.asarray(grown_params["mlp"][name])
    np.testing.assert_array_equal(new[: old.shape[0], : old.shape[1]], old)
    added = new[old.shape[0] :] if name == "down_FD" else new[:, old.shape[1] :]
    assert added.size and (not added.any()) == (name == "down_FD")
  batch = batches.first(1)  # The loaded head measured by the trainer that trained it.
  assert as_grown.evaluate(grown_params, batch) == pytest.approx(
    trainer.evaluate(loaded, batch), rel=1e-5
  )
  np.testing.assert_array_equal(
    as_grown.greedy_correct(grown_params, batch[0], 2), trainer.greedy_correct(loaded, batch[0], 2)
  )
  with pytest.raises(ValueError, match="would narrow it"):
    feature_train.widen_mlp(loaded, CONFIG.ffn_dim - 1)
  other = transformer.create(CONFIG.replace(num_layers=4), seed=3)
  with pytest.raises(checkpoint.CheckpointError, match="target_model"):
    feature_train.load_head(str(tmp_path / "head"), other)
  with pytest.raises(checkpoint.CheckpointError, match="no feature head"):
    store = checkpoint.Checkpoints(str(tmp_path / "model"))
    store.save(1, {"params": {"x": jnp.zeros(2)}}, {"model": {}})
    store.wait()
    feature_train.load_head(str(tmp_path / "model"), target)


def test_a_head_for_a_bfloat16_target_trains_in_float32_and_loads_in_bfloat16(tmp_path):
  """The head's own parameters and Adam moments are float32 master weights whatever the
  target's dtype: an update too small for bfloat16 still moves them. Loaded for sampling, the
  head takes its target's dtype."""
  target = transformer.create(CONFIG.replace(param_dtype="bfloat16", dtype="bfloat16"), seed=1)
  stream = np.asarray(jax.random.randint(jax.random.key(1), (3000,), 0, 64))
  config = feature_train.FeatureTrainConfig(
    steps=1, batch_size=2, seq_len=16, learning_rate=1e-5, warmup_steps=0, ttt_steps=2
  )
  head_config = feature_head.FeatureHeadConfig()
  trainer = feature_train.FeatureTrainer(head_config, target, config, checkpoint.default_mesh())
  state = trainer.init_state()
  floats = [x for x in jax.tree.leaves(state) if jnp.issubdtype(x.dtype, jnp.floating)]
  assert floats and all(x.dtype == jnp.float32 for x in floats)
  before = np.asarray(state.params["fc_FD"])
  batches = Batches.pack(stream, 16, 2)
  after, _ = trainer.train_step(state, batches.at(0))
  moved = np.asarray(after.params["fc_FD"]) != before
  # A bfloat16 weight would not have moved: the step is below its rounding.
  rounded = np.asarray(after.params["fc_FD"]).astype(jnp.bfloat16) != before.astype(jnp.bfloat16)
  assert moved.mean() > 0.5 and rounded.mean() < 0.1 * moved.mean()
  store = checkpoint.Checkpoints(str(tmp_path / "head"))
  store.save(1, {"params": after.params}, dict(feature_train.head_meta(head_config, target)))
  store.wait()
  model, _ = feature_train.load_head(str(tmp_path / "head"), target)
  assert model.head.fc_FD[...].dtype == jnp.bfloat16
  np.testing.assert_array_equal(model.head.fc_FD[...], after.params["fc_FD"].astype(jnp.bfloat16))


def test_target_samples_are_corpus_prompts_and_the_targets_continuations(target):
  """The stream holds, back to back, corpus windows and what the target sampled after each
  (the same draws as autoregressive.generate with the same key and batch)."""
  from specsamp.training import target_samples

  corpus = np.arange(200, dtype=np.int32) % 64
  stream = target_samples.sample_stream(
    target, corpus, num_sequences=3, prompt_tokens=5, new_tokens=4, batch_size=2, seed=7
  )
  rows = stream.reshape(3, 9)
  starts = [int(np.flatnonzero(corpus == row[0])[0]) for row in rows]
  for row, start in zip(rows, starts):
    np.testing.assert_array_equal(row[:5], corpus[start : start + 5])  # A corpus window.
  expected = autoregressive.generate(
    target,
    rows[:2, :5],
    np.full((2,), 5, np.int32),
    jax.random.fold_in(jax.random.key(7), 0),
    max_new_tokens=4,
  )
  np.testing.assert_array_equal(rows[:2], np.asarray(expected.tokens)[:, :9])
  with pytest.raises(ValueError, match="shorter than one prompt"):
    target_samples.sample_stream(target, corpus[:3], num_sequences=1, prompt_tokens=5, new_tokens=2)


def test_a_pair_trains_its_head_on_target_samples_when_asked(target):
  """config.feature.target_samples replaces the head's training stream (not the evaluation
  stream) with the target's own samples, and the checkpoint's metadata records it."""
  import ml_collections

  from specsamp.experiments.jobs import pair as pair_lib

  corpus = pair_lib.Corpus(split=None, train_stream=np.arange(300) % 64, eval_stream=np.ones(50))
  samples = ml_collections.ConfigDict(
    dict(num_sequences=4, prompt_tokens=6, new_tokens=3, temperature=1.0, batch_size=4)
  )
  wrapped = pair_lib._with_target_samples(lambda: corpus, target, samples, 3, log=lambda _: None)()
  assert wrapped.train_stream.shape == (4 * 9,)
  np.testing.assert_array_equal(wrapped.eval_stream, corpus.eval_stream)


@pytest.mark.parametrize(
  "sampling",
  [
    warping.SamplingConfig(1.0),
    warping.SamplingConfig(0.8, top_k=5, top_p=0.9),
    warping.SamplingConfig(0.0),
  ],
)
def test_a_draft_vocabulary_is_warped_and_drawn_over_its_own_entries(sampling):
  """``proposals.DraftVocabLogits``: the q placed in the target's vocabulary is the warp of the
  target-vocabulary logits (-inf outside the draft's), the drawn token is a draft entry mapped
  to its target id with the frequency q gives it, and the confidence is the same."""
  from specsamp.sampling import proposals

  ids = jnp.asarray([7, 3, 60, 12, 41, 0, 33, 25], jnp.int32)  # Distinct target ids, unordered.
  small = 2.0 * jax.random.normal(jax.random.key(4), (2, 8))
  logits = proposals.DraftVocabLogits(small, ids, 64)
  full = jnp.full((2, 64), -jnp.inf).at[:, ids].set(small)  # The target-vocabulary logits.
  token, q = proposals.draw_token(jax.random.key(5), logits, sampling, "sampled")
  full_token, full_q = proposals.draw_token(jax.random.key(5), full, sampling, "sampled")
  if sampling.greedy:  # Chosen: the argmax, and no q (the point mass).
    assert q is None and full_q is None
    np.testing.assert_array_equal(token, full_token)
  else:
    np.testing.assert_allclose(q, full_q, rtol=1e-5, atol=1e-7)
    draws = jax.vmap(lambda k: proposals.draw_token(k, logits, sampling, "sampled")[0])(
      jax.random.split(jax.random.key(6), 20_000)
    )
    assert set(np.unique(np.asarray(draws))) <= set(np.asarray(ids).tolist())
    for row in range(2):  # Frequencies within 5 standard errors of q.
      counts = np.bincount(np.asarray(draws[:, row]), minlength=64) / 20_000
      sd = np.sqrt(np.asarray(q[row]) * (1 - np.asarray(q[row])) / 20_000)
      assert np.all(np.abs(counts - np.asarray(q[row])) <= 5 * sd + 1e-9)
  np.testing.assert_allclose(
    proposals.own_probability(logits, token),
    jax.nn.softmax(full, axis=-1)[jnp.arange(2), token],
    rtol=1e-6,
  )
