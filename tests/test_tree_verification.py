"""Tree verifiers against exact enumeration, float64 references and the chain verifiers.

The float64 references below return the exact distribution of a verifier's output (accepted
path, next token) for one draft tree, by recursion over its coins. Summed over every draft tree
a tiny draft model can propose (each weighted by its probability), the emitted sequences must
be the target's: the exactness checks. The JAX verifiers are checked against the references
without sampling noise by running their traces on every vector of coin outcomes.
"""

import collections
import dataclasses
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsamp.sampling import tree as tree_lib
from specsamp.sampling import tree_verification as tv
from specsamp.sampling import verification
from specsamp.testing import exactness

# These tests compile many small programs and run each a few times: XLA's optimisation level 0
# compiles them about 3x faster (on CPU, a few seconds each otherwise).
_jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})

# -- float64 references: {(path, next token): probability} for one draft tree -----------------


def _ratio(numerator, q):
  """min(1, numerator / q), q = 0 read as 1 where numerator > 0 (as the JAX verifiers)."""
  if q > 0:
    return min(1.0, numerator / q)
  return 1.0 if numerator > 0 else 0.0


def _residual(r, q, weight=1.0):
  mass = np.maximum(weight * r - q, 0.0)
  return mass / mass.sum() if mass.sum() > 0 else r


def _emit(outcomes, path, r, prob):
  if prob > 0:
    for y in np.flatnonzero(r):
      outcomes[path, int(y)] += prob * r[y] / r.sum()


def _first_sibling_q(tree, q, j):
  """q of node j's parent's first child: the parent's full q (not renormalised)."""
  return q[tree.children(tree.parents[j])[0]]


def token_reference(tree, tokens, q, p, proposed, bug=None):
  """Recursive rejection sampling with merged prefixes. Planted bugs: 'original_p' tries later
  siblings against p at the parent instead of the residual; 'full_q' uses the parent's full q
  for every sibling instead of the one each was drawn from."""
  outcomes = collections.defaultdict(float)
  q_of = (lambda j: _first_sibling_q(tree, q, j)) if bug == "full_q" else (lambda j: q[j])

  def level(depth, alive, row, path, prob):
    nodes = tree.nodes_at_depth(depth) if depth <= tree.max_depth else ()
    nodes = [j for j in nodes if tree.parents[j] in alive and proposed[j]]
    r = p[row]
    for j in nodes:
      x = tokens[j]
      a = _ratio((p[row] if bug == "original_p" else r)[x], q_of(j)[x])
      if a > 0:
        merged = {i for i in nodes if tokens[i] == x}
        level(depth + 1, merged, j + 1, (*path, j), prob * a)
      prob *= 1.0 - a
      if prob == 0:
        return
      r = _residual(r, q_of(j))
    _emit(outcomes, path, r, prob)

  level(1, {-1}, 0, (), 1.0)
  return outcomes


def traversal_reference(tree, tokens, q, p, proposed, bug=None):
  """Traversal verification, recursively: visit(v) hands out its accepts and returns the
  probability that v's subtree and v were all rejected. Planted bugs (wrong sibling updates):
  'full_q' verifies every sibling against the parent's full q (M_s never renormalised);
  'stale_weight' keeps the parent's w after a child's rejection."""
  outcomes = collections.defaultdict(float)
  q_of = (lambda j: _first_sibling_q(tree, q, j)) if bug == "full_q" else (lambda j: q[j])

  def visit(v, w, target, path, prob):
    for c in tree.children(v):
      if not proposed[c] or prob == 0:
        continue
      q_c = q_of(c)
      prob = visit(c, _ratio(w * target[tokens[c]], q_c[tokens[c]]), p[c + 1], (*path, c), prob)
      mass = np.maximum(w * target - q_c, 0.0).sum()
      target = _residual(target, q_c, w)
      if v >= 0 and bug != "stale_weight":
        w = mass / (mass + 1.0 - w) if mass > 0 else 0.0
    accept = 1.0 if v < 0 else w
    _emit(outcomes, path, target, prob * accept)
    return prob * (1.0 - accept)

  visit(-1, 1.0, p[0], (), 1.0)
  return outcomes


def greedy_reference(tree, tokens, q, p, proposed):
  path, row, alive = (), 0, {-1}
  for depth in range(1, tree.max_depth + 1):
    best = int(np.argmax(p[row]))
    nodes = tree.nodes_at_depth(depth)
    hits = [j for j in nodes if tree.parents[j] in alive and proposed[j] and tokens[j] == best]
    if not hits:
      break
    path, row, alive = (*path, hits[0]), hits[0] + 1, set(hits)
  return {(path, int(np.argmax(p[row]))): 1.0}


REFERENCES = {"token": token_reference, "traversal": traversal_reference}

# -- a tiny context-dependent target and draft, and every draft tree they give ----------------


class _Model:
  """Random p(. | context) and q(. | context) tables over a tiny vocabulary, each a function of
  (seed, context) alone; zeros in both, as top-k / top-p leave them, and p overlapping q, as a
  useful draft does."""

  def __init__(self, seed, vocab, sparsity=0.25):
    self.seed, self.vocab, self.sparsity, self.tables = seed, vocab, sparsity, {}

  def _dist(self, kind, context):
    if (kind, context) not in self.tables:
      rng = np.random.default_rng([self.seed, kind, len(context), *context])
      x = rng.random(self.vocab) ** 3
      x[rng.random(self.vocab) < self.sparsity] = 0.0
      x[0] += 1e-3
      self.tables[kind, context] = x / x.sum()
    return self.tables[kind, context]

  def q(self, context):
    return self._dist(0, context)

  def p(self, context):
    if (2, context) not in self.tables:
      self.tables[2, context] = 0.5 * self._dist(1, context) + 0.5 * self.q(context)
    return self.tables[2, context]

  def sequence_probability(self, seq, start=0):
    """P_target(seq[start:] | seq[:start])."""
    return float(np.prod([self.p(tuple(seq[:k]))[seq[k]] for k in range(start, len(seq))]))


@dataclasses.dataclass
class _Drafts:
  tree: tree_lib.TreeShape
  model: _Model
  tokens: np.ndarray  # [M, N]
  q: np.ndarray  # [M, N, V]
  p: np.ndarray  # [M, N+1, V]
  proposed: np.ndarray  # [M, N]
  prob: np.ndarray  # [M]

  def __iter__(self):
    return iter(zip(self.tokens, self.q, self.p, self.proposed, self.prob))


def _enumerate_drafts(tree, model, num_proposed=None) -> _Drafts:
  """Every draft tree with its probability: node i drawn from q at its parent's root path
  (renormalised over tokens earlier siblings took, for distinct siblings); a node with no mass
  left, or past ``num_proposed``, is not proposed (nor are its descendants)."""
  num_nodes, vocab = tree.num_nodes, model.vocab
  rows = []

  def context(i, tokens):  # node i's root path, node i included (-1: the root).
    return () if i < 0 else tuple(tokens[j] for j in np.flatnonzero(tree.ancestors[i]))

  def grow(i, tokens, qs, proposed, prob):
    if i == num_nodes:
      p = [model.p(context(j, tokens)) for j in range(-1, num_nodes)]
      rows.append((tokens, qs, p, proposed, prob))
      return
    parent = tree.parents[i]
    q_i = np.zeros(vocab)
    if (parent < 0 or proposed[parent]) and (num_proposed is None or i < num_proposed):
      q_i = model.q(context(parent, tokens)).copy()
      if tree.distinct_siblings:
        q_i[[tokens[s] for s in tree.children(parent) if s < i and proposed[s]]] = 0.0
        q_i = q_i / max(q_i.sum(), 1e-300)
    if q_i.sum() == 0:
      grow(i + 1, [*tokens, 0], [*qs, q_i], [*proposed, False], prob)
    for x in np.flatnonzero(q_i):
      grow(i + 1, [*tokens, int(x)], [*qs, q_i], [*proposed, True], prob * q_i[x])

  grow(0, [], [], [], 1.0)
  return _Drafts(tree, model, *(np.array(column) for column in zip(*rows)))


IID_TREE = dataclasses.replace(tree_lib.branching((2, 2)), distinct_siblings=False)
SETUPS = {
  # name: (tree, vocabulary, proposal budget, sparsity of p and q)
  "chains2x2": (tree_lib.chains(2, 2), 4, None, 0.25),
  "tree2,2": (tree_lib.branching((2, 2)), 4, None, 0.25),
  "tree2,2/iid": (IID_TREE, 3, None, 0.25),
  "tree3,1": (tree_lib.branching((3, 1)), 4, None, 0.25),
  # 3 distinct siblings from a q with zeros: the later ones are often not proposed.
  "tree3,1/V3": (tree_lib.branching((3, 1)), 3, None, 0.5),
  "parents": (tree_lib.TreeShape((-1, -1, 0, 0, 1)), 4, None, 0.25),
  "parents/first4": (tree_lib.TreeShape((-1, -1, 0, 0, 1)), 4, 4, 0.25),
}


@functools.cache
def _drafts(name, seed) -> _Drafts:
  tree, vocab, num_proposed, sparsity = SETUPS[name]
  return _enumerate_drafts(tree, _Model(seed, vocab, sparsity), num_proposed)


@functools.cache
def _output_distribution(name, seed, verifier, bug=None) -> dict:
  """P(emitted sequence) under the reference, summed over every draft tree."""
  drafts = _drafts(name, seed)
  reference = REFERENCES[verifier]
  out = collections.defaultdict(float)
  for tokens, q, p, proposed, prob in drafts:
    for (path, y), pr in reference(drafts.tree, tokens, q, p, proposed, bug=bug).items():
      out[(*tokens[list(path)].tolist(), y)] += prob * pr
  return out


def _exactness_error(name, seed, verifier, bug=None) -> float:
  """max over target sequences t of length D+1 of |P(emit a prefix of t, then the target
  completes it to t) - P_target(t)|: 0 iff the verifier's output is a sample of the target."""
  drafts = _drafts(name, seed)
  model, depth = drafts.model, drafts.tree.max_depth
  out = _output_distribution(name, seed, verifier, bug)
  assert abs(sum(out.values()) - 1.0) < 1e-12
  worst = 0.0
  for t in itertools.product(range(model.vocab), repeat=depth + 1):
    extended = sum(
      out.get(t[:k], 0.0) * model.sequence_probability(t, k) for k in range(1, depth + 2)
    )
    worst = max(worst, abs(extended - model.sequence_probability(t)))
  return worst


# -- 1. exactness, and the JAX verifiers against the references --------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("verifier", ["token", "traversal"])
@pytest.mark.parametrize("name", list(SETUPS))
def test_reference_output_is_the_target_distribution(name, verifier, seed):
  assert _exactness_error(name, seed, verifier) < 1e-9
  # Non-trivial: the drafts get accepted, and some get rejected.
  depths = collections.Counter()
  for seq, prob in _output_distribution(name, seed, verifier).items():
    depths[len(seq) - 1] += prob
  max_depth = SETUPS[name][0].max_depth
  assert depths[max_depth] > 0.05 and 1.0 - depths[max_depth] > 0.01


@functools.cache
def _jitted_trace(verifier, tree):
  trace = {"token": tv._token_trace, "traversal": tv._traversal_trace}[verifier]
  return _jit(
    lambda t, q, p, proposed, coins: trace(tree, t, q, p, proposed, lambda j, _: coins[:, j])
  )


def _jax_outcomes(verifier, drafts: _Drafts) -> list[dict]:
  """The JAX verifier's exact output distribution per draft: its trace on every coin vector,
  weighted by the probability of those coins (a coin it did not use counts once, as False)."""
  num_drafts, num_nodes = drafts.tokens.shape
  coins = np.array(list(itertools.product([False, True], repeat=num_nodes)))
  tile = lambda x: np.repeat(x, len(coins), axis=0)
  trace = _jitted_trace(verifier, drafts.tree)(
    tile(drafts.tokens).astype(np.int32),
    tile(drafts.q).astype(np.float32),
    tile(drafts.p).astype(np.float32),
    tile(drafts.proposed),
    np.tile(coins, (num_drafts, 1)),
  )
  a, tested = np.asarray(trace.coin_probs, np.float64), np.asarray(trace.tested)
  flips = np.tile(coins, (num_drafts, 1))
  weight = np.where(tested, np.where(flips, a, 1.0 - a), np.where(flips, 0.0, 1.0)).prod(axis=1)
  emit = np.asarray(trace.emit_probs, np.float64)
  outcomes = [collections.defaultdict(float) for _ in range(num_drafts)]
  num_accepted, path = np.asarray(trace.num_accepted), np.asarray(trace.path)
  for row in np.flatnonzero(weight > 0):
    accepted = tuple(path[row, : num_accepted[row]].tolist())
    for y in np.flatnonzero(emit[row]):
      outcomes[row // len(coins)][accepted, int(y)] += weight[row] * emit[row, y]
  return outcomes


@pytest.mark.parametrize("verifier", ["token", "traversal"])
@pytest.mark.parametrize("name", list(SETUPS))
def test_jax_output_distribution_matches_reference(name, verifier):
  drafts = _drafts(name, 0)
  worst = 0.0
  for got, (tokens, q, p, proposed, _) in zip(_jax_outcomes(verifier, drafts), drafts):
    want = REFERENCES[verifier](drafts.tree, tokens, q, p, proposed)
    worst = max(worst, *(abs(got.get(k, 0.0) - want.get(k, 0.0)) for k in {*got, *want}))
  assert worst < 1e-6


@pytest.mark.parametrize("name", ["chains2x2", "tree2,2/iid", "parents/first4"])
def test_greedy_matches_reference_and_token_verification_at_temperature_zero(name):
  """At temperature 0 (one-hot p), tree_greedy_verify follows greedy_reference, and token
  verification's exact output distribution is the same verdict with probability 1."""
  drafts = _drafts(name, 0)
  drafts = dataclasses.replace(drafts, p=np.eye(drafts.model.vocab)[drafts.p.argmax(-1)])
  tree = drafts.tree
  greedy = _jit(lambda *a: tv.tree_greedy_verify(None, tree, *a))(
    drafts.tokens.astype(np.int32), drafts.q.astype(np.float32), drafts.p, drafts.proposed
  )
  token = _jax_outcomes("token", drafts)
  for b, (tokens, q, p, proposed, _) in enumerate(drafts):
    ((path, y),) = want = greedy_reference(tree, tokens, q, p, proposed)
    assert int(greedy.num_accepted[b]) == len(path)
    assert tuple(np.asarray(greedy.path[b, : len(path)]).tolist()) == path
    assert int(greedy.next_token[b]) == y
    assert dict(token[b]) == pytest.approx(want, abs=1e-6)
  assert len(set(np.asarray(greedy.num_accepted).tolist())) > 1


@pytest.mark.parametrize("verifier", ["token", "traversal"])
def test_sampled_verdicts_match_reference(verifier):
  """The real coins and emitted token: 20k keys on one draft tree, G-test."""
  drafts = _drafts("tree2,2/iid", 0)
  reference = REFERENCES[verifier]
  # The draft with the most distinct outcomes.
  outcomes = [reference(drafts.tree, t, q, p, proposed) for t, q, p, proposed, _ in drafts]
  index = int(np.argmax([len(o) for o in outcomes]))
  tokens, q, p, proposed = (
    jnp.asarray(x[index : index + 1], dtype)
    for x, dtype in zip(
      (drafts.tokens, drafts.q, drafts.p, drafts.proposed),
      (jnp.int32, jnp.float32, jnp.float32, bool),
    )
  )
  verify = tv.TREE_VERIFIERS[verifier]
  run = _jit(jax.vmap(lambda key: verify(key, drafts.tree, tokens, q, p, proposed)))
  verdict = run(jax.random.split(jax.random.key(7), 20_000))
  observed = collections.Counter(
    (tuple(row[1 : 1 + row[0]]), row[-1])
    for row in np.concatenate(
      [verdict.num_accepted, verdict.path[:, 0], verdict.next_token], axis=1
    ).tolist()
  )
  expected = outcomes[index]
  assert len(expected) >= 6
  test = exactness.g_test_cells(observed, expected, 1e-3)
  assert not test["rejected"], test


# -- 2. planted bugs: the same exactness check rejects them ------------------------------------


@pytest.mark.parametrize(
  "verifier, bug, name",
  [
    ("token", "original_p", "chains2x2"),
    ("token", "original_p", "tree2,2"),
    ("token", "full_q", "tree2,2"),
    ("traversal", "full_q", "tree2,2"),
    ("traversal", "full_q", "parents/first4"),
    ("traversal", "stale_weight", "chains2x2"),
    ("traversal", "stale_weight", "parents"),
  ],
)
def test_planted_bugs_are_caught(verifier, bug, name):
  assert _exactness_error(name, 1, verifier, bug) > 1e-3


# -- 3. on a chain: the chain verifiers, bit for bit -------------------------------------------


def _chain_case(seed, batch=64, length=4, vocab=7):
  rng = np.random.default_rng(seed)

  def dists(shape):
    x = rng.random(shape) ** 3
    x[rng.random(shape) < 0.3] = 0.0
    x[..., 0] += 1e-3
    return x / x.sum(-1, keepdims=True)

  q = dists((batch, length, vocab))
  p = 0.5 * dists((batch, length + 1, vocab))
  p[:, :-1] += 0.5 * q
  p[:, -1] *= 2.0
  tokens = np.array([[rng.choice(vocab, p=q[b, t]) for t in range(length)] for b in range(batch)])
  return jnp.asarray(tokens, jnp.int32), jnp.asarray(q, jnp.float32), jnp.asarray(p, jnp.float32)


CHAIN = tree_lib.chain(4)
_CHAIN_PAIRS = {
  "token": verification.token_verify,
  "traversal": verification.block_verify,
  "argmax": verification.greedy_verify,
}


@functools.cache
def _chain_pair(verifier):
  tree_verify, chain_verify = tv.TREE_VERIFIERS[verifier], _CHAIN_PAIRS[verifier]
  proposed = jnp.ones((64, CHAIN.num_nodes), bool)
  return (
    _jit(lambda key, t, q, p: tree_verify(key, CHAIN, t, q, p, proposed)),
    _jit(lambda key, t, q, p: chain_verify(key, t, q, p)),
  )


@pytest.mark.parametrize("verifier", ["token", "traversal", "argmax"])
def test_chain_is_bit_identical_to_the_chain_verifier(verifier):
  tree_verify, chain_verify = _chain_pair(verifier)
  num_accepted = []
  for seed in range(20):
    tokens, q, p = _chain_case(seed)
    if verifier == "argmax":  # drafts that agree with the argmax for a while
      best = jnp.argmax(p, -1).astype(jnp.int32)
      tokens = jnp.where(
        jax.random.uniform(jax.random.key(seed), tokens.shape) < 0.8, best[:, :-1], tokens
      )
    for key in jax.random.split(jax.random.key(seed), 4):
      got, want = tree_verify(key, tokens, q, p), chain_verify(key, tokens, q, p)
      np.testing.assert_array_equal(got.num_accepted, want.num_accepted)
      np.testing.assert_array_equal(got.next_token, want.next_token)
      n = np.asarray(got.num_accepted)
      np.testing.assert_array_equal(got.path, np.where(np.arange(4) < n[:, None], np.arange(4), 0))
      num_accepted.append(n)
  assert set(np.concatenate(num_accepted).tolist()) == set(range(5))


# -- 4. edge cases ------------------------------------------------------------------------------


@functools.cache
def _over_keys(verifier, tree):
  """The verifier on one batch of inputs for each of a batch of keys."""
  verify = tv.TREE_VERIFIERS[verifier]
  return _jit(jax.vmap(lambda key, *a: verify(key, tree, *a), in_axes=(0, None, None, None, None)))


def _run_all(verifier, tree, tokens, q, p, proposed):
  return _over_keys(verifier, tree)(
    jax.random.split(jax.random.key(1), 2000), tokens, q, p, proposed
  )


@pytest.mark.parametrize("verifier", ["token", "traversal"])
def test_edge_cases(verifier):
  tree = tree_lib.branching((2, 1))  # nodes 0, 1 at depth 1; 2 under 0, 3 under 1
  uniform = np.full((1, 5, 3), 1 / 3, np.float32)
  tokens = np.array([[0, 1, 2, 2]], np.int32)
  q = np.array([[[0.5, 0.5, 0.0], [0.0, 1.0, 0.0], [1 / 3] * 3, [1 / 3] * 3]], np.float32)
  everything = np.ones((1, 4), bool)

  # p == q: the first child is accepted at every depth.
  same_p = np.concatenate([q[:, :1], uniform[:, :4]], axis=1)
  v = _run_all(verifier, tree, tokens, q, same_p, everything)
  np.testing.assert_array_equal(v.num_accepted, 2)
  np.testing.assert_array_equal(v.path, [[[0, 2]]] * 2000)

  # q = 0 at a node's own token (q_2(2) = 0) while p > 0 there: the ratio reads 1, accepted.
  zero_q = q.copy()
  zero_q[0, 2] = [0.5, 0.5, 0.0]
  v = _run_all(verifier, tree, tokens, zero_q, same_p, everything)
  np.testing.assert_array_equal(v.path, [[[0, 2]]] * 2000)

  # p = 0 at the depth-1 tokens: nothing is ever accepted, not even the descendants; the token
  # comes from the residual, which only has mass on token 2.
  no_p = uniform.copy()
  no_p[0, 0] = [0.0, 0.0, 1.0]
  v = _run_all(verifier, tree, tokens, q, no_p, everything)
  np.testing.assert_array_equal(v.num_accepted, 0)
  np.testing.assert_array_equal(v.next_token, 2)

  # Nothing proposed: the token is drawn from p at the root, exactly.
  p_root = np.array([0.2, 0.0, 0.8], np.float32)
  p = uniform.copy()
  p[0, 0] = p_root
  nothing = np.zeros((1, 4), bool)
  v = _run_all(verifier, tree, tokens, q, p, nothing)
  np.testing.assert_array_equal(v.num_accepted, 0)
  np.testing.assert_array_equal(v.path, 0)
  assert set(np.asarray(v.next_token).ravel().tolist()) == {0, 2}
  trace = _jitted_trace(verifier, tree)(tokens, q, p, nothing, np.ones((1, 4), bool))
  np.testing.assert_allclose(trace.emit_probs[0], p_root, rtol=1e-6)
  np.testing.assert_array_equal(trace.tested, False)


def test_greedy_edge_cases():
  tree = tree_lib.chains(2, 2)  # two i.i.d. chains: 0 -> 2 and 1 -> 3
  p = np.eye(3, dtype=np.float32)[[[1, 2, 0, 0, 1]]]  # argmax: root 1, after 0: 2, after 1: 0
  q = np.full((1, 4, 3), 1 / 3, np.float32)
  everything = np.ones((1, 4), bool)
  # Both depth-1 nodes drew token 1: merged; node 2 (under 0) misses, node 3 (under 1) hits.
  v = tv.tree_greedy_verify(None, tree, np.array([[1, 1, 1, 2]]), q, p, everything)
  assert v.num_accepted.tolist() == [2] and v.path.tolist() == [[0, 3]]
  assert v.next_token.tolist() == [1]
  v = tv.tree_greedy_verify(
    None, tree, np.array([[1, 1, 1, 2]]), q, p, np.array([[1, 0, 1, 0]], bool)
  )
  assert v.num_accepted.tolist() == [1] and v.next_token.tolist() == [2]


# -- 5. more drafts never hurt ------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_two_drafts_accept_at_least_as_many_tokens_as_one(seed):
  """E[n] of recursive rejection sampling on branching((2, 1, 1)) >= token_verify's on
  chain(3), exactly, with the same target and draft."""

  def expected_depth(tree):
    drafts = _enumerate_drafts(tree, _Model(seed, 3))
    return sum(
      prob * pr * len(path)
      for tokens, q, p, proposed, prob in drafts
      for (path, _), pr in token_reference(tree, tokens, q, p, proposed).items()
    ), drafts

  two, _ = expected_depth(tree_lib.branching((2, 1, 1)))
  chain, drafts = expected_depth(tree_lib.chain(3))
  # token_verify's own E[n] on the chain: sum_t prod_{s <= t} a_s, averaged over the drafts.
  a = verification.acceptance_probabilities(
    jnp.asarray(drafts.tokens),
    jnp.asarray(drafts.q, jnp.float32),
    jnp.asarray(drafts.p, jnp.float32),
  )
  np.testing.assert_allclose(chain, drafts.prob @ np.cumprod(a, axis=1).sum(1), rtol=1e-6)
  assert two >= chain - 1e-12
  assert two > chain + 0.01 and chain > 0.3


def test_registry():
  assert set(tv.TREE_VERIFIERS) == {"token", "traversal", "argmax"}


@pytest.mark.parametrize("verifier", ["token", "traversal", "argmax"])
def test_q_none_verifies_as_the_one_hot_q_bit_for_bit(verifier):
  """Chosen siblings (distinct, as greedy proposals choose them) with q = None give the
  verdicts of their explicit one-hot q, on a tree with rows proposing fewer nodes."""
  tree = tree_lib.branching((2, 2, 1))
  verify = _jit(
    lambda key, t, q, p, proposed: tv.TREE_VERIFIERS[verifier](key, tree, t, q, p, proposed)
  )
  rng = np.random.default_rng(7)
  batch, vocab = 64, 6
  depths = []
  for seed in range(6):
    p = rng.random((batch, tree.num_nodes + 1, vocab)) ** 3
    p[rng.random(p.shape) < 0.3] = 0.0
    p[..., 0] += 1e-3
    p = jnp.asarray(p / p.sum(-1, keepdims=True), jnp.float32)
    # Each node's token: one of the parent's two most likely, distinct among siblings.
    ranked = np.argsort(-np.asarray(p), axis=-1)
    tokens = np.stack(
      [ranked[:, tree.parents[j] + 1, tree.sibling_rank[j]] for j in range(tree.num_nodes)], 1
    ).astype(np.int32)
    depth_B = rng.integers(0, tree.max_depth + 1, batch)
    proposed = jnp.asarray(np.asarray(tree.depths)[None, :] <= depth_B[:, None])
    one_hot = jax.nn.one_hot(tokens, vocab, dtype=jnp.float32)
    for key in jax.random.split(jax.random.key(seed), 3):
      want = verify(key, jnp.asarray(tokens), one_hot, p, proposed)
      got = verify(key, jnp.asarray(tokens), None, p, proposed)
      for field in ("num_accepted", "path", "next_token"):
        np.testing.assert_array_equal(getattr(got, field), getattr(want, field))
      depths += np.asarray(got.num_accepted).tolist()
  assert set(depths) == set(range(tree.max_depth + 1))
