"""64-bit random draws: every edge of the coins and the categorical race, deterministically, and
the verifiers' strict comparisons with the random source pinned to its extreme values."""

import fractions

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from specsamp.experiments.benchmarks import draw_cost
from specsamp.sampling import draws, verification, warping

MAX_WORD = 2**32 - 1


def _words(*xs: int) -> jnp.ndarray:
  """uint32 [2, n] words for 64-bit integers X."""
  return jnp.array([[x >> 32 for x in xs], [x & MAX_WORD for x in xs]], jnp.uint32)


def _threshold(a: float) -> int:
  """floor(a 2^64) in exact arithmetic, for the float32 value of a."""
  return int(fractions.Fraction(float(np.float32(a))) * 2**64)


@pytest.mark.parametrize("a", [2.0**-64, 1e-12, 1e-9, 2.0**-23, 0.3, 0.5, 1 - 2.0**-24])
def test_a_coin_accepts_exactly_the_integers_below_a_times_two_to_the_64(a):
  threshold = _threshold(a)
  xs = [0, threshold - 1, threshold, threshold + 1, 2**64 - 1]
  got = draws.bernoulli_from_words(_words(*xs), jnp.full(len(xs), a, jnp.float32))
  assert got.tolist() == [x < threshold for x in xs]


def test_a_coin_never_accepts_probability_zero_and_always_accepts_one():
  xs = [0, 1, 2**63, 2**64 - 1]
  assert not draws.bernoulli_from_words(_words(*xs), jnp.zeros(4)).any()
  assert draws.bernoulli_from_words(_words(*xs), jnp.ones(4)).all()
  # Out of range and NaN-free clipping: negative reads as 0, above 1 as 1.
  assert not draws.bernoulli_from_words(_words(0), jnp.array([-0.5])).any()
  assert draws.bernoulli_from_words(_words(2**64 - 1), jnp.array([1.5])).all()
  # A NaN probability is never accepted (always was: clip keeps a NaN; 2026-11-30's review).
  assert not draws.bernoulli_from_words(_words(0), jnp.array([jnp.nan])).any()


def test_coins_match_exact_integer_arithmetic_on_random_probabilities_and_draws():
  rng = np.random.default_rng(0)
  a = np.concatenate([rng.random(500), 10.0 ** rng.uniform(-19, 0, 500)]).astype(np.float32)
  # X near the threshold (ties and neighbours) as well as uniform.
  xs = [int(rng.integers(0, 2**63)) * 2 + int(rng.integers(0, 2)) for _ in range(500)]
  xs += [max(_threshold(v) + int(rng.integers(-2, 3)), 0) for v in a[500:]]
  got = draws.bernoulli_from_words(_words(*xs), jnp.asarray(a))
  assert got.tolist() == [x < _threshold(v) for x, v in zip(xs, a)]


def test_the_rate_of_a_coin_is_its_probability():
  coins = draws.bernoulli(jax.random.key(0), jnp.full((400_000,), 0.3, jnp.float32))
  assert stats.binomtest(int(coins.sum()), coins.size, 0.3).pvalue > 1e-3


def test_exponentials_cover_both_tails_and_are_never_zero_or_infinite():
  e = np.asarray(draws.exponential_from_words(_words(0, 2**63 - 1, 2**63, 2**64 - 1)), np.float64)
  np.testing.assert_allclose(e[0], 65 * np.log(2), rtol=1e-6)  # U = 2^-65
  np.testing.assert_allclose(e[1:3], np.log(2), rtol=1e-6)  # U next to 1/2, either side
  assert 0 < e[3] < 1e-19  # U next to 1: E = 2^-65, not 0
  # Monotone in X over a sweep, and Exp(1) in distribution.
  sweep = np.asarray(draws.exponential_from_words(_words(*[k << 58 for k in range(64)])))
  assert np.all(np.diff(sweep) < 0)
  sample = np.asarray(draws.exponential(jax.random.key(1), (200_000,)), np.float64)
  assert stats.kstest(sample, "expon").pvalue > 1e-3


def test_categorical_never_draws_zero_probability_and_keeps_rare_tokens():
  probs = jnp.array([[0.0, 1.0 - 1e-12, 1e-12]], jnp.float32)
  # Token 0 has the smallest exponential possible: probability 0 still never wins.
  assert int(draws.categorical_from_words(_words(2**64 - 1, 0, 0)[:, None], probs)[0]) == 1
  # A token of probability 1e-12 wins when its exponential is small enough (float32
  # Gumbel-max could never draw it).
  words = _words(0, 0, 2**64 - 1 - 2**20)[:, None]
  assert int(draws.categorical_from_words(words, probs)[0]) == 2


def test_categorical_follows_its_probabilities():
  probs = jnp.array([0.5, 0.25, 0.125, 0.125, 0.0], jnp.float32)
  tokens = draws.categorical(jax.random.key(2), jnp.broadcast_to(probs, (200_000, 5)))
  counts = np.bincount(np.asarray(tokens), minlength=5)
  assert counts[4] == 0
  assert stats.chisquare(counts[:4], 200_000 * np.asarray(probs[:4])).pvalue > 1e-3


def test_warping_samples_with_the_same_race():
  logits = jnp.array([[2.0, 1.0, -30.0, 0.5]])
  got = warping.sample(
    jax.random.key(3), jnp.broadcast_to(logits, (50_000, 4)), warping.SamplingConfig(1.0, top_k=3)
  )
  counts = np.bincount(np.asarray(got), minlength=4)
  expected = np.asarray(
    warping.probabilities(logits, warping.SamplingConfig(1.0, top_k=3)), np.float64
  )[0]
  expected /= expected.sum()
  assert counts[2] == 0  # outside the top 3
  keep = expected > 0
  assert stats.chisquare(counts[keep], 50_000 * expected[keep]).pvalue > 1e-3


# --- The verifiers with the random source pinned to X = 0 (the draw r = 0.0). -----------------


@pytest.fixture
def zero_draws(monkeypatch):
  """Every 64-bit draw is X = 0: r = 0 for every coin (the draw at which `r <= a` accepts a
  = 0)."""
  monkeypatch.setattr(draws, "random_words", lambda key, shape: jnp.zeros((2, *shape), jnp.uint32))


def _block(p_first, num_draft_tokens=3, vocab=4):
  """A draft block whose first token has target probability ``p_first`` (draft q uniform)."""
  tokens = jnp.zeros((1, num_draft_tokens), jnp.int32)
  q = jnp.full((1, num_draft_tokens, vocab), 1.0 / vocab)
  p = jnp.full((1, num_draft_tokens + 1, vocab), 1.0 / vocab)
  p = p.at[0, 0].set(jnp.array([p_first, 1.0 - p_first, 0.0, 0.0]))
  return tokens, q, p


def test_block_verification_never_accepts_a_zero_probability_token_at_r_zero(zero_draws):
  tokens, q, p = _block(0.0)
  for verify in (verification.block_verify, verification.token_verify):
    verdict = verify(jax.random.key(0), tokens, q, p)
    assert int(verdict.num_accepted[0]) == 0, verify.__name__
    assert int(verdict.next_token[0]) != 0  # the emitted token comes from p's support


def test_block_verification_accepts_nothing_past_the_proposal_at_r_zero(zero_draws):
  tokens, q, p = _block(0.25)
  for num_proposed in (0, 1, 2):
    for verify in (
      verification.block_verify,
      verification.token_verify,
      verification.synthetic_verifier(1.0),
    ):
      verdict = verify(jax.random.key(0), tokens, q, p, jnp.array([num_proposed]))
      assert int(verdict.num_accepted[0]) <= num_proposed


def test_synthetic_verification_of_rate_zero_accepts_nothing_at_r_zero(zero_draws):
  tokens, q, p = _block(0.25)
  verdict = verification.synthetic_verifier(0.0)(jax.random.key(0), tokens, q, p)
  assert int(verdict.num_accepted[0]) == 0


def test_a_tiny_acceptance_probability_is_not_rounded_up(monkeypatch):
  """p/q = 1e-9: accepted for X < floor(1e-9 2^64) only, not for every r below 2^-23."""
  a = np.float32(1e-9)
  tokens, q, p = _block(float(a) / 4)  # q = 1/4, so p/q = a
  threshold = _threshold(float(np.float32(p[0, 0, 0]) / np.float32(0.25)))
  for x, accepted in ((threshold - 1, 1), (threshold, 0), (2**40, 0)):  # 2^40/2^64 < 2^-23
    monkeypatch.setattr(
      draws,
      "random_words",
      lambda key, shape, x=x: jnp.broadcast_to(
        _words(x).reshape((2,) + (1,) * len(shape)), (2, *shape)
      ),
    )
    verdict = verification.token_verify(jax.random.key(0), tokens[:, :1], q[:, :1], p[:, :2])
    assert int(verdict.num_accepted[0]) == accepted, x


def test_the_race_block_is_about_the_square_root_of_the_vocabulary():
  """V / B blocks and B tokens: B the smallest power of two with B^2 >= V, at most 256; the
  test models' 264 tokens race flat."""
  assert 264 <= draws.FLAT_RACE_MAX < 1024
  assert [draws.race_block(v) for v in (1024, 1101, 4173, 8192, 32000, 49152, 128256)] == [
    32,
    64,
    128,
    128,
    256,
    256,
    256,
  ]


def test_categorical_is_the_two_stage_race_of_its_block_and_keeps_rows_apart():
  """Above FLAT_RACE_MAX ``categorical`` is ``two_stage_categorical`` at ``race_block(V)``, bit
  for bit; over leading dimensions [2, 3] each row draws from its own support only (a row
  whose mass sits in another block than its neighbours' never takes their tokens)."""
  vocab = 1101  # 18 blocks of 64, the last partial.
  rng = np.random.default_rng(0)
  probs = np.zeros((2, 3, vocab), np.float32)
  supports = {}
  for i in range(2):
    for j in range(3):
      support = rng.choice(vocab, size=5, replace=False)
      probs[i, j, support] = rng.dirichlet(np.ones(5))
      supports[i, j] = set(support.tolist())
  probs = jnp.asarray(probs)
  draw = jax.jit(draws.categorical)
  two_stage = jax.jit(draws.two_stage_categorical, static_argnums=2)
  for seed in range(40):
    key = jax.random.fold_in(jax.random.key(7), seed)
    tokens = np.asarray(draw(key, probs))
    np.testing.assert_array_equal(
      tokens, np.asarray(two_stage(key, probs, draws.race_block(vocab)))
    )
    for (i, j), support in supports.items():
      assert int(tokens[i, j]) in support, (seed, i, j)


# A vocabulary above FLAT_RACE_MAX with a partial last block, and where its mass lies.
_RACES = {
  # The default pair's size region: 1,101 tokens, 18 blocks of 64 (the last partial).
  1101: dict(single=[5, 300, 301, 700, 1050, 1100], block=(800, 810), rare=(500, 501)),
  # 4,173 tokens: 33 blocks of 128, the last partial.
  4173: dict(single=[5, 300, 301, 2000, 4100, 4172], block=(3000, 3010), rare=(700, 701)),
}


@pytest.mark.slow
# The 4,173-token case (blocks of 128) is the extended command's: the 1,101-token case runs the
# same body on the same code path (a partial last block, no branch on the static block size).
@pytest.mark.parametrize("vocab", [1101, pytest.param(4173, marks=pytest.mark.extended)])
def test_the_two_stage_race_of_a_large_vocabulary_follows_its_probabilities(vocab):
  """V > FLAT_RACE_MAX: a block race, then a race inside the winning block. Mass spread over
  blocks unevenly, a partial last block, zero-mass blocks and zero tokens inside live ones,
  and a rare token: the counts follow p (chi-square), zeros are never drawn."""
  assert vocab > draws.FLAT_RACE_MAX
  size = draws.race_block(vocab)
  num_blocks = -(-vocab // size)
  assert vocab % size, "the last block is partial"
  where = _RACES[vocab]
  probs = np.zeros(vocab)
  probs[where["single"]] = [0.3, 0.2, 0.1, 0.15, 0.05, 0.1]
  probs[slice(*where["block"])] = 0.009  # Ten tokens of one block.
  common_rare, rare = where["rare"]
  probs[common_rare] = 0.01 - 1e-6
  probs[rare] = 1e-6  # Rare: expected 0.2 times in 200k draws; must never exceed a few.
  rows, chunk = 200_000, 2_000  # Chunks of 2,000 rows stay in cache: 9.7 s against 16.7 s.
  row_probs = jnp.broadcast_to(jnp.asarray(probs, jnp.float32), (chunk, vocab))
  draw = jax.jit(lambda key: draws.categorical(key, row_probs))
  tokens = np.concatenate(
    [np.asarray(draw(jax.random.fold_in(jax.random.key(4), i))) for i in range(rows // chunk)]
  )
  counts = np.bincount(tokens, minlength=vocab)
  assert counts[probs == 0].sum() == 0
  common = probs > 1e-3
  expected = rows * probs[common] / probs[common].sum() * (counts[common].sum() / rows)
  assert stats.chisquare(counts[common], expected).pvalue > 1e-3
  assert counts[rare] <= 6
  # The pairwise block sums are the blocks' totals.
  padded = np.pad(probs, (0, num_blocks * size - vocab))
  np.testing.assert_allclose(
    draws.block_masses(jnp.asarray(padded, jnp.float32), size),
    padded.reshape(num_blocks, -1).sum(-1),
    rtol=1e-6,
    atol=1e-12,
  )


@pytest.mark.extended  # scripts/benchmark_draws.py's measurement: a benchmark's own check.
def test_the_draw_benchmark_times_both_races():
  """scripts/benchmark_draws.py's measurement at tiny sizes: a record per (vocab, batch) with
  both races timed, the block of ``race_block`` and which race ``categorical`` runs."""
  records = draw_cost.measure([64, 1024], [1, 2], draws_per_call=4, repeats=1)
  assert [(r["vocab"], r["batch"]) for r in records] == [(64, 1), (64, 2), (1024, 1), (1024, 2)]
  for r in records:
    assert r["block"] == draws.race_block(r["vocab"])
    assert r["flat_us"] > 0 and r["two_stage_us"] > 0
  assert [r["categorical"] for r in records] == ["flat", "flat", "two-stage", "two-stage"]
