"""The KV cache: an explicit pytree with one length (next position) per row.

Slot s of a row holds the key and value of that row's token at absolute
position s. A call at positions p..p+T-1 writes slots p..p+T-1 and each query
at position p+t reads only slots <= p+t. Entries a rollback leaves behind
(rejected draft tokens) sit beyond the row's position, so they are never read
before being overwritten: rolling back is ``cache.replace(lengths=...)``, never a
copy. That is the decode protocol's rollback for every model's cache
(``specsamp.sampling.model_protocol``), so the samplers call it on this one too.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from specsamp import sharding

CACHE_AXES = ("cache_batch", "cache_sequence", "cache_kv_heads", "cache_head_dim")


@struct.dataclass
class KVCache:
  """Per-layer keys and values, and each row's length.

  Attributes:
    keys: one [B, S, K, H] array per layer.
    values: one [B, S, K, H] array per layer.
    lengths: [B] int32, tokens of each row held in the cache (the next
      position to write when a call gives no explicit positions).
  """

  keys: tuple[jax.Array, ...]
  values: tuple[jax.Array, ...]
  lengths: jax.Array

  @classmethod
  def create(
    cls,
    num_layers: int,
    batch_size: int,
    max_length: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: jnp.dtype,
  ) -> KVCache:
    """An empty cache, sharded by the rules table when a mesh is active."""
    if batch_size < 1 or max_length < 1:
      raise ValueError(
        f"Cache needs batch_size >= 1 and max_length >= 1, got {batch_size} and {max_length}."
      )
    shape = (batch_size, max_length, num_kv_heads, head_dim)

    def empty():
      return sharding.constrain(jnp.zeros(shape, dtype), CACHE_AXES)

    return cls(
      keys=tuple(empty() for _ in range(num_layers)),
      values=tuple(empty() for _ in range(num_layers)),
      lengths=jnp.zeros((batch_size,), jnp.int32),
    )

  @property
  def batch_size(self) -> int:
    return self.lengths.shape[0]

  @property
  def max_length(self) -> int:
    return self.keys[0].shape[1]


def write(cache_BSKH: jax.Array, new_BTKH: jax.Array, positions_BT: jax.Array) -> jax.Array:
  """Writes new keys or values into their rows' slots; positions past S are dropped."""
  rows_BT = jnp.broadcast_to(jnp.arange(cache_BSKH.shape[0])[:, None], positions_BT.shape)
  return cache_BSKH.at[rows_BT, positions_BT].set(new_BTKH.astype(cache_BSKH.dtype), mode="drop")
