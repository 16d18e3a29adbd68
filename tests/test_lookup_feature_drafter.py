"""Prompt lookup where the context repeats, the feature head elsewhere (drafter
'feature+lookup'): each row's proposal is one drafter's, with the q it came from; greedy
equals autoregressive; the job's names; the errors. The sampled law is the certificate's
``feature_lookup`` cases (tests/test_certify.py)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsamp.experiments.jobs import drafter_specs
from specsamp.models import feature_head, transformer
from specsamp.models.config import TransformerConfig
from specsamp.sampling import autoregressive, speculative
from specsamp.sampling.drafters import Drafter, PromptLookupDrafter
from specsamp.sampling.feature_drafter import FeatureDrafter
from specsamp.sampling.lookup_feature_drafter import LookupFeatureDrafter
from specsamp.sampling.tree import chains
from specsamp.sampling.warping import SamplingConfig

CONFIG = TransformerConfig(
  vocab_size=64, num_layers=4, d_model=32, num_heads=4, num_kv_heads=2, ffn_dim=64
)
# Row 0 ends with the 2-gram (3, 4) it held before: it copies 5, 6, 7. Row 1 repeats only one
# token (9), below min_ngram=2: the head drafts it.
PROMPTS = jnp.asarray([[3, 4, 5, 6, 7, 3, 4], [9, 1, 9, 2, 8, 9, 0]], jnp.int32)
LENGTHS = jnp.asarray([7, 6], jnp.int32)


@pytest.fixture(scope="module")
def head_model():
  target = transformer.create(CONFIG, seed=1)
  head = feature_head.create(feature_head.FeatureHeadConfig(), CONFIG, seed=2)
  return feature_head.FeatureDraftModel(head, target)


def _propose(drafter, prompts, lengths, sampling, K=3, side_by_side=False):
  """(proposal, state) of the first iteration after the prompt's prefill: one compiled program
  per drafter kind and setting (run eagerly, the prefill, init and proposal were hundreds of
  small compiles). ``side_by_side``: the tree proposal ``chains:2xK`` instead of the chain."""
  static, dynamic = drafter.split()
  prompts, lengths = jnp.asarray(prompts), jnp.asarray(lengths)
  return _first_proposal(static, dynamic, prompts, lengths, sampling, K, side_by_side)


@functools.partial(jax.jit, static_argnums=(0, 4, 5, 6))
def _first_proposal(static, dynamic, prompts, lengths, sampling, K, side_by_side):
  drafter = Drafter.merge(static, dynamic)
  target = drafter.model.target
  cache = target.init_cache(prompts.shape[0], 16)
  features = target(prompts, None, cache, capture_layers=drafter.feature_layers).features
  state, _ = drafter.init(prompts, lengths, 16, K, features_BTF=features)
  limit = jnp.full((prompts.shape[0],), K, jnp.int32)
  if side_by_side:
    return drafter.propose_tree(
      state, prompts, lengths, jax.random.key(3), chains(2, K), limit, sampling, CONFIG.vocab_size
    )
  return drafter.propose(
    state, prompts, lengths, jax.random.key(3), K, limit, sampling, CONFIG.vocab_size
  )


# T=0 is the extended command's (as the cap's): T=1 makes the same token, count and call checks,
# and the greedy loop test below runs T=0 end to end.
@pytest.mark.parametrize("temperature", [1.0, pytest.param(0.0, marks=pytest.mark.extended)])
def test_a_row_copies_where_its_context_repeats_and_the_head_drafts_elsewhere(
  head_model, temperature
):
  sampling = SamplingConfig(temperature)
  both, _ = _propose(LookupFeatureDrafter(head_model), PROMPTS, LENGTHS, sampling)
  head, _ = _propose(FeatureDrafter(head_model), PROMPTS, LENGTHS, sampling)
  np.testing.assert_array_equal(both.tokens[0], [5, 6, 7])  # Copied after the 2-gram (3, 4).
  np.testing.assert_array_equal(both.num_proposed, [3, 3])
  np.testing.assert_array_equal(both.tokens[1], head.tokens[1])  # Drawn by the head, same key.
  if temperature == 0.0:
    assert both.probs is None and head.probs is None  # Chosen tokens: point masses.
  else:
    np.testing.assert_array_equal(both.probs[0], jax.nn.one_hot(both.tokens[0], 64))
    np.testing.assert_array_equal(both.probs[1], head.probs[1])
  assert int(both.model_calls) == int(head.model_calls) > 0


def test_when_every_row_copies_the_head_only_catches_up(head_model):
  """No head step is made (model_calls 0); the head's cache holds the caught-up pairs, as the
  head's own proposal leaves them up to the last known position."""
  prompts, lengths = PROMPTS[:1], LENGTHS[:1]
  both, state = _propose(LookupFeatureDrafter(head_model), prompts, lengths, SamplingConfig(1.0))
  copied, _ = PromptLookupDrafter(max_ngram=3, min_ngram=2).propose(
    (), prompts, lengths, None, 3, jnp.full((1,), 3), SamplingConfig(1.0), 64
  )
  np.testing.assert_array_equal(both.tokens, copied.tokens)
  assert int(both.model_calls) == 0
  _, head_state = _propose(FeatureDrafter(head_model), prompts, lengths, SamplingConfig(1.0))
  caught_up = int(lengths[0]) - 1  # Pairs 0..n-2 hold the target's true features.
  np.testing.assert_allclose(
    state.cache.keys[:, :, :caught_up], head_state.cache.keys[:, :, :caught_up], atol=1e-6
  )


@pytest.mark.parametrize(  # The greedy case is the extended command's.
  "temperature", [1.0, pytest.param(0.0, marks=pytest.mark.extended)]
)
def test_head_draft_tokens_caps_the_heads_rows_and_not_the_copies(head_model, temperature):
  """With head_draft_tokens=2 at K=3 the copying row still proposes 3, and the head's row the
  first 2 of what it drafts uncapped, with their q (same key)."""
  sampling = SamplingConfig(temperature)
  capped, _ = _propose(
    LookupFeatureDrafter(head_model, head_draft_tokens=2), PROMPTS, LENGTHS, sampling
  )
  full, _ = _propose(LookupFeatureDrafter(head_model), PROMPTS, LENGTHS, sampling)
  np.testing.assert_array_equal(capped.num_proposed, [3, 2])
  np.testing.assert_array_equal(capped.tokens[0], full.tokens[0])
  np.testing.assert_array_equal(capped.tokens[1, :2], full.tokens[1, :2])
  if temperature:
    np.testing.assert_array_equal(capped.probs[:, :2], full.probs[:, :2])
  assert int(capped.model_calls) < int(full.model_calls)


@pytest.mark.parametrize(  # The uncapped K=2 case is the extended command's.
  ("num_draft_tokens", "head_draft_tokens"),
  [pytest.param(2, 0, marks=pytest.mark.extended), (5, 2)],
)
def test_greedy_speculative_equals_autoregressive(head_model, num_draft_tokens, head_draft_tokens):
  target = head_model.target
  prompts = jnp.concatenate([PROMPTS, jnp.asarray([[5, 0, 0, 0, 0, 0, 0]], jnp.int32)])
  lengths = jnp.concatenate([LENGTHS, jnp.asarray([1], jnp.int32)])
  out = speculative.speculative_generate(
    target,
    LookupFeatureDrafter(head_model, head_draft_tokens=head_draft_tokens),
    prompts,
    lengths,
    jax.random.key(0),
    max_new_tokens=12,
    num_draft_tokens=num_draft_tokens,
    temperature=0.0,
    narrow_scoring=bool(head_draft_tokens),
  )
  expected = autoregressive.generate(
    target, prompts, lengths, jax.random.key(0), max_new_tokens=12, temperature=0.0
  )
  np.testing.assert_array_equal(out.tokens, expected.tokens)
  assert int(out.proposed.sum()) > 0


def test_the_copy_and_the_heads_chain_side_by_side_greedy_equals_autoregressive(head_model):
  """tree='chains:2xK': the copy as chain 0, the head's chain as chain 1, one target call;
  greedy keeps the longer matching run, so the output is the target's and no chain alone
  accepts more per call."""
  target = head_model.target
  prompts = jnp.concatenate([PROMPTS, jnp.asarray([[5, 0, 0, 0, 0, 0, 0]], jnp.int32)])
  lengths = jnp.concatenate([LENGTHS, jnp.asarray([1], jnp.int32)])
  run = functools.partial(
    speculative.speculative_generate,
    target,
    LookupFeatureDrafter(head_model),
    prompts,
    lengths,
    jax.random.key(0),
    max_new_tokens=12,
    num_draft_tokens=3,
    temperature=0.0,
  )
  beside, chain = run(tree="chains:2x3"), run()
  expected = autoregressive.generate(
    target, prompts, lengths, jax.random.key(0), max_new_tokens=12, temperature=0.0
  )
  np.testing.assert_array_equal(beside.tokens, expected.tokens)
  np.testing.assert_array_equal(chain.tokens, expected.tokens)
  assert int(beside.target_calls) <= int(chain.target_calls)


def test_the_copy_and_the_heads_chain_side_by_side_propose_with_their_own_q(head_model):
  """The first tree proposal: chain 0 (even nodes) is the row's copy with point-mass q, after a
  1-gram match too (``tree_min_ngram``: row 1's last token 9 occurred before), and not drafted
  where the row has no match; chain 1 (odd nodes) is the head's chain with the q the chain
  drafter reports for it (same key)."""
  sampling = SamplingConfig(1.0)
  head, _ = _propose(FeatureDrafter(head_model), PROMPTS, LENGTHS, sampling)
  tree, _ = _propose(
    LookupFeatureDrafter(head_model), PROMPTS, LENGTHS, sampling, side_by_side=True
  )
  np.testing.assert_array_equal(tree.tokens[:, 0::2], [[5, 6, 7], [2, 8, 9]])  # Copied.
  np.testing.assert_array_equal(tree.drafted[:, 0::2], True)
  np.testing.assert_array_equal(tree.probs[:, 0::2], jax.nn.one_hot(tree.tokens[:, 0::2], 64))
  np.testing.assert_array_equal(tree.tokens[:, 1::2], head.tokens)
  np.testing.assert_array_equal(tree.probs[:, 1::2], head.probs)
  np.testing.assert_array_equal(tree.drafted[:, 1::2], True)
  # With 2-grams at least (the chain's rule), row 1 has no match: its copy is not drafted.
  two_grams = LookupFeatureDrafter(head_model, tree_min_ngram=2)
  tree, _ = _propose(two_grams, PROMPTS, LENGTHS, sampling, side_by_side=True)
  np.testing.assert_array_equal(tree.drafted[:, 0::2], [[True] * 3, [False] * 3])
  np.testing.assert_array_equal(tree.tokens[:, 1::2], head.tokens)


def test_names_and_errors(head_model):
  assert drafter_specs.parse("feature+lookup") == drafter_specs.DrafterSpec("feature_lookup", 3)
  assert drafter_specs.parse("feature+lookup:4").number == 4
  assert drafter_specs.parse("feature+lookup").needs_feature_head
  for bad in ("feature+lookup:1", "feature+lookup:x", "lookup+feature"):
    with pytest.raises(ValueError, match="Unknown drafter"):
      drafter_specs.parse(bad)
  drafter = LookupFeatureDrafter(head_model)
  with pytest.raises(ValueError, match="side by side as the tree 'chains:2x2'"):
    speculative.speculative_generate(
      head_model.target,
      drafter,
      PROMPTS,
      LENGTHS,
      jax.random.key(0),
      max_new_tokens=4,
      num_draft_tokens=2,
      tree="tree:3,1",  # ('tree:2,1' is 'chains:2x2': two chains of 2.)
    )
  for bad in (-1, 1.5):
    with pytest.raises(ValueError, match="head_draft_tokens must be an int >= 0"):
      LookupFeatureDrafter(head_model, head_draft_tokens=bad).check(head_model.target)
  with pytest.raises(ValueError, match="only feature\\+lookup drafts with two drafters"):
    drafter_specs.make(drafter_specs.DrafterSpec("lookup", 3), None, head_draft_tokens=2)
  parallel = feature_head.create(feature_head.FeatureHeadConfig(parallel=True), CONFIG, seed=2)
  with pytest.raises(ValueError, match="parallel head"):
    LookupFeatureDrafter(feature_head.FeatureDraftModel(parallel, head_model.target)).check(
      head_model.target
    )
