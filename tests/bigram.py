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

  def __call__(self, tokens_BT, positions_BT, cache):
    return self.logits_VV[tokens_BT], cache.replace(lengths=positions_BT[:, -1] + 1)


def random_bigram(vocab: int, seed: int, scale: float = 1.5) -> Bigram:
  return Bigram(jax.random.normal(jax.random.key(seed), (vocab, vocab)) * scale)
