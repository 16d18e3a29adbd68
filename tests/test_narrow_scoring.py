"""Narrow scoring (``chain_step.score_narrow``): each iteration scores the narrowest of 1..K + 1
positions that holds every row's proposal. The narrow call computes what the full one computes
at its positions; greedy sampling equals autoregressive with every drafter that stops early
(prompt lookup's misses, a confidence stop of a draft model and of the feature head); the
statistics count the widths; the errors. The sampled law is the certificate's ``narrow``
cases (tests/test_certify.py runs the quick one; the planted bug ``narrow_one_short`` is the
extended command's)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsamp.experiments.jobs import drafter_specs
from specsamp.models import feature_head, transformer
from specsamp.models.config import TransformerConfig
from specsamp.sampling import autoregressive, chain_step, drafters, speculative, warping
from specsamp.sampling import tree as tree_lib
from specsamp.sampling.feature_drafter import FeatureDrafter
from specsamp.sampling.lookup_feature_drafter import LookupFeatureDrafter
from specsamp.sampling.sampler import Sampler
from specsamp.sampling.warping import SamplingConfig

CONFIG = TransformerConfig(
  vocab_size=64, num_layers=3, d_model=32, num_heads=4, num_kv_heads=2, ffn_dim=64
)
PROMPTS = jnp.asarray([[3, 4, 5, 6, 7, 3, 4], [9, 1, 9, 2, 8, 9, 0], [5, 0, 0, 0, 0, 0, 0]])
LENGTHS = jnp.asarray([7, 6, 1], jnp.int32)


@pytest.fixture(scope="module")
def models():
  target = transformer.create(CONFIG, seed=1)
  draft = transformer.create(CONFIG.replace(num_layers=1), seed=3)
  head = feature_head.create(feature_head.FeatureHeadConfig(), CONFIG, seed=2)
  return target, draft, feature_head.FeatureDraftModel(head, target)


def test_the_narrowest_width_that_holds_every_rows_proposal():
  widths = (1, 2, 3, 4, 5)
  for proposed, width in (([0, 0], 1), ([0, 2], 3), ([4, 1], 5), ([3], 4)):
    index = chain_step.scoring_width(jnp.asarray(proposed, jnp.int32), widths)
    assert widths[int(index)] == width
  assert int(chain_step.scoring_width(jnp.asarray([0, 4]), (5,))) == 0  # One width: it.
  assert chain_step.ChainStep(4, None, "token", narrow=True).widths == widths
  assert chain_step.ChainStep(4, None, "token").widths == (5,)


def test_a_narrow_call_computes_what_the_full_call_computes_at_its_positions(models):
  target, _, head = models
  layers = head.feature_layers
  # The prefill and the full call's reference each one compiled program (eagerly, with the
  # warping, they were about 100 small compiles).
  cache = jax.jit(lambda: target(PROMPTS[:2, :4], None, target.init_cache(2, 16))[1])()
  cache = cache.replace(lengths=jnp.asarray([4, 4], jnp.int32))
  tokens = PROMPTS[:2, 2:7]
  positions = 4 + jnp.broadcast_to(jnp.arange(5), (2, 5))
  widths = (1, 2, 3, 4, 5)
  nucleus = SamplingConfig(0.8, top_p=0.9)

  @jax.jit
  def full_call(cache):
    scored = chain_step.score_narrow(target, tokens, positions, cache, layers, (5,), jnp.int32(0))
    return scored, warping.probabilities(scored[0], nucleus)

  (full_logits, full_cache, full_features, _), full_probs = full_call(cache)

  def narrow(index, sampling):  # One program for every width (the index is traced).
    return chain_step.score_narrow(
      target, tokens, positions, cache, layers, widths, index, sampling
    )

  logits_at = jax.jit(lambda index: narrow(index, None))
  probs_at = jax.jit(lambda index: narrow(index, nucleus)[0])
  for index, width in enumerate(widths):
    logits, narrow_cache, features, nan = logits_at(jnp.int32(index))
    probs = probs_at(jnp.int32(index))  # Warped at the scored positions only, zeros past them.
    np.testing.assert_allclose(probs[:, :width], full_probs[:, :width], rtol=2e-5, atol=2e-6)
    assert not np.any(probs[:, width:]) and not np.any(nan)
    assert logits.shape == full_logits.shape and features.shape == full_features.shape
    np.testing.assert_allclose(logits[:, :width], full_logits[:, :width], rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(features[:, :width], full_features[:, :width], rtol=2e-5, atol=2e-5)
    assert not np.any(logits[:, width:]) and not np.any(features[:, width:])
    written = slice(4, 4 + width)  # The positions the narrow call wrote, as the full one did.
    np.testing.assert_allclose(
      narrow_cache.keys[:, :, written], full_cache.keys[:, :, written], rtol=2e-5, atol=2e-5
    )


def _drafters(models):
  _, draft, head = models
  return {
    "lookup": drafters.PromptLookupDrafter(max_ngram=2),
    "draft, confidence stop": drafters.ModelDrafter(draft, confidence_threshold=0.2),
    "feature, confidence stop": FeatureDrafter(head, confidence_threshold=0.2),
    "feature+lookup, confidence stop": LookupFeatureDrafter(head, confidence_threshold=0.2),
  }


NAMES = [  # The suite: the head's confidence stop with lookup; lookup alone, the draft's
  # confidence stop (certified in test_certify.py's narrow case) and the head's alone are the
  # extended command's.
  pytest.param("lookup", marks=pytest.mark.extended),
  pytest.param("draft, confidence stop", marks=pytest.mark.extended),
  pytest.param("feature, confidence stop", marks=pytest.mark.extended),
  "feature+lookup, confidence stop",
]


@pytest.mark.parametrize("name", NAMES)
def test_greedy_narrow_scoring_equals_autoregressive(models, name):
  target = models[0]
  drafter = _drafters(models)[name]
  expected = autoregressive.generate(
    target, PROMPTS, LENGTHS, jax.random.key(0), max_new_tokens=12, temperature=0.0
  )
  runs = {}
  for narrow in (False, True):
    runs[narrow] = speculative.speculative_generate(
      target,
      drafter,
      PROMPTS,
      LENGTHS,
      jax.random.key(0),
      max_new_tokens=12,
      num_draft_tokens=4,
      temperature=0.0,
      narrow_scoring=narrow,
    )
    np.testing.assert_array_equal(runs[narrow].tokens, expected.tokens)
  wide, narrow = runs[False], runs[True]
  iterations = int(wide.target_calls) - 1
  assert int(wide.scored_tokens) == 5 * iterations  # Always K + 1 positions.
  # Narrow: the same proposals (greedy), each iteration 1 + its longest proposal, and fewer.
  assert int(narrow.scored_tokens) < 5 * (int(narrow.target_calls) - 1)
  assert narrow.summary()["mean_scored_tokens"] < 5


def test_narrow_scoring_samples_as_a_fresh_call_with_a_kept_cache(models):
  """The Sampler's kept caches hold positions a narrow call never wrote: nothing reads them."""
  target = models[0]
  drafter = _drafters(models)["feature+lookup, confidence stop"]
  sampler = Sampler(target, drafter)
  kwargs = dict(max_new_tokens=10, num_draft_tokens=3, temperature=0.8, narrow_scoring=True)
  first = sampler.generate(PROMPTS, LENGTHS, jax.random.key(1), **kwargs)
  second = sampler.generate(PROMPTS, LENGTHS, jax.random.key(2), **kwargs)
  fresh = speculative.speculative_generate(
    target, drafter, PROMPTS, LENGTHS, jax.random.key(2), **kwargs
  )
  np.testing.assert_array_equal(second.tokens, fresh.tokens)
  assert int(first.scored_tokens) > 0


def test_errors(models):
  target, _, head = models
  with pytest.raises(ValueError, match="narrow_scoring applies to chains"):
    speculative.speculative_generate(
      target,
      FeatureDrafter(head),
      PROMPTS,
      LENGTHS,
      jax.random.key(0),
      max_new_tokens=4,
      num_draft_tokens=2,
      tree="tree:2,1",
      narrow_scoring=True,
    )
  with pytest.raises(ValueError, match=r"confidence_threshold must be in \[0, 1\)"):
    FeatureDrafter(head, confidence_threshold=1.0).check(target)
  with pytest.raises(ValueError, match="confidence_threshold applies to static trees"):
    FeatureDrafter(head, proposal="greedy", confidence_threshold=0.5).check_tree(
      tree_lib.parse("dynamic:2,2")
    )
  # A pair config's stop (smollm2_pair's 0.5) runs prompt lookup alone unchanged: its copies are
  # point masses, which the stop never ends (refused until 2026-12-02).
  lookup = drafter_specs.make(drafter_specs.parse("lookup"), None, confidence_threshold=0.5)
  assert type(lookup).__name__ == "PromptLookupDrafter"


@pytest.mark.extended  # Reduced in the suite: the certificate's narrow case (test_certify.py)
# samples the target's law with a confidence stop, and greedy narrow scoring equals autoregressive.
@pytest.mark.parametrize("name", ["lookup", "feature+lookup, confidence stop"])
def test_narrow_scoring_draws_what_full_scoring_draws_for_the_same_key(models, name):
  """The width changes no number the verifier reads, and no random draw: for the same key the
  sampled tokens are the same (the certificate's feature+lookup case gave the same G with both
  at 10^6 draws, 2026-11-28)."""
  target = models[0]
  drafter = _drafters(models)[name]
  for seed in range(3):
    kwargs = dict(max_new_tokens=12, num_draft_tokens=4, temperature=0.8, top_p=0.9)
    full, narrow = (
      speculative.speculative_generate(
        target, drafter, PROMPTS, LENGTHS, jax.random.key(seed), narrow_scoring=n, **kwargs
      )
      for n in (False, True)
    )
    np.testing.assert_array_equal(narrow.tokens, full.tokens)
    np.testing.assert_array_equal(narrow.accepted_histogram, full.accepted_histogram)
