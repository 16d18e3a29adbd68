"""Exact enumeration: the target's true distribution over short continuations, and a sampler's
observed counts against it (shared by the engine and drafter exactness tests)."""

import itertools

import jax.numpy as jnp
import numpy as np
from conftest import perturbed, tiny_config

from specsamp.models import transformer
from specsamp.sampling import warping

VOCAB, NEW_TOKENS, ROWS = 8, 3, 24_000


def small_pair():
  """A target over 8 tokens and a draft that agrees with it often but not always."""
  config = tiny_config(vocab_size=VOCAB, d_model=32, num_heads=4, num_kv_heads=2, ffn_dim=64)
  target = transformer.create(config, seed=10)
  return target, perturbed(target, 0.6, seed=11)


def target_distribution(model, prompt, sampling) -> dict:
  """P(x1 x2 x3 | prompt) under the warped target, by forward passes over every prefix."""
  probs = {}
  for depth in range(NEW_TOKENS):
    prefixes = list(itertools.product(range(VOCAB), repeat=depth))
    seqs = np.array([list(prompt) + list(p) for p in prefixes])
    logits, _ = model(jnp.asarray(seqs))
    step = np.asarray(warping.probabilities(logits[:, -1], sampling), np.float64)
    for prefix, dist in zip(prefixes, step):
      probs[prefix] = dist
  return {
    seq: np.prod([probs[seq[:t]][seq[t]] for t in range(NEW_TOKENS)])
    for seq in itertools.product(range(VOCAB), repeat=NEW_TOKENS)
  }


def sample_at_temperature_one(target, draft, prompt) -> tuple[np.ndarray, dict]:
  """ROWS speculative continuations of NEW_TOKENS after ``prompt`` at T = 1, K = 3: the new
  tokens [ROWS, NEW_TOKENS] and the run's summary."""
  import jax

  from specsamp.sampling.speculative import speculative_generate

  out = speculative_generate(
    target,
    draft,
    np.tile(prompt, (ROWS, 1)),
    np.full(ROWS, len(prompt)),
    jax.random.key(0),
    max_new_tokens=NEW_TOKENS,
    num_draft_tokens=3,
    temperature=1.0,
  )
  return np.asarray(out.tokens[:, len(prompt) :]), out.summary()
