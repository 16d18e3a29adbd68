"""Temperature, top-k and top-p against float64 NumPy references."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsamp.sampling import SamplingConfig, probabilities, sample, warp_logits
from specsamp.sampling.warping import MIN_TEMPERATURE


def _logits(seed=0, batch=4, vocab=50):
  return jax.random.normal(jax.random.key(seed), (batch, vocab)) * 3.0


def _reference(logits, temperature=1.0, top_k=0, top_p=1.0):
  """float64 NumPy: scale, top-k, then smallest prefix (stable sort) with mass >= top_p."""
  logits = np.asarray(logits, np.float64) / temperature
  out = np.zeros_like(logits)
  for row, values in enumerate(logits):
    order = np.argsort(-values, kind="stable")
    keep = np.zeros(len(values), bool)
    keep[order[: top_k or len(values)]] = True
    probs = np.where(keep, np.exp(values - values.max()), 0.0)
    probs /= probs.sum()
    mass, chosen = 0.0, np.zeros(len(values), bool)
    for token in order:
      if not keep[token] or mass >= top_p:
        break
      chosen[token] = True
      mass += probs[token]
    p = np.where(chosen, probs, 0.0)
    out[row] = p / p.sum()
  return out


@pytest.mark.parametrize("top_k", [1, 3, 17])
def test_top_k_keeps_exactly_k_even_with_ties(top_k):
  logits = jnp.round(_logits(1))  # many ties
  kept = np.isfinite(warp_logits(logits, SamplingConfig(1.0, top_k, 1.0)))
  np.testing.assert_array_equal(kept.sum(-1), top_k)
  np.testing.assert_allclose(
    probabilities(logits, SamplingConfig(1.0, top_k, 1.0)),
    _reference(logits, top_k=top_k),
    atol=1e-6,
  )


@pytest.mark.parametrize("top_p", [0.05, 0.5, 0.9, 0.999, 1.0])
def test_top_p_keeps_smallest_set_with_mass_at_least_p(top_p):
  logits = _logits(2)
  probs = np.asarray(probabilities(logits, SamplingConfig(1.0, 0, top_p)))
  np.testing.assert_allclose(probs, _reference(logits, top_p=top_p), atol=1e-6)
  full = np.asarray(jax.nn.softmax(logits), np.float64)
  for row in range(len(probs)):
    kept = probs[row] > 0
    assert full[row][kept].sum() >= top_p - 1e-6
    # Dropping the least likely kept token would fall below top_p: the set is minimal.
    assert full[row][kept].sum() - full[row][kept].min() < top_p


def test_temperature_top_k_top_p_compose():
  logits = _logits(3)
  sampling = SamplingConfig(0.7, 10, 0.8)
  np.testing.assert_allclose(
    probabilities(logits, sampling), _reference(logits, 0.7, 10, 0.8), atol=1e-6
  )


def test_temperature_to_zero_is_argmax():
  logits = _logits(4)
  argmax = np.argmax(np.asarray(logits), -1)
  np.testing.assert_allclose(
    probabilities(logits, SamplingConfig(0.0)), np.eye(logits.shape[-1])[argmax]
  )
  near_zero = probabilities(logits, SamplingConfig(1e-3))
  np.testing.assert_array_equal(np.argmax(near_zero, -1), argmax)
  assert np.all(np.max(near_zero, -1) > 0.999)
  np.testing.assert_array_equal(sample(jax.random.key(0), logits, SamplingConfig(0.0)), argmax)
  # Compiled, down to the smallest temperature allowed: the argmax with probability 1 (a
  # softmax of logits / T fused into one multiply-add gave NaN from T = 1e-9, and token 0).
  for temperature in (1e-6, 1e-9, 1e-30, MIN_TEMPERATURE):
    sampling = SamplingConfig(temperature, top_p=0.9)
    tiny = jax.jit(lambda x, s=sampling: probabilities(x, s))(logits)
    np.testing.assert_array_equal(tiny, np.eye(logits.shape[-1])[argmax])
    drawn = jax.jit(lambda k, x, s=sampling: sample(k, x, s))(jax.random.key(1), logits)
    np.testing.assert_array_equal(drawn, argmax)
  with pytest.raises(ValueError, match="temperature must be 0 .greedy. or at least 1.175e-38"):
    SamplingConfig(MIN_TEMPERATURE / 2)


def test_sample_follows_the_warped_distribution():
  logits = jnp.tile(_logits(5, batch=1, vocab=6), (20000, 1))
  sampling = SamplingConfig(0.9, 4, 0.9)
  tokens = np.asarray(sample(jax.random.key(1), logits, sampling))
  counts = np.bincount(tokens, minlength=6) / len(tokens)
  expected = _reference(logits[:1], 0.9, 4, 0.9)[0]
  assert np.all(counts[expected == 0] == 0)
  np.testing.assert_allclose(counts, expected, atol=0.015)


@pytest.mark.parametrize("greedy", [True, False])
def test_sample_refuses_logits_that_are_no_distribution(greedy):
  """NaN, +inf, or -inf at every token: called eagerly, an error naming the rows, where it drew
  token 0 silently; under jit it cannot raise (the loops check ``has_nan``). A -inf entry alone
  is a masked token and stays allowed."""
  sampling = SamplingConfig(0.0 if greedy else 1.0)
  logits = np.zeros((5, 4), np.float32)
  logits[0, 1] = -np.inf  # Masked: fine.
  logits[2, 3] = np.nan
  logits[3] = -np.inf
  logits[4, 0] = np.inf
  with pytest.raises(FloatingPointError, match=r"rows \[2, 3, 4\]"):
    sample(jax.random.key(0), jnp.asarray(logits), sampling)
  ok = np.asarray(sample(jax.random.key(0), jnp.asarray(logits[:2]), sampling))
  assert ok.shape == (2,) and ok[0] != 1
  jitted = jax.jit(sample, static_argnums=2)(jax.random.key(0), jnp.asarray(logits), sampling)
  assert jitted.shape == (5,)


@pytest.mark.parametrize(
  "kwargs,message",
  [
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_p=float("nan")), "top_p"),
    (dict(top_k=-1), "top_k"),
    (dict(top_k=2.5), "top_k"),
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=float("inf")), "temperature"),
  ],
)
def test_invalid_sampling_params_are_refused(kwargs, message):
  with pytest.raises(ValueError, match=message):
    SamplingConfig(**kwargs)


def _sorted_nucleus(logits_V: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
  """float64 reference: (kept, mass before each token in sorted order, ties by token id)."""
  probs = np.exp(logits_V - logits_V.max())
  probs /= probs.sum()
  order = np.lexsort((np.arange(len(probs)), -probs))
  before = np.empty_like(probs)
  before[order] = np.cumsum(probs[order]) - probs[order]
  return before < top_p, before


@pytest.mark.parametrize("vocab", [8, 1024, 16384])
def test_nucleus_without_sorting_matches_the_sorted_definition(vocab):
  """The bisection nucleus equals the sorted one (ties by token id, in float64) for every
  token whose mass before is not within float32 rounding of top_p. At 16,384 tokens the
  nucleus is looked for in the most likely blocks first: peaked rows find it there, flat rows
  search the whole vocabulary, and both kinds are in the batch."""
  from specsamp.sampling import warping

  rng = np.random.default_rng(vocab)
  rows = 40 if vocab < 16384 else 16
  scale = (0.3 + np.arange(rows) % 6) * (1 if vocab < 16384 else 2)
  logits = rng.normal(size=(rows, 8, vocab)) * scale[:, None, None]
  logits[::4] = np.round(logits[::4])  # Many exact ties, at the boundary too.
  logits = logits.reshape(-1, vocab).astype(np.float32)
  mask = jax.jit(warping.nucleus_mask, static_argnums=1)
  if vocab >= 4 * warping.NUCLEUS_BLOCKS * warping.NUCLEUS_BLOCK:
    probs = jax.nn.softmax(jnp.asarray(logits), axis=-1)
    keys = jax.lax.bitcast_convert_type(probs, jnp.int32)
    found = np.asarray(warping._nucleus_in_top_blocks(keys, probs, 0.95)[2])
    assert 0 < found.sum() < len(found)  # Both ways, in one batch.
  checked = 0
  # Each row's mass before each token does not depend on top_p: sorted once per row.
  befores = [_sorted_nucleus(row.astype(np.float64), 1.0)[1] for row in logits]
  for top_p in (1e-6, 0.3, 0.9, 0.95, 0.999):
    ours = np.asarray(mask(jnp.asarray(logits), top_p))
    assert ours.any(-1).all()  # Never empty: the most likely token is always kept.
    for row, before in enumerate(befores):
      kept = before < top_p
      clear = np.abs(before - top_p) > 1e-5
      np.testing.assert_array_equal(ours[row][clear], kept[clear])
      checked += int(clear.sum())
  assert checked > 0.95 * logits.size * 5  # Nearly every token is clear of the boundary.


def test_nucleus_keeps_tied_tokens_in_token_id_order_when_the_cut_falls_among_them():
  """Ten tokens tied at the threshold, the cut after the third of them: exactly the three with
  the smallest ids are kept, in a row of a batch whose other row keeps all its tied tokens,
  in the whole vocabulary and in the most likely blocks."""
  from specsamp.sampling import warping

  for vocab in (64, 16384):
    logits = np.full((2, vocab), -30.0, np.float32)
    ties = np.array([5, 9, 17, 33, 40, 41, 50, 60, 61, 63]) * (vocab // 64)
    logits[:, ties] = 0.0  # Ten tokens of mass about 0.1 each.
    logits[1, 0] = 5.0  # Row 1: one token holds 0.94; the cut is above the ties.
    ours = np.asarray(jax.jit(warping.nucleus_mask, static_argnums=1)(jnp.asarray(logits), 0.25))
    np.testing.assert_array_equal(np.flatnonzero(ours[0]), ties[:3])
    kept, _ = _sorted_nucleus(logits[1].astype(np.float64), 0.25)
    np.testing.assert_array_equal(ours[1], kept)


def test_top_k_without_sorting_matches_a_stable_sort():
  """The bit-by-bit threshold keeps exactly the first k of a stable descending sort: exact
  ties (at the boundary too), -inf entries, negative and positive logits, rows with fewer
  than k finite values."""
  from specsamp.sampling.warping import top_k_mask

  rng = np.random.default_rng(0)
  logits = (rng.normal(size=(24, 3000)) * 4).astype(np.float32)
  logits[::3] = np.round(logits[::3])  # Many ties.
  logits[1::4, rng.integers(0, 3000, 500)] = -np.inf
  logits[2, 3:] = -np.inf  # Three finite values only.
  logits[5] = -0.0  # Every token tied.
  logits[7, :10], logits[7, 10:20], logits[7, 20:] = -0.0, 0.0, -1.0  # -0.0 ties with 0.0.
  mask = jax.jit(top_k_mask, static_argnums=1)
  for k in (1, 4, 50, 2999):
    ours = np.asarray(mask(jnp.asarray(logits), k))
    for row, values in enumerate(logits):
      expected = np.zeros(len(values), bool)
      expected[np.argsort(-values, kind="stable")[:k]] = True
      np.testing.assert_array_equal(ours[row], expected, err_msg=f"k={k} row={row}")


def test_warping_benchmark_times_both_nucleus_ways_on_the_same_tokens():
  """scripts/benchmark_warping.py's measure: both ways of the nucleus keep the same tokens on
  Zipf-like rows, which find their nucleus in the blocks, while flat rows (T = 50) do not."""
  from specsamp.experiments.benchmarks import warping_cost

  logits = warping_cost.zipf_logits(2, 16384, 1.5)
  (peaked,) = warping_cost.measure(logits, [2], 0.8, 0.95, repeats=1)
  (flat,) = warping_cost.measure(logits, [2], 50.0, 0.95, repeats=1)
  assert peaked["same_tokens"] and flat["same_tokens"]
  assert (peaked["rows_found_in_blocks"], flat["rows_found_in_blocks"]) == (2, 0)
  assert all(peaked[k] > 0 for k in ("nucleus_blocks_first_ms", "nucleus_whole_vocabulary_ms"))


def test_a_tpu_compiles_the_whole_vocabulary_search_and_a_cpu_the_blocks():
  """``nucleus_mask``'s default takes the blocks on a CPU only: compiled for a TPU v5e (no TPU
  needed) it costs what the whole-vocabulary search costs, and on this CPU it differs."""
  from specsamp.experiments.proofs import aot
  from specsamp.sampling import warping

  aot.quiet_libtpu()
  logits = jax.ShapeDtypeStruct((2, 16384), jnp.float32)

  def cost(device, blocks_first):
    where = jax.sharding.SingleDeviceSharding(device)
    run = functools.partial(warping.nucleus_mask, top_p=0.9, blocks_first=blocks_first)
    compiled = jax.jit(run, in_shardings=where, out_shardings=where).lower(logits).compile()
    analysis = compiled.cost_analysis()
    analysis = analysis if isinstance(analysis, dict) else analysis[0]
    return analysis["bytes accessed"], analysis["flops"]

  tpu = aot.slice_devices("v5e-4")[0]
  assert cost(tpu, None) == cost(tpu, False) != cost(tpu, True)
  cpu = jax.devices("cpu")[0]
  assert cost(cpu, None) == cost(cpu, True) != cost(cpu, False)
