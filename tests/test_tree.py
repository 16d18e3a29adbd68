"""Tree proposals: shapes, tree attention and cache compaction in the Transformer, and the
loop's tree step (a chain-shaped tree reproduces the chain path; greedy trees reproduce
autoregressive greedy). Exactness by G-test: tests/test_certify.py (tree cases) and the
verifiers by exact enumeration: tests/test_tree_verification.py."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from bigram import random_bigram
from conftest import tiny_config

from specsamp.models import transformer
from specsamp.models.attention import TreeCall
from specsamp.sampling import drafters, generate, speculative_generate, tree_step
from specsamp.sampling import tree as tree_lib
from specsamp.sampling import tree_verification as tv
from specsamp.sampling.drafters import PromptLookupDrafter
from specsamp.testing import exactness


def test_shapes_from_their_strings():
  two_chains = tree_lib.parse("chains:2x3")
  assert two_chains.parents == (-1, -1, 0, 1, 2, 3)
  assert two_chains.depths == (1, 1, 2, 2, 3, 3) and not two_chains.distinct_siblings
  branching = tree_lib.parse("tree:2,2,1")
  assert branching.parents == (-1, -1, 0, 0, 1, 1, 2, 3, 4, 5)
  assert branching.num_nodes == 10 and branching.max_depth == 3 and branching.distinct_siblings
  assert branching.sibling_rank[:6] == (0, 1, 0, 1, 0, 1)
  assert tree_lib.parse("tree:3,1/iid").distinct_siblings is False
  assert tree_lib.parse("chain:4").is_chain and not branching.is_chain
  assert tree_lib.parse("parents:-1,0,0").children(0) == (1, 2)
  mask = tree_lib.parse("tree:2,1").attention_mask()
  # Root, a, b, a's child, b's child: each sees the root, its ancestors and itself.
  np.testing.assert_array_equal(
    mask.astype(int),
    [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 0, 1, 0, 1]],
  )
  np.testing.assert_array_equal(tree_lib.parse("tree:2,1").position_offsets(), [0, 1, 1, 2, 2])


@pytest.mark.parametrize(
  "spec, message",
  [
    ("tree:2,0", "Branching factors"),
    ("shrub:2", "unknown kind"),
    ("parents:-1,1", "parent is 1"),
    ("parents:-1,0,-1", "depth by depth"),
    ("chains:2x4/some", "suffix"),
    ("tree:2/", "suffix must be '/iid' or '/distinct'"),  # Read as no suffix before 2026-11-30.
  ],
)
def test_bad_tree_strings_say_what_is_allowed(spec, message):
  with pytest.raises(ValueError, match=message):
    tree_lib.parse(spec)


@pytest.mark.slow
def test_one_tree_call_scores_every_node_as_its_own_sequence(block_size=4):
  """Scoring [root, nodes] under the ancestor mask gives each node the logits of the plain
  sequence prompt + its root path; so does growing the tree depth by depth (the drafter);
  and compacting a path leaves a cache that continues exactly like the path's sequence.
  The cache is read in blocks of 4 slots (the loop tests read it whole)."""
  model = transformer.create(tiny_config(attention_block_size=block_size, vocab_size=50), seed=0)
  shape = tree_lib.branching((2, 1, 1))
  batch, prompt_length = 2, 5
  rng = np.random.default_rng(0)
  prompts = rng.integers(0, 50, (batch, prompt_length))
  nodes = rng.integers(0, 50, (batch, shape.num_nodes))
  root = jnp.full((batch,), prompt_length - 1)
  run = jax.jit(
    lambda tokens, positions, cache, tree=None: model(tokens, positions, cache, tree=tree)
  )
  cache = model.init_cache(batch, 40)
  _, cache = run(
    jnp.asarray(prompts[:, :-1]), jnp.tile(jnp.arange(prompt_length - 1), (2, 1)), cache
  )
  positions = (prompt_length - 1) + shape.position_offsets()[None].repeat(batch, 0)
  call = TreeCall(root, jnp.arange(shape.num_nodes + 1), jnp.asarray(shape.attention_mask()))
  logits, scored = run(
    jnp.asarray(np.concatenate([prompts[:, -1:], nodes], 1)),
    jnp.asarray(positions),
    cache,
    tree=call,
  )
  assert scored.lengths.tolist() == [prompt_length + shape.num_nodes] * batch
  _, grown = run(jnp.asarray(prompts[:, -1:]), root[:, None], cache)
  by_depth = {}
  for depth in range(1, shape.max_depth + 1):
    level = np.array(shape.nodes_at_depth(depth))
    level_call = TreeCall(
      root, jnp.asarray(1 + level), jnp.asarray(shape.attention_mask()[1 + level])
    )
    level_logits, grown = run(
      jnp.asarray(nodes[:, level]), jnp.asarray(positions[:, 1 + level]), grown, tree=level_call
    )
    by_depth.update({int(i): level_logits[:, k] for k, i in enumerate(level)})
  last_logits = jax.jit(lambda tokens: model(tokens)[0][:, -1])
  np.testing.assert_allclose(logits[:, 0], last_logits(jnp.asarray(prompts)), atol=2e-5)
  for i in range(shape.num_nodes):
    path = np.flatnonzero(shape.ancestors[i])
    reference = last_logits(jnp.asarray(np.concatenate([prompts, nodes[:, path]], 1)))
    np.testing.assert_allclose(logits[:, i + 1], reference, atol=2e-5)
    np.testing.assert_allclose(by_depth[i], reference, atol=2e-5)
  path = [1, 3, 5]  # The second depth-1 node, its child, and that child's child.
  assert [shape.parents[n] for n in path] == [-1, 1, 3]
  compacted = model.compact_cache(
    scored, jnp.asarray(np.tile(prompt_length + np.array(path), (batch, 1))), root + 1
  ).replace(lengths=root + 1 + len(path))
  following = rng.integers(0, 50, (batch, 1))
  continued, _ = run(jnp.asarray(following), (root + 1 + len(path))[:, None], compacted)
  sequence = np.concatenate([prompts, nodes[:, path], following], 1)
  np.testing.assert_allclose(continued[:, 0], last_logits(jnp.asarray(sequence)), atol=2e-5)


def test_a_tree_longer_than_a_sliding_window_is_refused():
  model = transformer.create(tiny_config(sliding_window=4), seed=0)
  shape = tree_lib.branching((2, 2))
  call = TreeCall(jnp.zeros((1,), jnp.int32), jnp.arange(7), jnp.asarray(shape.attention_mask()))
  with pytest.raises(ValueError, match="sliding windows of at least 7"):
    model(
      jnp.zeros((1, 7), jnp.int32), jnp.zeros((1, 7), jnp.int32), model.init_cache(1, 16), tree=call
    )


PROMPTS = np.array([[5, 9, 14, 5, 9, 7, 40], [8, 8, 31, 0, 0, 0, 0], [60, 2, 17, 90, 60, 2, 0]])
LENGTHS = np.array([7, 3, 6])


@pytest.fixture(scope="module")
def pair():
  target = transformer.create(tiny_config(), seed=0)
  return target, exactness.noisy_copy(target, 0.3, seed=4)


@pytest.mark.slow
@pytest.mark.extended  # Reduced in the suite: test_tree_verification.py's chain-shaped tree
# verified bit for bit as the chain verifier, and the greedy trees' identity below.
def test_a_chain_shaped_tree_gives_the_chain_path_tokens(pair):
  target, draft = pair
  common = dict(max_new_tokens=13, num_draft_tokens=3, eos_id=7)
  chain = speculative_generate(target, draft, PROMPTS, LENGTHS, jax.random.key(1), **common)
  tree = speculative_generate(
    target, draft, PROMPTS, LENGTHS, jax.random.key(1), tree="chain:3", **common
  )
  np.testing.assert_array_equal(np.asarray(tree.tokens), np.asarray(chain.tokens))
  tree_stats, chain_stats = tree.summary(), chain.summary()
  # The chain's draft loop stops when no row needs another token; a tree makes its D calls.
  assert tree_stats.pop("draft_calls") >= chain_stats.pop("draft_calls")
  assert tree_stats == chain_stats


def test_greedy_trees_equal_greedy_autoregressive_and_accept_more_per_call(pair):
  target, draft = pair
  common = dict(max_new_tokens=15, temperature=0)
  reference = generate(target, PROMPTS, LENGTHS, jax.random.key(0), **common)
  out = speculative_generate(
    target,
    draft,
    PROMPTS,
    LENGTHS,
    jax.random.key(2),
    num_draft_tokens=3,
    tree="tree:3,1,1",
    verifier="traversal",
    schedule="heuristic",
    **common,
  )
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(reference.tokens))
  stats = out.summary()
  assert stats["num_draft_tokens"] == 3 and len(stats["acceptance_at_position"]) == 3
  assert stats["mean_draft_length"] > 3  # Nodes proposed per call: more than one chain's.


def _short_run(target, drafter, **settings):
  """A 4-token speculative call on the shared prompts (the refusal tests' one call)."""
  return speculative_generate(
    target, drafter, PROMPTS, LENGTHS, jax.random.key(0), max_new_tokens=4, **settings
  )


def test_tree_settings_that_cannot_work_are_refused(pair):
  target, draft = pair
  run = functools.partial(_short_run, target)
  with pytest.raises(ValueError, match="must equal the tree's depth, 3"):
    run(draft, num_draft_tokens=4, tree="tree:2,1,1")
  with pytest.raises(ValueError, match="one of \\('token', 'traversal'\\)"):
    run(draft, num_draft_tokens=2, tree="chains:2x2", verifier="block")
  with pytest.raises(ValueError, match="verifies trees"):
    run(draft, num_draft_tokens=2, verifier="traversal")
  with pytest.raises(ValueError, match="proposes single chains only"):
    run(PromptLookupDrafter(), num_draft_tokens=2, tree="chains:2x2")
  # More distinct siblings than tokens: greedy proposals and T = 0 failed inside tracing
  # (top_k past the vocabulary); i.i.d. siblings may repeat a token (the review of 2026-11-29).
  with pytest.raises(
    ValueError, match=f"distinct siblings are at most the vocabulary's {target.vocab_size}"
  ):
    run(draft, num_draft_tokens=2, tree=f"tree:{target.vocab_size + 1},1")
  iid = f"tree:{target.vocab_size + 1},1/iid"
  tree_step.check_tree(iid, 2, "token", target, drafters.ModelDrafter(draft))
  with pytest.raises(ValueError, match="A tree of 1,025 nodes"):
    tree_lib.parse("tree:1025")
  with pytest.raises(TypeError, match="cannot score or draft a tree"):
    speculative_generate(
      NoTree(random_bigram(8, 0)),
      random_bigram(8, 1),
      PROMPTS % 8,
      LENGTHS,
      jax.random.key(0),
      max_new_tokens=4,
      num_draft_tokens=2,
      tree="chains:2x2",
    )


def test_greedy_dynamic_trees_equal_greedy_autoregressive(pair):
  target, draft = pair
  common = dict(max_new_tokens=15, temperature=0)
  reference = generate(target, PROMPTS, LENGTHS, jax.random.key(0), **common)
  out = speculative_generate(
    target,
    drafters.ModelDrafter(draft, proposal="greedy"),
    PROMPTS,
    LENGTHS,
    jax.random.key(2),
    num_draft_tokens=3,
    tree="dynamic:3,3,2",
    **common,
  )
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(reference.tokens))
  assert out.summary()["mean_draft_length"] > 3


def test_dynamic_settings_that_cannot_be_exact_are_refused(pair):
  target, draft = pair
  run = functools.partial(_short_run, target)
  with pytest.raises(ValueError, match="use proposal='greedy'"):
    run(draft, num_draft_tokens=2, tree="dynamic:2x2")
  greedy = drafters.ModelDrafter(draft, proposal="greedy")
  with pytest.raises(ValueError, match="verifier='token'"):
    run(greedy, num_draft_tokens=2, tree="dynamic:2x2", verifier="traversal")
  with pytest.raises(ValueError, match="at most one child per token"):
    run(greedy, num_draft_tokens=2, tree=f"dynamic:{target.vocab_size + 1},1")
  with pytest.raises(ValueError, match="confidence_threshold applies"):
    run(
      drafters.ModelDrafter(draft, proposal="greedy", confidence_threshold=0.2),
      num_draft_tokens=2,
      tree="dynamic:2x2",
    )
  with pytest.raises(ValueError, match="walks a static tree"):
    shape = tree_lib.dynamic((2,))
    tv.traversal_verify(
      jax.random.key(0),
      shape,
      jnp.zeros((1, 2), jnp.int32),
      jnp.ones((1, 2, 3)) / 3,
      jnp.ones((1, 3, 3)) / 3,
      jnp.ones((1, 2), bool),
    )


class NoTree:
  """A decode-protocol model without tree calls (parts (e) and (f))."""

  def __init__(self, model):
    self.model, self.vocab_size = model, model.vocab_size

  def init_cache(self, batch_size, max_length):
    return self.model.init_cache(batch_size, max_length)

  def __call__(self, tokens_BT, positions_BT, cache):
    return self.model(tokens_BT, positions_BT, cache)


def _all_trees(num_nodes, max_depth, max_children):
  """Every breadth-first tree of exactly num_nodes nodes within the limits (brute force)."""
  for parents in itertools.product(*[range(-1, i) for i in range(num_nodes)]):
    try:
      shape = tree_lib.TreeShape(parents)
    except ValueError:
      continue
    if shape.max_depth <= max_depth and shape.max_children <= max_children:
      yield shape


@pytest.mark.parametrize("acceptance", [(0.7, 0.2, 0.05), (0.5, 0.4, 0.3), (0.9, 0.02, 0.01)])
def test_sequoia_tree_is_the_best_tree_by_brute_force(acceptance):
  for num_nodes, max_depth in [(4, 2), (6, 3), (6, 6)]:
    shape = tree_lib.sequoia(acceptance, num_nodes, max_depth)
    assert shape.num_nodes <= num_nodes and shape.max_depth <= max_depth
    value = tree_lib.expected_accepted(shape, acceptance)
    best = max(
      tree_lib.expected_accepted(t, acceptance)
      for n in range(1, num_nodes + 1)
      for t in _all_trees(n, max_depth, len(acceptance))
    )
    assert value == pytest.approx(best, abs=1e-12)
  assert tree_lib.parse("sequoia:6x3@0.7,0.2,0.05") == tree_lib.sequoia((0.7, 0.2, 0.05), 6, 3)
  # A chain when only the first rank is ever accepted.
  assert tree_lib.sequoia((0.8, 0.0), 5, 5).is_chain
  with pytest.raises(ValueError, match="acceptances in \\[0, 1\\]"):
    tree_lib.sequoia((1.2,), 4, 2)
  # All acceptances 0: the best tree is empty, said as such (was "needs at least one node").
  with pytest.raises(ValueError, match="are all 0, so every tree is expected to accept nothing"):
    tree_lib.parse("sequoia:3x2@0,0")
  # Refused before the search (quadratic in the nodes: 2.8 s for 1,030 before 2026-11-30).
  with pytest.raises(ValueError, match="up to 100,000 nodes: specsamp scores at most 1,024"):
    tree_lib.parse("sequoia:100000x10@0.9,0.9")


def test_rank_counts_follow_the_accepted_path():
  """Counts per sibling rank against a direct reading of one verdict: accepted nodes by rank,
  and proposed nodes whose parent is on the path (or is the root)."""
  from specsamp.sampling import drafters, tree_step, tree_verification

  shape = tree_lib.parse("tree:3,2,1")  # Ranks 0-2 at depth 1, 0-1 at depth 2.
  proposed = np.ones((2, shape.num_nodes), bool)
  proposed[1, 2] = False  # Row 1: the root's third child (and its subtree) not proposed.
  proposed[1, [7, 8, 13, 14]] = False
  path = np.array([[1, 6, 0], [0, 3, 9]])  # Row 0: node 1, then its second child, node 6.
  verdict = tree_verification.TreeVerdict(
    num_accepted=jnp.asarray([2, 1]), path=jnp.asarray(path), next_token=jnp.zeros(2, jnp.int32)
  )
  proposal = drafters.TreeProposal(
    jnp.zeros((2, shape.num_nodes), jnp.int32), None, jnp.asarray(proposed), None, None
  )
  accepted, reached = map(np.asarray, tree_step.rank_counts(shape, proposal, verdict))
  assert shape.max_children == 3 and shape.children(1) == (5, 6) and shape.children(6) == (12,)
  # Row 0: nodes 1 and 6, both rank 1; reached: the root's 3 children (ranks 0-2), node 1's 2
  # children (5, 6) and node 6's one (12).
  np.testing.assert_array_equal(accepted[0], [0, 2, 0])
  np.testing.assert_array_equal(reached[0], [3, 2, 1])
  # Row 1: node 0 (rank 0); reached: the root's 2 proposed children, node 0's 2 children.
  np.testing.assert_array_equal(accepted[1], [1, 0, 0])
  np.testing.assert_array_equal(reached[1], [2, 2, 0])
