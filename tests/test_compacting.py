"""Generation that drops finished rows between chunks and puts waiting prompts in their places
(specsamp/sampling/compacting.py): the same greedy tokens as the autoregressive loop, the same
law when sampling, less work."""

import functools

import jax
import numpy as np
import pytest
from conftest import tiny_config
from flax import nnx

from specsamp.models import transformer
from specsamp.sampling import autoregressive, compacting, warping
from specsamp.testing import exactness

VOCAB = 32


@pytest.fixture(scope="module")
def model():
  return transformer.create(tiny_config(vocab_size=VOCAB), seed=3)


def _prompts_and_an_early_eos(model, max_new_tokens, within):
  """13 random prompts (lengths 1-9, width 9), and an EOS that ends their greedy rows at
  different steps: the id most rows reach in their first ``within`` tokens."""
  rng = np.random.default_rng(0)
  prompts, lengths = rng.integers(1, VOCAB, (13, 9)), rng.integers(1, 10, 13)
  free = autoregressive.generate(
    model, prompts, lengths, jax.random.key(1), max_new_tokens=max_new_tokens, temperature=0.0
  )
  greedy = np.asarray(free.tokens)
  eos = max(
    range(1, VOCAB),
    key=lambda i: sum(i in greedy[b, n : n + within] for b, n in enumerate(lengths)),
  )
  return prompts, lengths, eos


def test_greedy_rows_are_the_loops_and_finished_rows_leave_the_batch(model):
  prompts, lengths, eos = _prompts_and_an_early_eos(model, 30, 15)
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


def test_waiting_prompts_take_the_places_of_finished_rows_and_answer_as_the_loop(model):
  """13 prompts through a batch of 4, refilled 2 at a time at their own widths (a multiple of
  4 tokens): greedy rows equal the loop's over all 13 at once; ``on_finished`` hears of each
  prompt once, with its final row; ``admit`` stops the rest unanswered."""
  prompts, lengths, eos = _prompts_and_an_early_eos(model, 20, 8)
  options = dict(max_new_tokens=20, temperature=0.0, eos_id=eos, pad_id=0)
  ref = autoregressive.generate(model, prompts, lengths, jax.random.key(2), **options)
  for compact in (True, False):
    heard = {}

    def hear(rows, tokens, ends, heard=heard):
      for row, row_tokens, end in zip(rows, tokens, ends):
        assert row not in heard
        heard[int(row)] = (row_tokens.copy(), int(end))

    got = compacting.generate(
      model, prompts, lengths, jax.random.key(2), chunk_steps=3, batch_size=4, refill_size=2,
      width_step=4, compact=compact, on_finished=hear, **options,
    )  # fmt: skip
    np.testing.assert_array_equal(got.tokens, np.asarray(ref.tokens))
    np.testing.assert_array_equal(got.lengths, np.asarray(ref.lengths))
    assert got.admitted == 13 and got.prefills >= 1 + (13 - 4) // 2
    assert max(got.batch_sizes) == 4 and (min(got.batch_sizes) < 4) == compact
    assert sorted(heard) == list(range(13))
    for row, (row_tokens, end) in heard.items():
      np.testing.assert_array_equal(row_tokens, got.tokens[row])
      assert end == got.lengths[row]
  # admit says no at prompt 6: the first 6 answer as before, the rest come back unanswered.
  asked = []
  stopped = compacting.generate(
    model, prompts, lengths, jax.random.key(2), chunk_steps=3, batch_size=4, refill_size=2,
    admit=lambda i: asked.append(i) or i < 6, **options,
  )  # fmt: skip
  assert stopped.admitted == 6 and asked == list(range(7))
  np.testing.assert_array_equal(stopped.tokens[:6], np.asarray(ref.tokens)[:6])
  assert (stopped.num_generated[6:] == 0).all()
  np.testing.assert_array_equal(stopped.lengths[6:], lengths[6:])
  np.testing.assert_array_equal(stopped.tokens[6:, :9], np.where(
    np.arange(9)[None] < lengths[6:, None], prompts[6:], 0
  ))  # fmt: skip


@functools.partial(jax.jit, static_argnums=(0, 3))
def _next_token_probs(graphdef, state, tokens_1W, sampling, last):
  """The warped law of the token after ``tokens_1W[0, :last + 1]``: one program for every
  context of one padded width (a causal model's output at ``last`` never sees what follows)."""
  logits = nnx.merge(graphdef, state)(tokens_1W).logits
  return warping.probabilities(logits[:, last], sampling)[0]


def _exact_law(model, prompt, sampling, eos_id, max_new_tokens):
  """{answer: probability} of every answer the warped target can give (teacher forced)."""
  law = {}
  graphdef, state = nnx.split(model)
  width = len(prompt) + max_new_tokens

  def probs(context):
    padded = np.zeros((1, width), np.int32)
    padded[0, : len(context)] = context
    last = len(context) - 1
    return np.asarray(_next_token_probs(graphdef, state, padded, sampling, last), np.float64)

  frontier = [((), 1.0)]
  while frontier:
    answer, p = frontier.pop()
    if len(answer) == max_new_tokens or (answer and answer[-1] == eos_id):
      law[answer] = law.get(answer, 0.0) + p
      continue
    q = probs(list(prompt) + list(answer))
    frontier += [(answer + (t,), p * q[t]) for t in np.nonzero(q)[0]]
  return law


def _sampled_two_prompts_follow_their_laws(model, seed, **batching):
  """Two prompts (three rows of the first to one of the second, 1,200 in all), T = 0.5 and
  top-k 3 over 3 tokens, EOS the first prompt's likeliest first token, so that most of its rows
  end at once. Each prompt's answers, counted, pass a G-test against the law enumerated by
  teacher forcing; the same answers tested against the other prompt's law fail (rows mixed up
  would). Returns ``compacting.generate``'s output."""
  sampling = warping.SamplingConfig(0.5, 3, 1.0)
  prompts = [(3, 9, 4), (17, 5, 22)]
  first = _exact_law(model, prompts[0], sampling, None, 1)
  eos_id = max(first, key=first.get)[0]
  which = np.arange(1200) % 4 == 3  # Prompt 1's rows.
  got = compacting.generate(
    model,
    np.asarray([prompts[int(w)] for w in which]),
    np.full(len(which), 3),
    jax.random.key(seed),
    max_new_tokens=3,
    temperature=0.5,
    top_k=3,
    eos_id=eos_id,
    chunk_steps=1,
    **batching,
  )
  answers = [tuple(got.tokens[b, 3 : got.lengths[b]].tolist()) for b in range(len(which))]
  laws = [_exact_law(model, prompt, sampling, eos_id, 3) for prompt in prompts]
  for i, law in enumerate(laws):
    mine = [a for a, w in zip(answers, which) if int(w) == i]
    result = exactness.g_test_cells({a: mine.count(a) for a in set(mine)}, law, 1e-4)
    assert not result["rejected"] and not result["impossible"], (prompts[i], result)
    other = exactness.g_test_cells({a: mine.count(a) for a in set(mine)}, laws[1 - i], 1e-4)
    assert other["rejected"] or other["impossible"]
  return got


def test_sampled_rows_follow_the_targets_law_while_the_batch_shrinks(model):
  got = _sampled_two_prompts_follow_their_laws(model, 7)
  assert min(got.batch_sizes) <= 600  # Halved (here after the first tokens).


def test_sampled_rows_follow_the_targets_law_as_waiting_prompts_refill_the_batch(model):
  """1,200 rows through a batch of 64, refilled 16 at a time: a row that ends at its first
  token frees its place after one step, so most rows start in a refill, on the keys of the
  refills and of later steps."""
  got = _sampled_two_prompts_follow_their_laws(model, 8, batch_size=64, refill_size=16)
  assert got.admitted == 1200 and got.prefills > (1200 - 64) // 16


def test_the_memory_check_counts_the_batchs_rows_not_the_prompts(model, monkeypatch):
  """A refilled batch holds ``batch_size`` cache rows whatever the number of prompts."""
  from specsamp.sampling import memory

  asked = []

  def check_fits(parts, what):
    asked.append(what)
    raise MemoryError(what)

  monkeypatch.setattr(memory, "check_fits", check_fits)
  with pytest.raises(MemoryError):
    compacting.generate(model, [[1, 2]] * 40, [2] * 40, jax.random.key(0), max_new_tokens=2)
  with pytest.raises(MemoryError):
    compacting.generate(
      model, [[1, 2]] * 40, [2] * 40, jax.random.key(0), max_new_tokens=2, batch_size=8
    )
  assert asked == ["40 rows x 4 cache slots", "8 rows x 4 cache slots"]


def test_bad_settings_are_refused(model):
  with pytest.raises(ValueError, match="chunk_steps"):
    compacting.generate(model, [[1, 2]], [2], jax.random.key(0), max_new_tokens=2, chunk_steps=0)
  with pytest.raises(ValueError, match="max_new_tokens"):
    compacting.generate(model, [[1, 2]], [2], jax.random.key(0), max_new_tokens=0)
  with pytest.raises(ValueError, match="batch_size"):
    compacting.generate(model, [[1, 2]], [2], jax.random.key(0), max_new_tokens=2, batch_size=0)
  for batch_size, refill_size in ((4, 0), (4, 5)):
    with pytest.raises(ValueError, match="refill_size"):
      compacting.generate(
        model, [[1, 2]], [2], jax.random.key(0), max_new_tokens=2, batch_size=batch_size,
        refill_size=refill_size,
      )  # fmt: skip
  for width_step in (0, -3, 2.5):  # 0 divided by zero, -3 read as NaN logits (2026-11-30).
    with pytest.raises(ValueError, match="width_step must be None or an int >= 1"):
      compacting.generate(
        model, [[1, 2]], [2], jax.random.key(0), max_new_tokens=2, width_step=width_step
      )
  # 2.5 failed inside JAX as a shape, or was cut by int() (2026-11-30).
  for name in ("batch_size", "refill_size", "chunk_steps"):
    with pytest.raises(ValueError, match=f"{name} must be (None or )?an int >= 1, got 2.5"):
      compacting.generate(model, [[1, 2]], [2], jax.random.key(0), max_new_tokens=2, **{name: 2.5})


def test_the_regeneration_benchmark_times_three_ways_that_answer_alike(model):
  """specsamp/experiments/benchmarks/regeneration.py on 12 prompts in batches of 4: the three
  ways give the same greedy answers, and the whole batch computes the most row-steps."""
  from specsamp.experiments.benchmarks import regeneration

  rng = np.random.default_rng(5)
  rows = sorted(
    (rng.integers(1, VOCAB, n).astype(np.int32) for n in rng.integers(1, 9, 12)), key=len
  )
  free = autoregressive.generate(
    model, [list(r) + [0] * (8 - len(r)) for r in rows], [len(r) for r in rows],
    jax.random.key(1), max_new_tokens=12, temperature=0.0,
  )  # fmt: skip
  eos = int(np.bincount(np.asarray(free.tokens)[:, 8:].ravel(), minlength=VOCAB)[1:].argmax()) + 1
  options = dict(max_new_tokens=12, temperature=0.0, eos_id=eos, pad_id=0)
  lines = []
  result = regeneration.measure(model, rows, 4, options, log=lines.append)
  assert result["greedy_answers_equal"] and len(lines) == 3
  whole = result["whole batch"]["row_steps"]
  assert whole >= result["finished rows leave"]["row_steps"]
  assert whole >= result["waiting prompts refill"]["row_steps"]
  assert result["answer_tokens"] <= min(result[name]["row_steps"] for name in regeneration.WAYS)


def test_nan_logits_stop_the_run_before_any_row_is_handed_on(model):
  """A diverged model's rows were drawn from NaN logits (token 0 each step) and handed to
  ``on_finished`` as answers; now the first look at the batch raises, naming the prompts."""
  import jax.numpy as jnp

  broken = transformer.create(tiny_config(vocab_size=VOCAB), seed=3)
  broken.final_norm.scale_D[...] = jnp.full_like(broken.final_norm.scale_D[...], jnp.nan)
  prompts, lengths, _ = _prompts_and_an_early_eos(model, 8, 4)
  finished = []
  with pytest.raises(
    FloatingPointError, match=r"NaN logits from the model for prompts \[0, 1, 2, 3\]"
  ):
    compacting.generate(
      broken, prompts, lengths, jax.random.key(0), max_new_tokens=8, batch_size=4,
      refill_size=2, on_finished=lambda *rows: finished.append(rows),
    )  # fmt: skip
  assert not finished


@pytest.mark.parametrize("max_new_tokens", [1, 8])
def test_nan_logits_of_a_refilled_row_name_its_prompt(model, max_new_tokens):
  """A waiting prompt whose prefill gives NaN (its one token whose embedding is NaN) is named
  when it comes in as a refill, after the rows before it were answered and handed on; with
  one new token its row ends at the refill itself, before any decode step could see it."""
  import jax.numpy as jnp

  prompts, lengths, _ = _prompts_and_an_early_eos(model, 8, 4)
  options = dict(max_new_tokens=max_new_tokens, temperature=0.0)
  clean = np.asarray(
    autoregressive.generate(model, prompts, lengths, jax.random.key(0), **options).tokens
  )
  unused = min(set(range(VOCAB)) - set(clean.ravel().tolist()))  # In no prompt or answer.
  broken = transformer.create(tiny_config(vocab_size=VOCAB), seed=3)  # The same weights...
  table = broken.embedder.table_VD[...]
  broken.embedder.table_VD[...] = table.at[unused].set(jnp.nan)  # ...but one token's row.
  prompts = prompts.copy()
  prompts[9, 0] = unused  # Prompt 9 waits: the batch of 4 starts with prompts 0-3.
  finished = []
  with pytest.raises(FloatingPointError, match=r"for prompts \[9\]"):
    compacting.generate(
      broken, prompts, lengths, jax.random.key(0), batch_size=4, refill_size=2,
      on_finished=lambda rows, *_: finished.extend(rows.tolist()), **options,
    )  # fmt: skip
  assert finished and 9 not in finished and set(finished) <= set(range(9))
