"""docs/bring_your_own_model.md's example, checked: a user's own Flax NNX model (not specsamp's
Transformer), taken from the page itself, wrapped in the decode protocol and used as target and
draft."""

import docs_blocks
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from specsamp.sampling import generate, speculative_generate


@pytest.fixture(scope="module")
def page():
  """The page's namespace, run as written. The page runs when a test asks for it, not when the
  module is collected: every test worker collects every module, and the page's example samples
  (about 5 s of each worker's collection, 2026-11-30)."""
  return docs_blocks.run_page("docs/bring_your_own_model.md")


@pytest.fixture(scope="module")
def MyLM(page):
  """The page's model class."""
  return page["MyLM"]


def test_the_page_runs_as_written(page):
  """The page's own example (test_docs.py leaves this page to this file)."""
  assert page["out"].tokens.shape == (2, 4 + 16)
  assert "tokens_per_target_call" in page["out"].summary()


@pytest.mark.slow
def test_a_users_own_flax_model_runs_speculatively(MyLM):
  target = MyLM(50, 2, 2, 8, rngs=nnx.Rngs(0))
  draft = MyLM(50, 1, 2, 8, rngs=nnx.Rngs(1))
  prompts = np.array([[5, 9, 14, 3], [8, 8, 31, 0]])
  lengths = np.array([4, 3])
  # The cache is right: T tokens in one call equal T one-token calls.
  tokens = jnp.array([[5, 9, 14, 3]])
  whole, _ = target(tokens, jnp.arange(4)[None], target.init_cache(1, 8))
  cache, steps = target.init_cache(1, 8), []
  for t in range(4):
    logits, cache = target(tokens[:, t : t + 1], jnp.array([[t]]), cache)
    steps.append(logits)
  np.testing.assert_allclose(whole, jnp.concatenate(steps, axis=1), rtol=1e-5, atol=1e-5)
  # Greedy speculative output is the autoregressive output, token for token.
  ar = generate(target, prompts, lengths, jax.random.key(0), max_new_tokens=12, temperature=0)
  out = speculative_generate(
    target,
    draft,
    prompts,
    lengths,
    jax.random.key(0),
    max_new_tokens=12,
    num_draft_tokens=3,
    temperature=0,
  )
  np.testing.assert_array_equal(out.tokens, ar.tokens)
  # The target as its own draft: every proposal is accepted.
  same = speculative_generate(
    target,
    target,
    prompts,
    lengths,
    jax.random.key(0),
    max_new_tokens=12,
    num_draft_tokens=3,
    temperature=0,
  )
  np.testing.assert_array_equal(same.tokens, ar.tokens)
  assert same.summary()["acceptance_rate"] == 1.0
