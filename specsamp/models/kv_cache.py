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
STACKED_CACHE_AXES = ("cache_layers", *CACHE_AXES)  # All layers' caches in one array.


@struct.dataclass
class KVCache:
  """Every layer's keys and values, stacked, and each row's length.

  The layers are stacked on a leading axis, as the blocks' parameters are, so a scan over
  the layers takes each layer's cache as its slice.

  Attributes:
    keys: [L, B, S, K, H].
    values: [L, B, S, K, H].
    lengths: [B] int32, tokens of each row held in the cache (the next
      position to write when a call gives no explicit positions).
  """

  keys: jax.Array
  values: jax.Array
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
    shape = (num_layers, batch_size, max_length, num_kv_heads, head_dim)

    def empty():
      return sharding.constrain(jnp.zeros(shape, dtype), STACKED_CACHE_AXES)

    return cls(keys=empty(), values=empty(), lengths=jnp.zeros((batch_size,), jnp.int32))

  @property
  def batch_size(self) -> int:
    return self.lengths.shape[0]

  @property
  def max_length(self) -> int:
    return self.keys.shape[2]

  @property
  def num_layers(self) -> int:
    return self.keys.shape[0]

  def take_rows(self, rows_b: jax.Array) -> KVCache:
    """The cache of these rows (indices [b] into this batch), in their order."""
    return self.replace(
      keys=self.keys[:, rows_b], values=self.values[:, rows_b], lengths=self.lengths[rows_b]
    )

  def put_rows(self, rows_n: jax.Array, other: KVCache) -> KVCache:
    """This cache with its rows ``rows_n`` replaced, every slot, by ``other``'s rows in order
    (``other`` has n rows and the same slots); an index past the batch is dropped (padding)."""
    return self.replace(
      keys=self.keys.at[:, rows_n].set(other.keys, mode="drop"),
      values=self.values.at[:, rows_n].set(other.values, mode="drop"),
      lengths=self.lengths.at[rows_n].set(other.lengths, mode="drop"),
    )


def write(
  cache_LBSKH: jax.Array, layer: jax.Array | int, new_BTKH: jax.Array, positions_BT: jax.Array
) -> jax.Array:
  """Writes one layer's new keys or values into their rows' slots, in place; positions past
  S are dropped."""
  rows_BT = jnp.broadcast_to(jnp.arange(cache_LBSKH.shape[1])[:, None], positions_BT.shape)
  return cache_LBSKH.at[layer, rows_BT, positions_BT].set(
    new_BTKH.astype(cache_LBSKH.dtype), mode="drop"
  )


def compact(cache: KVCache, source_BD: jax.Array, start_B: jax.Array) -> KVCache:
  """Copies every layer's slot ``source_BD[b, j]`` to slot ``start_B[b] + j`` of row b.

  After a tree call, the accepted path's nodes sit wherever the tree put them; this moves
  them to the row's consecutive positions (all reads happen before the writes, so a source
  may overlap a destination). Slots past the accepted path receive copies of other nodes
  and lie beyond the row's new length, where they are never read. The lengths are kept.
  """

  def move(cache_LBSKH):
    sources = jnp.take_along_axis(
      cache_LBSKH, source_BD[None, :, :, None, None].astype(jnp.int32), axis=2
    )  # [L, B, D, K, H]
    depth = source_BD.shape[1]
    rows_BD = jnp.broadcast_to(jnp.arange(cache_LBSKH.shape[1])[:, None], source_BD.shape)
    slots_BD = start_B[:, None] + jnp.arange(depth)
    return cache_LBSKH.at[:, rows_BD, slots_BD].set(sources, mode="drop")

  return cache.replace(keys=move(cache.keys), values=move(cache.values))
