r"""Threefry-2x32 key operations as plain array math: ``fold_in``, ``split`` and ``bits``.

The samplers draw every random number from JAX's default PRNG, Threefry-2x32
(Salmon et al. 2011, "Parallel random numbers: as easy as 1, 2, 3"): 20 rounds of
add / rotate / xor on two 32-bit words, keyed by two words. JAX's CPU lowering of that
cipher is a *rolled* loop (``lax.fori_loop`` over its 5 four-round groups, 16 operations
each), chosen there to keep compile times down; inside a sampler's loop that makes every
``fold_in``, ``split`` and ``random.bits`` call a nested ``while`` of ~80 launched kernels.
A speculative iteration makes about 2K + 6 of them, which measured as most of its cost on a
CPU beyond the models (docs/benchmarks.md, "The lean loop").

Here the same cipher is written out in ``jax.numpy`` (a pure function of the words), so XLA
fuses each call into one kernel on every backend. The three key operations reproduce JAX's
own bit for bit (``jax_threefry_partitionable``, JAX's default, counter layout); the tests
compare them with ``jax.random`` on many keys and shapes. Keys of any other PRNG
implementation, or a JAX configured with the legacy counter layout, go through
``jax.random`` unchanged.

  fold_in(key, data)     jax.random.fold_in
  split(key, num)        jax.random.split (1-D)
  bits(key, shape)       jax.random.bits(key, shape, uint32)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)  # Threefry's key-schedule constant.


def check_key(key: object) -> None:
  """Refuses, in one line, an ``rng`` that is not a JAX random key: a seed (0 failed as "invalid
  PRNG key data" inside JAX) or None (an AttributeError). A typed key (``jax.random.key``) and
  raw key data (``jax.random.PRNGKey``, a NumPy copy of one) pass."""
  if key is None or isinstance(key, (bool, int, float, np.number)) or not hasattr(key, "dtype"):
    raise TypeError(f"rng must be a JAX random key, e.g. jax.random.key(0), got {key!r}.")


def _rotate_left(x: jax.Array, distance: int) -> jax.Array:
  return (x << np.uint32(distance)) | (x >> np.uint32(32 - distance))


# One jitted function: a sampler loop calls the cipher 40-50 times, and written out each call is
# ~130 operations that JAX traced again at every call site (57% of a certificate loop's
# equations, 2026-11-26). As a nested jit it is traced once per shape and each call site is one
# call, which XLA inlines before fusing: the same kernels, a loop traced in 1.15 s instead of
# 1.9 s (docs/benchmarks.md, "The test suite's time").
@jax.jit
def cipher(
  key0: jax.Array, key1: jax.Array, x0: jax.Array, x1: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """Threefry-2x32 with 20 rounds: encrypts the counter pairs (x0, x1) under (key0, key1).

  All uint32; the counters broadcast against the key words. Five groups of four rounds,
  each followed by a key injection from the schedule (key0, key1, key0 ^ key1 ^ parity).
  """
  schedule = (key0, key1, key0 ^ key1 ^ _PARITY)
  x0 = x0 + schedule[0]
  x1 = x1 + schedule[1]
  for group in range(5):
    for rotation in _ROTATIONS[group % 2]:
      x0 = x0 + x1
      x1 = _rotate_left(x1, rotation) ^ x0
    x0 = x0 + schedule[(group + 1) % 3]
    x1 = x1 + schedule[(group + 2) % 3] + np.uint32(group + 1)
  return x0, x1


def _is_threefry(key: jax.Array) -> bool:
  """Whether ``key`` is a typed Threefry key this module reproduces JAX's operations on."""
  return (
    jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    and str(jax.random.key_impl(key)) == "threefry2x32"
    and bool(jax.config.jax_threefry_partitionable)
  )


def _words(key: jax.Array) -> tuple[jax.Array, jax.Array]:
  data = jax.random.key_data(key)
  return data[..., 0], data[..., 1]


def _wrap(word0: jax.Array, word1: jax.Array) -> jax.Array:
  return jax.random.wrap_key_data(jnp.stack([word0, word1], axis=-1), impl="threefry2x32")


def _counters(size: int) -> tuple[jax.Array, jax.Array]:
  """The 64-bit counters 0..size-1 as (high, low) uint32 words (JAX's partitionable layout)."""
  if size >= 2**32:
    raise ValueError(f"At most 2^32 - 1 random words per call, got {size}.")
  return jnp.zeros((size,), jnp.uint32), jnp.arange(size, dtype=jnp.uint32)


def fold_in(key: jax.Array, data: int | jax.Array) -> jax.Array:
  """``jax.random.fold_in(key, data)`` for a scalar key: a new key from the key and a 32-bit
  integer."""
  if not _is_threefry(key) or key.shape:
    return jax.random.fold_in(key, data)
  key0, key1 = _words(key)
  # JAX encrypts the seed words (data >> 32, data & 0xFFFFFFFF) = (0, data) as one pair.
  data = jnp.asarray(data, dtype=jnp.uint32)
  word0, word1 = cipher(key0, key1, jnp.uint32(0), data)
  return _wrap(word0, word1)


def split(key: jax.Array, num: int = 2) -> jax.Array:
  """``jax.random.split(key, num)`` for a scalar key: [num] keys."""
  if not _is_threefry(key) or key.shape:
    return jax.random.split(key, num)
  key0, key1 = _words(key)
  high, low = _counters(num)
  word0, word1 = cipher(key0, key1, high, low)
  return _wrap(word0, word1)


def bits(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """``jax.random.bits(key, shape, jnp.uint32)`` for a scalar key: uniform uint32 words."""
  if not _is_threefry(key) or key.shape:
    return jax.random.bits(key, shape, jnp.uint32)
  key0, key1 = _words(key)
  size = int(np.prod(shape, dtype=np.int64))
  high, low = _counters(size)
  word0, word1 = cipher(key0, key1, high, low)
  return (word0 ^ word1).reshape(shape)
