"""The autoregressive generator: one on-device loop, ragged batches, EOS, exact sampling."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from bigram import random_bigram

from specsamp.sampling import autoregressive, generate, warping
from specsamp.testing import exactness

PROMPTS = np.array([[5, 9, 14, 3, 22, 7, 40], [8, 8, 31, 0, 0, 0, 0], [60, 2, 17, 90, 11, 0, 0]])
LENGTHS = np.array([7, 3, 5])


def test_greedy_is_deterministic_and_ignores_the_key(tiny_model):
  a = generate(tiny_model, PROMPTS, LENGTHS, jax.random.key(0), max_new_tokens=10, temperature=0)
  b = generate(tiny_model, PROMPTS, LENGTHS, jax.random.key(1), max_new_tokens=10, temperature=0)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_array_equal(a.num_generated, [10, 10, 10])
  np.testing.assert_array_equal(a.lengths, LENGTHS + 10)
  assert int(a.model_calls) == 10  # prefill + 9 one-token steps
  for row, length in enumerate(LENGTHS):  # the prompt is kept, padding is pad_id
    np.testing.assert_array_equal(a.tokens[row, :length], PROMPTS[row, :length])
    assert np.all(np.asarray(a.tokens[row, length + 10 :]) == 0)


def test_ragged_batch_rows_equal_each_prompt_alone(tiny_model):
  batch = generate(tiny_model, PROMPTS, LENGTHS, jax.random.key(0), max_new_tokens=8, temperature=0)
  for row, length in enumerate(LENGTHS):
    alone = generate(
      tiny_model,
      PROMPTS[row : row + 1, :length],
      [length],
      jax.random.key(0),
      max_new_tokens=8,
      temperature=0,
    )
    np.testing.assert_array_equal(batch.generated(row), alone.generated(0))


def test_eos_stops_each_row_independently(tiny_model):
  free = generate(tiny_model, PROMPTS, LENGTHS, jax.random.key(0), max_new_tokens=12, temperature=0)
  eos = int(free.generated(0)[2])  # row 0 emits it at its third step
  out = generate(
    tiny_model,
    PROMPTS,
    LENGTHS,
    jax.random.key(0),
    max_new_tokens=12,
    temperature=0,
    eos_id=eos,
    pad_id=-1,
  )
  for row in range(len(LENGTHS)):
    expected = list(free.generated(row))
    if eos in expected:
      expected = expected[: expected.index(eos) + 1]
    np.testing.assert_array_equal(out.generated(row), expected)
    assert np.all(np.asarray(out.tokens[row, int(out.lengths[row]) :]) == -1)
  assert int(out.num_generated[0]) == 3


def test_generation_is_one_while_loop_on_device(tiny_model):
  from specsamp.sampling import model_protocol

  static, dynamic = model_protocol.split_model(tiny_model)
  loop = autoregressive.AutoregressiveLoop(
    model_static=static,
    max_new_tokens=4,
    sampling=warping.SamplingConfig(0.8),
    eos_id=2,
    pad_id=0,
    cache_length=12,
  )
  jaxpr = jax.make_jaxpr(loop)(
    dynamic, jnp.asarray(PROMPTS), jnp.asarray(LENGTHS), jax.random.key(0)
  )
  assert str(jaxpr).count(" while[") == 1


def test_bigram_greedy_chain():
  model = random_bigram(12, seed=0)
  out = generate(model, [[3], [7]], [1, 1], jax.random.key(0), max_new_tokens=6, temperature=0)
  table = np.asarray(model.logits_VV)
  for row, token in enumerate([3, 7]):
    chain = []
    for _ in range(6):
      token = int(np.argmax(table[token]))
      chain.append(token)
    np.testing.assert_array_equal(out.generated(row), chain)


@pytest.mark.parametrize(
  "sampling", [warping.SamplingConfig(1.0), warping.SamplingConfig(0.7, 3, 0.9)]
)
def test_bigram_samples_follow_the_exact_sequence_distribution(sampling):
  """Exact enumeration over all 3-token continuations, G-test at a fixed seed."""
  vocab, new, rows = 5, 3, 40_000
  model = random_bigram(vocab, seed=1)
  prompts = np.full((rows, 1), 2)
  out = generate(
    model,
    prompts,
    np.ones(rows),
    jax.random.key(2),
    max_new_tokens=new,
    temperature=sampling.temperature,
    top_k=sampling.top_k,
    top_p=sampling.top_p,
  )
  counts = exactness.count_continuations(np.asarray(out.tokens[:, 1 : 1 + new]), vocab)
  # By hand from the bigram's table: p(x1 | 2) p(x2 | x1) p(x3 | x2), lexicographic cells.
  step = np.asarray(warping.probabilities(model.logits_VV, sampling), np.float64)
  expected = [
    step[2, a] * step[a, b] * step[b, c] for a, b, c in itertools.product(range(vocab), repeat=new)
  ]
  test = exactness.g_test(counts, np.asarray(expected), 1e-3)
  assert not test["rejected"], test


def test_bad_input_gives_clear_errors(tiny_model):
  key = jax.random.key(0)
  with pytest.raises(ValueError, match="prompt is too long for the cache"):
    generate(tiny_model, PROMPTS, LENGTHS, key, max_new_tokens=4, cache_length=9)
  with pytest.raises(ValueError, match="top_p"):
    generate(tiny_model, PROMPTS, LENGTHS, key, max_new_tokens=4, top_p=0.0)
  with pytest.raises(ValueError, match="top_k"):
    generate(tiny_model, PROMPTS, LENGTHS, key, max_new_tokens=4, top_k=-2)
  with pytest.raises(ValueError, match="temperature"):
    generate(tiny_model, PROMPTS, LENGTHS, key, max_new_tokens=4, temperature=-1.0)
  with pytest.raises(ValueError, match="max_new_tokens"):
    generate(tiny_model, PROMPTS, LENGTHS, key, max_new_tokens=0)
  with pytest.raises(ValueError, match="prompt_lengths must be in"):
    generate(tiny_model, PROMPTS, [7, 0, 5], key, max_new_tokens=4)
  with pytest.raises(ValueError, match="prompt_lengths must have shape"):
    generate(tiny_model, PROMPTS, [7, 3], key, max_new_tokens=4)
  with pytest.raises(TypeError, match="decode protocol"):
    generate(object(), PROMPTS, LENGTHS, key, max_new_tokens=4)
