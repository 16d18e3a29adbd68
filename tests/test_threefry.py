"""The fused Threefry-2x32 key operations reproduce jax.random bit for bit, and compile to
straight-line code (no nested loop) inside a jitted function on the CPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsamp.experiments.proofs import hlo_ops
from specsamp.sampling import threefry

SEEDS = [0, 1, 42, 2**31 + 5, 2**32 - 1]


def _data(key):
  return np.asarray(jax.random.key_data(key))


@pytest.mark.parametrize("seed", SEEDS)
def test_fold_in_split_and_bits_equal_jax_random(seed):
  key = jax.random.key(seed)
  for data in (0, 1, 7, 2**31 + 3, 2**32 - 1):
    np.testing.assert_array_equal(
      _data(threefry.fold_in(key, data)), _data(jax.random.fold_in(key, data))
    )
  for num in (1, 2, 3, 5):
    np.testing.assert_array_equal(
      _data(threefry.split(key, num)), _data(jax.random.split(key, num))
    )
  for shape in ((1,), (2, 3), (2, 1, 1024), (3, 5, 7)):
    np.testing.assert_array_equal(
      threefry.bits(key, shape), jax.random.bits(key, shape, jnp.uint32)
    )


def test_traced_data_and_keys_inside_jit_equal_jax_random():
  @jax.jit
  def both(key, data):
    ours = threefry.bits(threefry.fold_in(threefry.split(key)[1], data), (2, 16))
    theirs = jax.random.bits(
      jax.random.fold_in(jax.random.split(key)[1], data), (2, 16), jnp.uint32
    )
    return ours, theirs

  for step in (0, 3, 1000):
    ours, theirs = both(jax.random.key(9), jnp.int32(step))
    np.testing.assert_array_equal(ours, theirs)


def test_other_key_kinds_go_through_jax_random():
  legacy = jax.random.PRNGKey(3)  # A raw uint32[2] key.
  np.testing.assert_array_equal(threefry.fold_in(legacy, 4), jax.random.fold_in(legacy, 4))
  rbg = jax.random.key(3, impl="rbg")
  np.testing.assert_array_equal(threefry.bits(rbg, (4,)), jax.random.bits(rbg, (4,), jnp.uint32))


def test_a_draw_compiles_to_no_loop_on_the_cpu():
  """JAX's own CPU lowering is a rolled while loop per call; ours is straight-line code."""

  def draw(key):
    return threefry.bits(threefry.fold_in(key, 3), (2, 64))

  def jax_draw(key):
    return jax.random.bits(jax.random.fold_in(key, 3), (2, 64), jnp.uint32)

  def loops(fn):
    hlo = jax.jit(fn).lower(jax.random.key(0)).compile().as_text()
    return sum(
      hlo_ops.opcode(line) == "while"
      for lines in hlo_ops.computations(hlo).values()
      for line in lines
    )

  assert loops(draw) == 0
  assert loops(jax_draw) >= 1  # What the fused cipher replaces (if JAX ever fuses it, drop this).
