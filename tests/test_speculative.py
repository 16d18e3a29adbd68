"""Speculative sampling: greedy identity, exact distributions, statistics, sharding, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from bigram import random_bigram
from conftest import sampled_counts, tiny_config

from specsamp import sharding
from specsamp.models import transformer
from specsamp.sampling import (
  draft_length,
  drafters,
  generate,
  model_protocol,
  speculative,
  speculative_generate,
  warping,
)
from specsamp.testing import exactness

PROMPTS = np.array(
  [
    [5, 9, 14, 3, 22, 7, 40],
    [8, 8, 31, 0, 0, 0, 0],
    [60, 2, 17, 90, 11, 0, 0],
    [1, 0, 0, 0, 0, 0, 0],
  ]
)
LENGTHS = np.array([7, 3, 5, 1])


@pytest.fixture(scope="module")
def target():
  return transformer.create(tiny_config(), seed=0)


@pytest.fixture(scope="module")
def drafts(target):
  """A draft equal to the target, an unrelated one, and one that agrees often."""
  unrelated = transformer.create(tiny_config(num_layers=1), seed=1)
  return {
    "same": target,
    "unrelated": unrelated,
    "close": exactness.noisy_copy(target, 0.1, seed=4),
  }


@pytest.mark.parametrize(
  "draft_name,num_draft_tokens",
  [("same", 3), ("unrelated", 3), ("close", 3), ("close", 1), ("same", 8), ("unrelated", 8)],
)
def test_greedy_speculative_equals_greedy_autoregressive(
  target, drafts, draft_name, num_draft_tokens
):
  """(Greedy verifies by argmax whatever the verifier argument says: one path to test.) 15
  tokens, as the eos tests' unstopped runs: one autoregressive program for the three."""
  ar = generate(target, PROMPTS, LENGTHS, jax.random.key(0), max_new_tokens=15, temperature=0)
  out = speculative_generate(
    target,
    drafts[draft_name],
    PROMPTS,
    LENGTHS,
    jax.random.key(0),
    max_new_tokens=15,
    num_draft_tokens=num_draft_tokens,
    temperature=0,
  )
  np.testing.assert_array_equal(out.tokens, ar.tokens)
  np.testing.assert_array_equal(out.lengths, ar.lengths)
  stats = out.summary()
  if draft_name == "same":
    assert stats["acceptance_rate"] == 1.0
    # Every block is accepted whole; the last one is shortened to end at max_new_tokens.
    assert stats["tokens_per_target_call"] == 15 / -(-15 // (num_draft_tokens + 1))
  if draft_name == "unrelated":
    assert stats["acceptance_rate"] < 0.2


def test_rows_accept_their_own_counts(target, drafts):
  out = speculative_generate(
    target,
    drafts["close"],
    PROMPTS,
    LENGTHS,
    jax.random.key(0),
    max_new_tokens=24,
    num_draft_tokens=4,
    temperature=0,
  )
  histogram = np.asarray(out.accepted_histogram)
  assert np.count_nonzero(histogram.sum(0)) >= 3  # several accepted counts occur
  stats = out.summary()
  assert stats["generated_per_row"] == [24] * 4
  # Each iteration appends its accepted drafts and one more token: 24 tokens per row in all.
  appended = (histogram * (np.arange(histogram.shape[1]) + 1)).sum(1)
  np.testing.assert_array_equal(appended, np.asarray(out.num_generated))
  assert stats["target_calls"] == 1 + int(np.asarray(out.iterations).max())
  # At most K draft steps per iteration (fewer once rows near max_new_tokens), each step
  # proposing at most one token per row: so no row was proposed more than the steps run.
  iterations = stats["target_calls"] - 1
  steps = stats["draft_calls"] - 1  # The first draft call is the prefill.
  assert int(np.asarray(out.proposed).max()) <= steps <= 4 * iterations
  position = stats["acceptance_at_position"]
  assert all(a >= b for a, b in zip(position, position[1:]))  # P(n >= t) falls with t
  assert 0 < stats["acceptance_rate"] < 1
  np.testing.assert_allclose(
    stats["tokens_per_target_call"], 1 + stats["acceptance_rate"] * stats["mean_draft_length"]
  )


def test_the_uncapped_histogram_leaves_out_the_iterations_max_new_tokens_cut(target, drafts):
  """The automatic K predicts from the uncapped counts and applies the cap itself: with every
  draft accepted, K = 8 and 13 tokens, one full iteration (9 tokens), then one cut to 3 drafts."""
  out = speculative_generate(
    target,
    drafts["same"],
    PROMPTS,
    LENGTHS,
    jax.random.key(0),
    max_new_tokens=13,
    num_draft_tokens=8,
    temperature=0,
  )
  full, uncapped = np.asarray(out.accepted_histogram), np.asarray(out.uncapped_histogram)
  np.testing.assert_array_equal(full[:, [3, 8]], np.ones((4, 2), int))
  np.testing.assert_array_equal(uncapped, np.eye(9, dtype=int)[[8] * 4])
  for k, iterations in ((8, 2), (4, 3), (2, 5)):  # ceil(13 / (k + 1)), all accepted
    rows = [draft_length.truncated(h, k) for h in uncapped]
    assert draft_length.iterations_until_done(rows, 13) == pytest.approx(iterations)


@pytest.mark.slow
def test_a_row_stops_at_the_first_of_several_eos_ids(target, drafts):
  """eos_id as a list (an HF generation_config's: Llama 3's end of text and of a turn): a row
  ends after the first token that is any of them, in both loops alike."""
  # The unstopped run at 15 tokens (test_eos_and_max_new_tokens' program); its first 12 are the
  # 12-token run's (greedy).
  free = generate(target, PROMPTS, LENGTHS, jax.random.key(0), max_new_tokens=15, temperature=0)
  first, second = int(free.generated(0)[5]), int(free.generated(1)[2])
  stops = [first, second]
  expected = []
  for row in range(len(PROMPTS)):
    generated = [int(t) for t in free.generated(row)[:12]]
    ends = [i for i, t in enumerate(generated) if t in stops]
    expected.append(ends[0] + 1 if ends else len(generated))
  assert min(expected) < 12 and len(set(expected)) > 1
  options = dict(max_new_tokens=12, temperature=0, eos_id=stops, pad_id=-1)
  ar = generate(target, PROMPTS, LENGTHS, jax.random.key(0), **options)
  np.testing.assert_array_equal(ar.num_generated, expected)
  out = speculative_generate(
    target, drafts["close"], PROMPTS, LENGTHS, jax.random.key(0), num_draft_tokens=3, **options
  )
  np.testing.assert_array_equal(out.tokens, ar.tokens)
  one = generate(target, PROMPTS, LENGTHS, jax.random.key(0), **dict(options, eos_id=first))
  assert int(one.num_generated.sum()) > int(ar.num_generated.sum())  # The second id counts.


def test_eos_and_max_new_tokens_stop_rows_independently(target, drafts):
  free = generate(target, PROMPTS, LENGTHS, jax.random.key(0), max_new_tokens=15, temperature=0)
  eos = int(free.generated(0)[4])
  ar = generate(
    target,
    PROMPTS,
    LENGTHS,
    jax.random.key(0),
    max_new_tokens=15,
    temperature=0,
    eos_id=eos,
    pad_id=-1,
  )
  for num_draft_tokens in (2, 5):
    out = speculative_generate(
      target,
      drafts["close"],
      PROMPTS,
      LENGTHS,
      jax.random.key(0),
      max_new_tokens=15,
      num_draft_tokens=num_draft_tokens,
      temperature=0,
      eos_id=eos,
      pad_id=-1,
    )
    np.testing.assert_array_equal(out.tokens, ar.tokens)
    np.testing.assert_array_equal(out.num_generated, ar.num_generated)
  assert int(ar.num_generated[0]) == 5 and int(ar.num_generated.max()) == 15


def test_speculative_is_one_while_loop_on_device(target, drafts):
  """The whole generation is ONE top-level while_loop (the draft's own loop nests inside it):
  no host round trip per iteration."""
  t_static, t_dynamic = model_protocol.split_model(target)
  d_static, d_dynamic = drafters.ModelDrafter(drafts["unrelated"]).split()
  loop = speculative.SpeculativeLoop(
    target_static=t_static,
    drafter_static=d_static,
    max_new_tokens=8,
    num_draft_tokens=3,
    sampling=warping.SamplingConfig(0.8),
    verifier="block",
    schedule="heuristic",
    eos_id=2,
    pad_id=0,
    cache_length=20,
  )
  jaxpr = jax.make_jaxpr(lambda t, d, p, n, k: loop(t, d, p, n, k, jnp.float32(0)))(
    t_dynamic, d_dynamic, jnp.asarray(PROMPTS), jnp.asarray(LENGTHS), jax.random.key(0)
  )
  inner = jaxpr.jaxpr.eqns[0].params["jaxpr"].jaxpr  # Inside jit.
  assert [eqn.primitive.name for eqn in inner.eqns].count("while") == 1


# --- The small pair: block verification accepts more than token-wise. -----------------------

EXACT_PROMPT = np.array([3, 6])


def _sampled(small_pair, sampling, num_draft_tokens, verifier, seed=0):
  target, draft = small_pair
  return sampled_counts(
    target,
    draft,
    EXACT_PROMPT,
    seed,
    num_draft_tokens=num_draft_tokens,
    temperature=sampling.temperature,
    top_k=sampling.top_k,
    top_p=sampling.top_p,
    verifier=verifier,
  )


# Every verifier x drafter x schedule x warping is certified against exact enumeration by the
# quick certificate (tests/test_certify.py, 10^5 sequences per case, with planted bugs that must
# be rejected; the suite runs the bugs and a case per verifier, the extended command every case)
# and scripts/certify.py (10^6); tests/test_drafters.py G-tests the Transformer pair here too.


@pytest.mark.slow
@pytest.mark.extended  # Reduced in the suite: tests/test_verification.py's block cases.
@pytest.mark.filterwarnings("ignore:num_draft_tokens=4 > max_new_tokens=3")  # On purpose.
def test_block_accepts_more_than_token_wise_on_the_small_pair(small_pair):
  sampling = warping.SamplingConfig(1.0)
  _, token_stats = _sampled(small_pair, sampling, 4, "token")
  _, block_stats = _sampled(small_pair, sampling, 4, "block")
  assert block_stats["tokens_per_target_call"] > token_stats["tokens_per_target_call"]


# --- Sharding, protocol models, bad input. ------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
  "verifier, tree, block_size, narrow",
  [  # The extended command's (reduced in the suite: test_outputs_are_replicated_on_a_data_mesh
    # samples on a data x tensor mesh as on one device; test_sharding.py's shard_map models equal
    # one device): block verification's chain, narrow scoring, a tree with blocked cache reads.
    pytest.param("block", None, 0, False, marks=pytest.mark.extended),
    # Narrow scoring: a confidence stop makes the widths vary, each a sharded scoring call.
    pytest.param("token", None, 0, True, marks=pytest.mark.extended),
    pytest.param("traversal", "tree:2,1,1", 4, False, marks=pytest.mark.extended),
  ],
)
def test_sharded_speculative_equals_one_device(verifier, tree, block_size, narrow):
  config = tiny_config("llama", tensor_parallel="shard_map", attention_block_size=block_size)
  draft_config = config.replace(num_layers=1)
  mesh = sharding.make_mesh({"data": 2, "tensor": 4})
  kwargs = dict(
    max_new_tokens=10, num_draft_tokens=3, temperature=1.0, top_p=0.9, verifier=verifier, tree=tree
  )
  if narrow:
    kwargs["narrow_scoring"] = True
  drafter = lambda model: drafters.ModelDrafter(model, confidence_threshold=0.3 if narrow else 0.0)
  expected = speculative_generate(
    transformer.create(config, seed=0),
    drafter(transformer.create(draft_config, seed=1)),
    PROMPTS,
    LENGTHS,
    jax.random.key(7),
    **kwargs,
  )
  target = transformer.create(config, mesh, seed=0)
  draft = drafter(transformer.create(draft_config, mesh, seed=1))
  with sharding.use_mesh(mesh):
    out = speculative_generate(target, draft, PROMPTS, LENGTHS, jax.random.key(7), **kwargs)
  if narrow:
    assert int(out.scored_tokens) < 4 * (int(out.target_calls) - 1)  # Some call was narrow.
  np.testing.assert_array_equal(out.tokens, expected.tokens)
  np.testing.assert_array_equal(out.accepted_histogram, expected.accepted_histogram)


def test_bigram_models_work_as_target_and_draft():
  target, draft = random_bigram(10, seed=0), random_bigram(10, seed=1)
  out = speculative_generate(
    target,
    draft,
    [[3], [4]],
    [1, 1],
    jax.random.key(0),
    max_new_tokens=12,
    num_draft_tokens=3,
    temperature=0,
  )
  ar = generate(target, [[3], [4]], [1, 1], jax.random.key(0), max_new_tokens=12, temperature=0)
  np.testing.assert_array_equal(out.tokens, ar.tokens)


@pytest.mark.parametrize(
  "max_new_tokens,per_call,histogram",
  [
    (6, 3.0, [1, 0, 0, 0, 1]),  # 5 (4 drafts + bonus), then 1 with no draft
    (12, 4.0, [0, 1, 0, 0, 2]),  # 5, 5, then 1 draft + bonus
    (5, 5.0, [0, 0, 0, 0, 1]),
  ],
)
def test_statistics_count_what_was_appended(max_new_tokens, per_call, histogram):
  """draft = target accepts every draft; the drafts never run past max_new_tokens, so the
  figures are the tokens the rows received (before: 5.00 tokens per call at 6 and at 12)."""
  model = random_bigram(10, seed=0)
  out = speculative_generate(
    model, model, [[3]], [1], jax.random.key(0), max_new_tokens=max_new_tokens, num_draft_tokens=4
  )
  stats = out.summary()
  assert int(out.num_generated[0]) == max_new_tokens
  assert stats["tokens_per_target_call"] == per_call
  assert stats["tokens_per_target_call"] == max_new_tokens / stats["row_iterations"]
  assert stats["accepted_histogram"] == histogram
  assert stats["acceptance_rate"] == stats["alpha"] == 1.0


def test_statistics_do_not_count_tokens_discarded_after_eos():
  """A row stops at EOS inside an accepted block: what followed the EOS is neither accepted
  nor proposed, and tokens per call is what the rows received."""
  model = random_bigram(6, seed=2, scale=0.5)
  out = speculative_generate(
    model,
    model,
    np.full((64, 1), 1),
    np.ones(64),
    jax.random.key(1),
    max_new_tokens=16,
    num_draft_tokens=4,
    eos_id=0,
  )
  stats = out.summary()
  generated = np.asarray(out.num_generated)
  assert generated.min() < 16  # some rows stopped at EOS ...
  assert stats["acceptance_rate"] == stats["alpha"] == 1.0  # ... without counting discards
  assert stats["tokens_per_target_call"] == generated.sum() / stats["row_iterations"]
  assert np.all(np.asarray(out.iterations) <= -(-generated // 5) + 1)
  accepted = np.dot(stats["accepted_histogram"], np.arange(5))
  assert accepted + stats["row_iterations"] >= generated.sum() >= accepted


def test_outputs_are_replicated_on_a_data_mesh(target, drafts):
  """Every output is replicated, so any host of a multi-host mesh can read it; the mesh's
  sampled tokens and statistics are one device's for the same key."""
  mesh = sharding.make_mesh({"data": 4, "tensor": 2})
  kwargs = dict(max_new_tokens=4, num_draft_tokens=2)
  with sharding.use_mesh(mesh):
    out = speculative_generate(
      target, drafts["close"], PROMPTS, LENGTHS, jax.random.key(0), **kwargs
    )
    ar = generate(target, PROMPTS, LENGTHS, jax.random.key(0), max_new_tokens=4)
  for name, array in [*vars(out).items(), *vars(ar).items()]:
    assert array.sharding.is_fully_replicated, name
  alone = speculative_generate(
    target, drafts["close"], PROMPTS, LENGTHS, jax.random.key(0), **kwargs
  )
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(alone.tokens))
  assert out.summary() == alone.summary()


def test_prompt_ids_outside_the_vocabulary_are_refused_by_both_samplers(target):
  """Padding past a row's length may hold anything; a real token must be a vocabulary id. (The
  greedy identity test's shapes and settings: its compiled loops run the padded prompts.)"""
  bad, padded = PROMPTS.copy(), PROMPTS.copy()
  bad[1, 1] = 999  # Row 1 holds 3 real tokens.
  padded[1, 5] = -7  # Past row 1's length: padding.
  key = jax.random.key(0)
  for call in (
    lambda p: generate(target, p, LENGTHS, key, max_new_tokens=15, temperature=0),
    lambda p: speculative_generate(
      target, target, p, LENGTHS, key, max_new_tokens=15, num_draft_tokens=3, temperature=0
    ),
  ):
    with pytest.raises(ValueError, match=r"id 999 \(row 1, position 1\) is outside .*\[0, 264\)"):
      call(bad)
    call(padded)  # -7 is padding: fine


def test_bad_input_gives_clear_errors(target):
  key = jax.random.key(0)
  kwargs = dict(max_new_tokens=4, num_draft_tokens=2)
  with pytest.raises(ValueError, match="vocabulary"):
    speculative_generate(target, random_bigram(12, 0), PROMPTS, LENGTHS, key, **kwargs)
  with pytest.raises(ValueError, match="num_draft_tokens"):
    speculative_generate(
      target, target, PROMPTS, LENGTHS, key, max_new_tokens=4, num_draft_tokens=0
    )
  # A tree that is no tree (an AttributeError), a K that is a string beside a tree ("K=2 must
  # equal the tree's depth, 2"): the review of 2026-11-30.
  for tree in (5, (2, 2)):
    with pytest.raises(ValueError, match="tree must be None, a tree spec string"):
      speculative_generate(target, target, PROMPTS, LENGTHS, key, tree=tree, **kwargs)
  with pytest.raises(ValueError, match=r"num_draft_tokens \(K\) must be an int >= 1, got '2'"):
    speculative_generate(
      target, target, PROMPTS, LENGTHS, key, max_new_tokens=4, num_draft_tokens="2", tree="tree:2,2"
    )
  with pytest.raises(ValueError, match="2 draft slots|3 draft slots"):
    speculative_generate(target, target, PROMPTS, LENGTHS, key, cache_length=12, **kwargs)
  with pytest.raises(ValueError, match="verifier"):
    speculative_generate(target, target, PROMPTS, LENGTHS, key, verifier="tree", **kwargs)
  with pytest.raises(ValueError, match="top_p"):
    speculative_generate(target, target, PROMPTS, LENGTHS, key, top_p=1.2, **kwargs)
  with pytest.raises(ValueError, match="synthetic_acceptance is set"):
    speculative_generate(target, target, PROMPTS, LENGTHS, key, verifier="synthetic", **kwargs)
  with pytest.raises(ValueError, match="synthetic_acceptance is set"):
    speculative_generate(target, target, PROMPTS, LENGTHS, key, synthetic_acceptance=0.5, **kwargs)
  with pytest.raises(ValueError, match=r"in \[0, 1\]"):
    speculative_generate(
      target,
      target,
      PROMPTS,
      LENGTHS,
      key,
      verifier="synthetic",
      synthetic_acceptance=1.5,
      **kwargs,
    )
  bad = random_bigram(target.vocab_size, 0)
  bad = bad.replace(logits_VV=jnp.full_like(bad.logits_VV, jnp.nan))  # a diverged checkpoint
  with pytest.raises(FloatingPointError, match="NaN logits"):
    speculative_generate(target, bad, PROMPTS, LENGTHS, key, **kwargs)


@pytest.mark.parametrize("broken", ["+inf at one token", "-inf at every token"])
def test_infinite_logits_are_refused_as_nan_logits_are(broken):
  """+inf logits (float16 overflow) and a row that is -inf at every token are no distribution.
  Until 2026-11-30 only NaN was caught: a draft with +inf at one token drafted it with an
  acceptance of 1.0 and no error (its q a NaN), and the autoregressive loop drew token 0 on."""
  target = random_bigram(100, 0)
  table = random_bigram(100, 1).logits_VV
  if broken.startswith("+inf"):
    table = table.at[:, 5].set(jnp.inf)
  else:
    table = table.at[40].set(-jnp.inf)  # The row after prompt 0's last token.
  bad = random_bigram(100, 1).replace(logits_VV=table)
  key, kwargs = jax.random.key(0), dict(max_new_tokens=4)
  with pytest.raises(FloatingPointError, match="NaN logits .*or \\+inf"):
    speculative_generate(target, bad, PROMPTS, LENGTHS, key, num_draft_tokens=2, **kwargs)
  with pytest.raises(FloatingPointError, match="NaN logits"):
    speculative_generate(bad, target, PROMPTS, LENGTHS, key, num_draft_tokens=2, **kwargs)
  with pytest.raises(FloatingPointError, match="NaN logits"):
    generate(bad, PROMPTS, LENGTHS, key, **kwargs)
  masked = table.at[:, 5].set(-jnp.inf) if broken.startswith("+inf") else table.at[40, 4].set(0.0)
  generate(bad.replace(logits_VV=masked), PROMPTS, LENGTHS, key, **kwargs)  # -inf alone is a mask.


@pytest.mark.parametrize("width", [10, 6])
def test_logits_wider_or_narrower_than_the_declared_vocabulary_are_refused(width):
  """A model whose logits are not ``vocab_size`` wide: autoregressive sampling emitted ids past
  the vocabulary and the speculative loop failed in a broadcast deep inside JAX (2026-11-30)."""
  from bigram import Bigram

  odd = Bigram(jax.random.normal(jax.random.key(0), (8, width)))  # Declares 8 (its rows).
  prompts, lengths, key = np.array([[3, 1]]), np.array([2]), jax.random.key(0)
  match = f"Bigram declares vocab_size=8 but its logits are {width} wide"
  with pytest.raises(ValueError, match=match):
    generate(odd, prompts, lengths, key, max_new_tokens=3)
  with pytest.raises(ValueError, match=match):
    speculative_generate(
      random_bigram(8, 1), odd, prompts, lengths, key, max_new_tokens=3, num_draft_tokens=2
    )


def test_the_logits_check_flags_rows_not_masked_tokens():
  logits = jnp.zeros((4, 2, 3)).at[0, 1, 2].set(-jnp.inf)  # A masked token: fine.
  logits = logits.at[1, 0, 1].set(jnp.nan).at[2, 1, 0].set(jnp.inf).at[3, 0].set(-jnp.inf)
  assert model_protocol.has_nan(logits).tolist() == [False, True, True, True]


@pytest.mark.parametrize("rate", [0.0, 0.6, 1.0])
def test_synthetic_acceptance_follows_the_iid_law(rate):
  """Benchmark mode: accepted counts are truncated-geometric with the chosen rate, whatever the
  models are (two unrelated bigram tables here)."""
  num_draft_tokens, rows = 3, 256
  target, draft = random_bigram(10, seed=0), random_bigram(10, seed=1)
  out = speculative_generate(
    target,
    draft,
    np.full((rows, 1), 3),
    np.ones(rows),
    jax.random.key(0),
    max_new_tokens=40,
    num_draft_tokens=num_draft_tokens,
    verifier="synthetic",
    synthetic_acceptance=rate,
  )
  stats = out.summary()
  counts = np.asarray(stats["accepted_histogram"])
  # P(n accepted) = rate^n (1 - rate) for n < K, rate^K for n = K.
  law = np.array([rate**n * (1 - rate) for n in range(num_draft_tokens)] + [rate**num_draft_tokens])
  if rate in (0.0, 1.0):
    np.testing.assert_array_equal(counts, law * counts.sum())
  else:
    test = exactness.g_test(counts, law, 1e-3)
    assert not test["rejected"], (counts, law, test)
    # (Each row's last iteration or two draft fewer than K tokens, to end at max_new_tokens:
    # a small censoring of the law, well inside the test's power at 256 rows.)
    assert abs(stats["alpha"] - rate) < 0.03
  assert stats["generated_per_row"] == [40] * rows
