"""docs/bring_your_own_model.md's example, run: a user's own Flax NNX model (not specsamp's
Transformer) wrapped in the decode protocol, used as target and draft."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from specsamp.sampling import generate, speculative_generate


@struct.dataclass
class MyCache:
  keys: jax.Array  # [L, B, S, H, D]
  values: jax.Array  # [L, B, S, H, D]
  lengths: jax.Array  # [B] int32: the one field specsamp touches


class MyBlock(nnx.Module):
  """Attention over a cache written at the given positions, then an MLP."""

  def __init__(self, heads, dim, *, rngs):
    width = heads * dim
    self.heads, self.dim = heads, dim
    self.qkv = nnx.Linear(width, 3 * width, rngs=rngs)
    self.proj = nnx.Linear(width, width, rngs=rngs)
    self.mlp = nnx.Linear(width, width, rngs=rngs)

  def __call__(self, x, positions, keys, values):
    batch, length, _ = x.shape
    q, k, v = (
      a.reshape(batch, length, self.heads, self.dim) for a in jnp.split(self.qkv(x), 3, axis=-1)
    )
    rows = jnp.arange(batch)[:, None]
    keys, values = keys.at[rows, positions].set(k), values.at[rows, positions].set(v)
    scores = jnp.einsum("bthd,bshd->bhts", q, keys) / self.dim**0.5
    # Slots after a query's position (the future, or entries a rollback left) are never read.
    visible = jnp.arange(keys.shape[1])[None, None, :] <= positions[:, :, None]
    scores = jnp.where(visible[:, None], scores, -1e30)
    attended = jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(scores, -1), values)
    x = x + self.proj(attended.reshape(batch, length, -1))
    return x + jax.nn.gelu(self.mlp(x)), keys, values


class MyLM(nnx.Module):
  def __init__(self, vocab, layers, heads, dim, *, rngs):
    self.vocab_size = vocab
    self.layers, self.heads, self.dim = layers, heads, dim
    self.embed = nnx.Embed(vocab, heads * dim, rngs=rngs)
    self.blocks = nnx.List([MyBlock(heads, dim, rngs=rngs) for _ in range(layers)])
    self.out = nnx.Linear(heads * dim, vocab, rngs=rngs)

  def init_cache(self, batch_size, max_length):
    shape = (self.layers, batch_size, max_length, self.heads, self.dim)
    return MyCache(jnp.zeros(shape), jnp.zeros(shape), jnp.zeros((batch_size,), jnp.int32))

  def __call__(self, tokens_BT, positions_BT, cache):
    x = self.embed(tokens_BT)
    keys, values = [], []
    for i, block in enumerate(self.blocks):
      x, k, v = block(x, positions_BT, cache.keys[i], cache.values[i])
      keys.append(k)
      values.append(v)
    logits = self.out(x).astype(jnp.float32)
    return logits, MyCache(jnp.stack(keys), jnp.stack(values), positions_BT[:, -1] + 1)


def test_a_users_own_flax_model_runs_speculatively():
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
