"""A bigram table model: the smallest thing that follows specsamp's decode protocol."""

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class BigramCache:
  lengths: jax.Array


@struct.dataclass
class Bigram:
  """logits of the next token depend only on the current token."""

  logits_VV: jax.Array

  @property
  def vocab_size(self) -> int:
    return self.logits_VV.shape[0]

  def init_cache(self, batch_size, max_length):
    del max_length
    return BigramCache(lengths=jnp.zeros((batch_size,), jnp.int32))

  def __call__(self, tokens_BT, positions_BT, cache, tree=None):
    lengths = positions_BT[:, -1] + 1 if tree is None else tree.root_B + tree.num_slots
    return self.logits_VV[tokens_BT], cache.replace(lengths=lengths)

  def compact_cache(self, cache, source_BD, start_B):
    del source_BD, start_B  # No keys or values: the next logits depend on the token only.
    return cache


def random_bigram(vocab: int, seed: int, scale: float = 1.5) -> Bigram:
  return Bigram(jax.random.normal(jax.random.key(seed), (vocab, vocab)) * scale)
