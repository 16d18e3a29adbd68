"""Generation that drops finished rows between chunks (specsamp/sampling/compacting.py): the
same greedy tokens as the autoregressive loop, the same law when sampling, less work."""

import jax
import numpy as np
import pytest
from conftest import tiny_config

from specsamp.models import transformer
from specsamp.sampling import autoregressive, compacting, warping
from specsamp.testing import exactness

VOCAB = 32


@pytest.fixture(scope="module")
def model():
  return transformer.create(tiny_config(vocab_size=VOCAB), seed=3)


def test_greedy_rows_are_the_loops_and_finished_rows_leave_the_batch(model):
  rng = np.random.default_rng(0)
  prompts, lengths = rng.integers(1, VOCAB, (13, 9)), rng.integers(1, 10, 13)
  free = autoregressive.generate(
    model, prompts, lengths, jax.random.key(1), max_new_tokens=30, temperature=0.0
  )
  greedy = np.asarray(free.tokens)
  # An EOS that ends rows at different steps: the id most rows reach in their first 15 tokens.
  eos = max(
    range(1, VOCAB),
    key=lambda i: sum(i in greedy[b, n : n + 15] for b, n in enumerate(lengths)),
  )
  for eos_id, chunk_steps in ((eos, 4), (None, 7)):
    options = dict(max_new_tokens=30, temperature=0.0, eos_id=eos_id, pad_id=0)
    ref = autoregressive.generate(model, prompts, lengths, jax.random.key(2), **options)
    got = compacting.generate(
      model, prompts, lengths, jax.random.key(2), chunk_steps=chunk_steps, **options
    )
    np.testing.assert_array_equal(got.tokens, np.asarray(ref.tokens))
    np.testing.assert_array_equal(got.lengths, np.asarray(ref.lengths))
    np.testing.assert_array_equal(got.num_generated, np.asarray(ref.num_generated))
    assert got.steps == int(np.max(got.num_generated))
    if eos_id is None:  # Every row runs to the cap: one batch size, every row-step kept.
      assert set(got.batch_sizes) == {13} and got.row_steps == got.num_generated.sum()
    else:  # Rows ended early and left: less work than the full batch for every step.
      assert got.batch_sizes[0] == 13 and min(got.batch_sizes) < 13
      assert got.num_generated.sum() <= got.row_steps < 13 * got.steps


def _exact_law(model, prompt, sampling, eos_id, max_new_tokens):
  """{answer: probability} of every answer the warped target can give (teacher forced)."""
  law = {}

  def probs(context):
    logits = model(np.asarray([context], np.int32))
    logits = logits.logits if hasattr(logits, "logits") else logits[0]
    return np.asarray(warping.probabilities(logits[:, -1], sampling)[0], np.float64)

  frontier = [((), 1.0)]
  while frontier:
    answer, p = frontier.pop()
    if len(answer) == max_new_tokens or (answer and answer[-1] == eos_id):
      law[answer] = law.get(answer, 0.0) + p
      continue
    q = probs(list(prompt) + list(answer))
    frontier += [(answer + (t,), p * q[t]) for t in np.nonzero(q)[0]]
  return law


def test_sampled_rows_follow_the_targets_law_while_the_batch_shrinks(model):
  """Two prompts (three rows of the first to one of the second, 1,200 in all), T = 0.5 and
  top-k 3 over 3 tokens, EOS the first prompt's likeliest first token: most of its rows end at
  once and the batch halves. Each prompt's answers, counted, pass a G-test against the law
  enumerated by teacher forcing; the same answers tested against the other prompt's law fail
  (rows mixed up would)."""
  sampling = warping.SamplingConfig(0.5, 3, 1.0)
  prompts = [(3, 9, 4), (17, 5, 22)]
  first = _exact_law(model, prompts[0], sampling, None, 1)
  eos_id = max(first, key=first.get)[0]
  which = np.arange(1200) % 4 == 3  # Prompt 1's rows.
  got = compacting.generate(
    model,
    np.asarray([prompts[int(w)] for w in which]),
    np.full(len(which), 3),
    jax.random.key(7),
    max_new_tokens=3,
    temperature=0.5,
    top_k=3,
    eos_id=eos_id,
    chunk_steps=1,
  )
  assert min(got.batch_sizes) <= 600  # Halved (here after the first tokens).
  answers = [tuple(got.tokens[b, 3 : got.lengths[b]].tolist()) for b in range(len(which))]
  laws = [_exact_law(model, prompt, sampling, eos_id, 3) for prompt in prompts]
  for i, law in enumerate(laws):
    mine = [a for a, w in zip(answers, which) if int(w) == i]
    result = exactness.g_test_cells({a: mine.count(a) for a in set(mine)}, law, 1e-4)
    assert not result["rejected"] and not result["impossible"], (prompts[i], result)
    other = exactness.g_test_cells({a: mine.count(a) for a in set(mine)}, laws[1 - i], 1e-4)
    assert other["rejected"] or other["impossible"]


def test_bad_settings_are_refused(model):
  with pytest.raises(ValueError, match="chunk_steps"):
    compacting.generate(model, [[1, 2]], [2], jax.random.key(0), max_new_tokens=2, chunk_steps=0)
  with pytest.raises(ValueError, match="max_new_tokens"):
    compacting.generate(model, [[1, 2]], [2], jax.random.key(0), max_new_tokens=0)
