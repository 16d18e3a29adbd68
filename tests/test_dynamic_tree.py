"""Dynamic trees (EAGLE-2): the shape, the expansion against a brute-force beam over the same
draft, per-row tree calls against plain forward passes, the token verifier with per-row
parents against the static verifier on each row's own tree. Greedy runs against
autoregressive and the settings that cannot be exact: tests/test_tree.py. Their sampled
exactness: the certificate's dynamic cases (tests/test_certify.py)."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_config

from specsamp.models import transformer
from specsamp.models.attention import TreeCall
from specsamp.sampling import drafters, proposals, tree_step
from specsamp.sampling import tree as tree_lib
from specsamp.sampling import tree_verification as tv
from specsamp.sampling.warping import SamplingConfig, probabilities


def test_dynamic_shapes_from_their_strings():
  shape = tree_lib.parse("dynamic:2,3,1")
  assert shape.dynamic and shape.widths == (2, 3, 1) and shape.num_nodes == 6
  assert shape.depths == (1, 1, 2, 2, 2, 3) and shape.max_depth == 3
  assert tree_lib.parse("dynamic:4x3").widths == (4, 4, 4)
  assert "dynamic tree of 12 nodes" in tree_lib.parse("dynamic:4x3").describe()
  assert not tree_lib.parse("tree:2,1").dynamic
  for bad, message in [("dynamic:2,0", "1 node per depth"), ("dynamic:2x2/iid", "no '/iid'")]:
    with pytest.raises(ValueError, match=message):
      tree_lib.parse(bad)


def test_rank_temperatures_from_their_strings():
  shape = tree_lib.parse("dynamic:4x3@0.25")
  assert shape.widths == (4, 4, 4) and shape.rank_temperature == 0.25
  assert "rank temperature 0.25" in shape.describe()
  assert tree_lib.parse("dynamic:2,1@1").rank_temperature == 1.0
  assert tree_lib.parse("dynamic:2,1").rank_temperature == 1.0
  for bad in ("dynamic:2x2@0", "dynamic:2x2@-1", "dynamic:2x2@inf", "dynamic:2x2@fit"):
    with pytest.raises(ValueError, match="Bad tree|rank_temperature"):
      tree_lib.parse(bad)
  with pytest.raises(ValueError, match="needs dynamic"):
    tree_lib.TreeShape((-1, 0), rank_temperature=0.5)


def _beam(root_logits, child_logits, widths, sampling, rank_temperature=1.0):
  """Brute force, one row: {path: log joint score} of the paths EAGLE-2's expansion keeps
  (each kept node offers its w_d best children; the depth keeps the w_d best joint), each
  factor q^(1/tau) renormalised."""

  def log_q(logits):
    q = np.asarray(probabilities(jnp.asarray(logits)[None], sampling))[0].astype(np.float64)
    sharpened = q ** (1.0 / rank_temperature)
    with np.errstate(divide="ignore"):
      return np.log(sharpened / sharpened.sum())

  kept = {(): 0.0}
  everything = {}
  for width in widths:
    candidates = {}
    for path, score in kept.items():
      scores = score + log_q(root_logits if not path else child_logits(path))
      for token in np.argsort(-scores, kind="stable")[:width]:
        candidates[path + (int(token),)] = scores[token]
    best = sorted(candidates.items(), key=lambda item: -item[1])[:width]
    kept = {path: score for path, score in best if score > -np.inf}
    everything.update(kept)
  return everything


@pytest.mark.parametrize("temperature, top_k, tau", [(1.0, 0, 1.0), (0.7, 3, 1.0), (1.0, 0, 0.3)])
def test_expansion_keeps_the_paths_of_highest_joint_probability(temperature, top_k, tau):
  """The draft here is a table lookup: the logits after a node depend on its depth and token.
  Every kept node's root path and joint score match a brute-force beam (python, float64),
  at EAGLE-2's ranking (tau = 1) and at a sharper rank temperature, which keeps other paths
  here (checked, so the comparison can see tau)."""
  vocab, widths, batch = 9, (3, 3, 2), 2
  sampling = SamplingConfig(temperature, top_k=top_k)
  shape = tree_lib.dynamic(widths, rank_temperature=tau)
  rng = np.random.default_rng(0)
  root_logits = rng.normal(size=(batch, vocab)).astype(np.float32) * 2
  table = rng.normal(size=(shape.max_depth + 1, vocab, vocab)).astype(np.float32) * 2
  calls = []

  def expand(nodes, drawn_Bn, call, positions_Bn, parents_Bn):
    calls.append((call, parents_Bn))
    depth = shape.depths[nodes[0]]
    return jnp.asarray(table)[depth][drawn_Bn]

  @jax.jit  # One program (eagerly, about 140 small compiles); ``calls`` records its trace.
  def grow(root_logits):
    tokens, probs, proposed, _, expansions, parents = proposals.grow_tree(
      jax.random.key(0),
      shape,
      root_logits,
      jnp.asarray([4, 7]),
      jnp.asarray([3, 3]),
      sampling,
      vocab,
      expand,
      proposal="greedy",
    )
    assert expansions == shape.max_depth - 1
    assert probs is None  # Chosen tokens: one-hot q, as the point mass at each (q = None).
    call, parents_Bn = calls[1]
    return tokens, proposed, parents, call.mask_TM, parents_Bn

  tokens, proposed, parents, masks, parents_Bn = map(np.asarray, grow(jnp.asarray(root_logits)))

  def child(path):
    return table[len(path)][path[-1]]

  if tau != 1.0:  # The sharper ranking keeps a different set of paths in some row.
    assert any(
      set(_beam(root_logits[row], child, widths, sampling, tau))
      != set(_beam(root_logits[row], child, widths, sampling))
      for row in range(batch)
    )
  for row in range(batch):
    expected = _beam(root_logits[row], child, widths, sampling, tau)
    got = {}
    for j in range(shape.num_nodes):
      path, u = [], j
      while u >= 0:
        path.insert(0, int(tokens[row, u]))
        parent = int(parents[row, u])
        assert parent == -1 or shape.depths[parent] == shape.depths[u] - 1
        u = parent
      if proposed[row, j]:
        got[tuple(path)] = j
    assert set(got) == set(expected)
    for depth in range(1, shape.max_depth + 1):  # Best first within each depth.
      nodes = [j for j in shape.nodes_at_depth(depth) if proposed[row, j]]
      scores = [expected[next(p for p, i in got.items() if i == j)] for j in nodes]
      assert scores == sorted(scores, reverse=True)
  # Each expansion's per-row mask: the root, the node's ancestors and itself.
  assert masks.shape == (batch, widths[1], shape.num_nodes + 1)
  for row, k in itertools.product(range(batch), range(widths[1])):
    j = shape.nodes_at_depth(2)[k]
    expected_slots = {0, 1 + j, 1 + int(parents[row, j])}
    assert set(np.flatnonzero(masks[row, k])) == expected_slots
    assert int(parents_Bn[row, k]) == int(parents[row, j])


def _random_dynamic_parents(shape, batch, rng):
  parents = np.full((batch, shape.num_nodes), -1, np.int32)
  for depth in range(2, shape.max_depth + 1):
    previous = shape.nodes_at_depth(depth - 1)
    for j in shape.nodes_at_depth(depth):
      parents[:, j] = rng.choice(previous, size=batch)
  return parents


@pytest.mark.slow
def test_per_row_tree_call_scores_each_node_as_its_own_sequence():
  """Each row's own tree (its parents) under one scoring call: every node gets the logits of
  the plain sequence prompt + its root path in that row."""
  model = transformer.create(tiny_config(vocab_size=50), seed=0)
  shape = tree_lib.dynamic((2, 3, 2))
  batch, prompt_length = 3, 5
  rng = np.random.default_rng(1)
  prompts = rng.integers(0, 50, (batch, prompt_length))
  nodes = rng.integers(0, 50, (batch, shape.num_nodes))
  parents = _random_dynamic_parents(shape, batch, rng)
  proposal = drafters.TreeProposal(
    jnp.asarray(nodes), None, None, None, None, parents=jnp.asarray(parents)
  )
  mask = tree_step.row_masks(proposal)
  root = jnp.full((batch,), prompt_length - 1)
  cache = model.init_cache(batch, 32)
  _, cache = model(jnp.asarray(prompts[:, :-1]), None, cache)
  positions = (prompt_length - 1) + shape.position_offsets()[None].repeat(batch, 0)
  call = TreeCall(root, jnp.arange(shape.num_nodes + 1), mask)
  logits, _ = model(
    jnp.asarray(np.concatenate([prompts[:, -1:], nodes], 1)),
    jnp.asarray(positions),
    cache,
    tree=call,
  )
  # One compiled reference: each sequence padded to the longest (causal: padding is unseen).
  width = prompt_length + shape.max_depth
  reference_logits = jax.jit(lambda sequence: model(sequence)[0])
  for row in range(batch):
    for j in range(shape.num_nodes):
      path, u = [], j
      while u >= 0:
        path.insert(0, int(nodes[row, u]))
        u = int(parents[row, u])
      sequence = np.concatenate([prompts[row], path])
      padded = np.pad(sequence, (0, width - len(sequence)))[None]
      reference = reference_logits(jnp.asarray(padded))[0, len(sequence) - 1]
      np.testing.assert_allclose(logits[row, 1 + j], reference, atol=2e-5)


@pytest.mark.parametrize("greedy", [False, True])
def test_token_verifier_with_per_row_parents_is_each_rows_static_verifier(greedy):
  """Rows with different parents, verified in one call, give what the static verifier gives
  each row on its own tree (same coins: the same key and batch shape)."""
  shape = tree_lib.dynamic((2, 2, 2))
  batch, vocab = 12, 5
  rng = np.random.default_rng(2)
  structures = [_random_dynamic_parents(shape, 1, rng)[0] for _ in range(3)]
  parents = np.stack([structures[b % 3] for b in range(batch)])
  tokens = rng.integers(0, vocab, (batch, shape.num_nodes)).astype(np.int32)
  q = jax.nn.one_hot(tokens, vocab)
  p = rng.dirichlet(np.ones(vocab) * 0.7, (batch, shape.num_nodes + 1)).astype(np.float32)
  proposed = np.ones((batch, shape.num_nodes), bool)
  proposed[::5, 4:] = False
  verify = tv.TREE_VERIFIERS["argmax" if greedy else "token"]
  for seed in range(4):
    key = jax.random.key(seed)
    dynamic = verify(key, shape, tokens, q, p, proposed, parents_BN=jnp.asarray(parents))
    for s, structure in enumerate(structures):
      static = verify(key, tree_lib.TreeShape(tuple(structure)), tokens, q, p, proposed)
      rows = np.arange(s, batch, 3)
      for field in ("num_accepted", "path", "next_token"):
        np.testing.assert_array_equal(
          np.asarray(getattr(dynamic, field))[rows], np.asarray(getattr(static, field))[rows]
        )
