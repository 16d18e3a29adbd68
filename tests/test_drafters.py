"""Drafters (prompt lookup, self-speculative, a draft model with a confidence stop) and the
adaptive draft-length schedule: exact distributions, greedy identity, proposals, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_follows, sampled_counts, tiny_config
from flax import nnx

from specsamp.models import transformer
from specsamp.models.transformer import EarlyExit
from specsamp.sampling import generate, speculative, speculative_generate, warping
from specsamp.sampling.drafters import ModelDrafter, PromptLookupDrafter, self_speculative
from specsamp.testing import exactness

# A prompt whose last token occurred before, so prompt lookup proposes from the first step.
EXACT_PROMPT = np.array([3, 6, 3])


def drafter_named(name, small_pair):
  target, draft = small_pair
  return {
    "lookup": PromptLookupDrafter(max_ngram=2),
    "self": self_speculative(target, 1),
    "model": ModelDrafter(draft),
    "confidence": ModelDrafter(draft, confidence_threshold=0.3),
  }[name]


# Exactness of every drafter x schedule x verifier x warping is certified by
# tests/test_certify.py (10^5 sequences per case) and scripts/certify.py (10^6); these two
# also check that the draft length adapts.
EXACT_CASES = [  # (drafter, schedule, verifier, sampling, K)
  ("self", "heuristic", "token", warping.SamplingConfig(0.7), 3),
  # A confidence stop is certified in the suite (test_certify.py's narrow case); this one is
  # the extended command's.
  pytest.param(
    "confidence", "fixed", "token", warping.SamplingConfig(1.0), 3, marks=pytest.mark.extended
  ),
]


def _sample(target, drafter, sampling, num_draft_tokens, verifier, schedule):
  return sampled_counts(
    target,
    drafter,
    EXACT_PROMPT,
    num_draft_tokens=num_draft_tokens,
    temperature=sampling.temperature,
    top_p=sampling.top_p,
    verifier=verifier,
    schedule=schedule,
  )


@pytest.mark.slow
@pytest.mark.parametrize("name, schedule, verifier, sampling, num_draft_tokens", EXACT_CASES)
def test_samples_follow_the_exact_target_distribution(
  small_pair, name, schedule, verifier, sampling, num_draft_tokens
):
  target = small_pair[0]
  observed, stats = _sample(
    target, drafter_named(name, small_pair), sampling, num_draft_tokens, verifier, schedule
  )
  assert 0.05 < stats["acceptance_rate"] < 0.98, stats  # accepting and rejecting both happen
  assert_follows(observed, target, EXACT_PROMPT, sampling)
  if schedule == "heuristic" or name == "confidence":
    assert stats["mean_draft_length"] < num_draft_tokens  # the draft length did adapt
  if name == "confidence":  # ... and the draft model ran fewer steps than K per iteration.
    assert stats["draft_calls"] < 1 + (stats["target_calls"] - 1) * num_draft_tokens


PROMPTS = np.array(
  [
    [5, 9, 14, 5, 9, 7, 40],
    [8, 8, 31, 0, 0, 0, 0],
    [60, 2, 17, 90, 60, 2, 0],
    [1, 0, 0, 0, 0, 0, 0],
  ]
)
LENGTHS = np.array([7, 3, 6, 1])


@pytest.fixture(scope="module")
def target():
  return transformer.create(tiny_config(), seed=0)


@pytest.mark.parametrize(
  "name, schedule",
  [("lookup", "heuristic"), ("self", "fixed"), ("close", "heuristic"), ("confidence", "heuristic")],
)
def test_greedy_speculative_equals_greedy_autoregressive(target, name, schedule):
  close = exactness.noisy_copy(target, 0.1, seed=4)
  drafter = {
    "lookup": PromptLookupDrafter(),
    "self": self_speculative(target, 1),
    "close": close,
    "confidence": ModelDrafter(close, confidence_threshold=0.5),
  }[name]
  ar = generate(target, PROMPTS, LENGTHS, jax.random.key(0), max_new_tokens=17, temperature=0)
  out = speculative_generate(
    target,
    drafter,
    PROMPTS,
    LENGTHS,
    jax.random.key(1),
    max_new_tokens=17,
    num_draft_tokens=4,
    temperature=0,
    schedule=schedule,
  )
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ar.tokens))
  stats = out.summary()
  assert stats["tokens_per_target_call"] > 1.0  # drafts were accepted, not only rejected


def test_prompt_lookup_proposes_the_most_recent_continuation():
  tokens = jnp.array(
    [
      [1, 2, 3, 9, 1, 2, 0, 0],  # "1 2" seen at 0: propose 3 9 1
      [5, 7, 5, 8, 5, 0, 0, 0],  # "5" last seen at 2: propose 8 5 (all known)
      [4, 6, 2, 0, 0, 0, 0, 0],  # no earlier "2": nothing
      [1, 2, 3, 9, 1, 2, 0, 0],
    ]
  )  # as row 0, limited to 1 token
  lengths = jnp.array([6, 5, 3, 6])
  proposal, _ = PromptLookupDrafter(max_ngram=3).propose(
    (),
    tokens,
    lengths,
    jax.random.key(0),
    3,
    jnp.array([3, 3, 3, 1]),
    warping.SamplingConfig(1.0),
    10,
  )
  np.testing.assert_array_equal(proposal.num_proposed, [3, 2, 0, 1])
  np.testing.assert_array_equal(proposal.tokens[0], [3, 9, 1])
  np.testing.assert_array_equal(proposal.tokens[1, :2], [8, 5])
  np.testing.assert_array_equal(proposal.tokens[3, :1], [3])
  assert proposal.probs is None  # Copied tokens: q is the point mass at each, never a [B, K, V]
  assert int(proposal.model_calls) == 0


def test_the_heuristic_schedule_is_hfs_rule():
  limit = jnp.array([4, 4, 2, 1, 3])
  proposed = jnp.array([4, 4, 2, 1, 0])
  accepted = jnp.array([4, 1, 2, 0, 0])
  np.testing.assert_array_equal(
    speculative.next_draft_limit("heuristic", limit, proposed, accepted, 5), [5, 3, 4, 1, 2]
  )
  np.testing.assert_array_equal(
    speculative.next_draft_limit("fixed", limit, proposed, accepted, 5), limit
  )


def test_early_exit_is_the_first_layers_with_the_targets_head(target):
  tokens = jnp.array([[5, 9, 14, 3, 22]])
  early = EarlyExit(target, 1)
  assert early.init_cache(1, 8).num_layers == 1
  logits, _ = early(tokens)
  shallow = transformer.Transformer(target.config.replace(num_layers=1), rngs=nnx.Rngs(0))
  shallow.embedder, shallow.final_norm, shallow.head = (
    target.embedder,
    target.final_norm,
    target.head,
  )
  graphdef, state = nnx.split(target.blocks)
  shallow.blocks = nnx.merge(graphdef, jax.tree.map(lambda a: a[:1], state))  # Layer 0 only.
  np.testing.assert_allclose(logits, shallow(tokens)[0], rtol=1e-6, atol=1e-6)
  with pytest.raises(ValueError, match="1 <= num_layers < 2"):
    EarlyExit(target, 2)


def test_drafter_errors(target):
  common = dict(max_new_tokens=4, num_draft_tokens=2)
  with pytest.raises(ValueError, match="min_ngram <= max_ngram"):
    speculative_generate(
      target,
      PromptLookupDrafter(max_ngram=1, min_ngram=2),
      PROMPTS,
      LENGTHS,
      jax.random.key(0),
      **common,
    )
  # A float passed the range check and failed in range() while tracing (2026-11-30).
  with pytest.raises(ValueError, match="needs ints 1 <= min_ngram <= max_ngram, got 1, 2.5"):
    PromptLookupDrafter(max_ngram=2.5).check(target)
  with pytest.raises(ValueError, match="confidence_threshold must be in"):
    speculative_generate(
      target,
      ModelDrafter(target, confidence_threshold=1.5),
      PROMPTS,
      LENGTHS,
      jax.random.key(0),
      **common,
    )
  with pytest.raises(ValueError, match="schedule must be one of"):
    speculative_generate(
      target,
      PromptLookupDrafter(),
      PROMPTS,
      LENGTHS,
      jax.random.key(0),
      schedule="adaptive",
      **common,
    )
  other = transformer.create(tiny_config(vocab_size=50), seed=0)
  with pytest.raises(ValueError, match="vocabulary"):
    speculative_generate(target, other, PROMPTS, LENGTHS, jax.random.key(0), **common)
