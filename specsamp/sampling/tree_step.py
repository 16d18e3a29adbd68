r"""One iteration's draft-score-verify for a TREE proposal (multi-draft / token trees).

The speculative loop (``speculative.py``) runs this in place of the single-chain
step when it is given a ``tree.TreeShape``; everything else in the loop
(appending, EOS, max_new_tokens, statistics, schedules, the caches' rollback) is
shared. For a row of n tokens, whose caches hold positions 0..n-2:

  1. Draft: the drafter proposes N nodes (tokens, the q each was drawn from, and
     which are proposed: nodes deeper than the row's draft limit are not).
  2. Score: ONE target call on [x_{n-1}, x~_0..x~_{N-1}]: the root at slot
     n-1, node i at slot n+i and position n-1+depth(i), each attending to the
     row's cache and its own ancestors (``attention.TreeCall``), gives p at the
     root and after every node.
  3. Verify (``tree_verification.py``): the accepted path x~_{path_1..path_a},
     a = its depth, and one emitted token.
  4. Compact: in the target's cache and the draft's, slot n + path_d moves to
     slot n + d - 1 (position n-1+d), so the path sits at the row's consecutive
     positions. The loop then rolls both caches back by their lengths, as for a
     chain: nothing is recomputed. A feature drafter receives the target's
     features of the scoring call along the accepted path (root, then the path's
     nodes), the inputs of its next catch-up.

A chain-shaped tree (``tree.chain(K)``) runs the same computation as the chain
step, draws included, and gives the same tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from specsamp.models.attention import TreeCall
from specsamp.sampling import drafters, model_protocol, proposals, threefry, tree_verification
from specsamp.sampling import tree as tree_lib
from specsamp.sampling.tree import TreeShape
from specsamp.sampling.warping import SamplingConfig, probabilities


@struct.dataclass
class StepResult:
  """What the loop needs from one draft-score-verify step (chain or tree).

  Attributes:
    path_tokens: [B, D] the accepted draft tokens, in order (entries past num_accepted unused).
    num_accepted: [B] draft tokens accepted.
    next_token: [B] the emitted token.
    proposed_depth: [B] the deepest proposed draft position (k_b for a chain).
    proposed_nodes: [B] draft tokens proposed in all (k_b for a chain, nodes for a tree).
    target_cache, drafter_state: after the step, not yet rolled back.
    draft_calls: scalar, draft model calls.
    nan: [B] either model produced NaN for the row.
    rank_counts: ([B, R], [B, R]) accepted and reached nodes per sibling rank (a tree's,
      ``rank_counts``); None for a chain (rank 0 only, counted from the verdict).
  """

  path_tokens: jax.Array
  num_accepted: jax.Array
  next_token: jax.Array
  proposed_depth: jax.Array
  proposed_nodes: jax.Array
  target_cache: Any
  drafter_state: Any
  draft_calls: jax.Array
  nan: jax.Array
  rank_counts: tuple[jax.Array, jax.Array] | None = None


TREE_VERIFIERS = ("token", "traversal")  # Exact tree verifiers; temperature 0 uses argmax.


def check_tree(
  tree: str | TreeShape | None,
  num_draft_tokens: int,
  verifier: str,
  target: Any,
  drafter: drafters.Drafter,
) -> TreeShape | None:
  """The tree proposal's shape, checked against the other settings and the models."""
  if tree is None:
    if verifier == "traversal":
      raise ValueError(
        "verifier='traversal' verifies trees; give a tree (e.g. tree='chains:2x4'), or use "
        "'block' for a single chain (to which traversal verification reduces)."
      )
    return None
  if isinstance(tree, str):
    tree = tree_lib.parse(tree)
  if tree.max_depth != num_draft_tokens:
    raise ValueError(
      f"num_draft_tokens={num_draft_tokens} must equal the tree's depth, {tree.max_depth} "
      f"({tree.describe()}): a tree's depth is its draft length."
    )
  if verifier not in TREE_VERIFIERS:
    raise ValueError(
      f"A tree is verified by one of {TREE_VERIFIERS} (both exact), got verifier={verifier!r}."
    )
  if tree.dynamic and verifier != "token":
    raise ValueError(
      f"A dynamic tree ({tree.describe()}) has per-row parents, which the token verifier "
      f"reads; verifier={verifier!r} walks a static tree. Use verifier='token'."
    )
  if tree.dynamic and max(tree.widths) > target.vocab_size:
    raise ValueError(
      f"A dynamic tree's depth keeps at most one child per token of the vocabulary "
      f"({target.vocab_size}), but {tree.describe()} asks for {max(tree.widths)}."
    )
  model_protocol.check_tree_support(target, "target")
  drafter.check_tree(tree)
  return tree


def row_masks(proposal: drafters.TreeProposal) -> jax.Array:
  """[B, N+1, N+1]: each row's ``TreeShape.attention_mask`` from its own parents (a dynamic
  tree): token t (0: the root, 1 + j: node j) sees the root, itself and its ancestors."""
  parents_BN = proposal.parents
  batch, num_nodes = parents_BN.shape
  mask_BSS = jnp.zeros((batch, num_nodes + 1, num_nodes + 1), bool).at[:, 0, 0].set(True)
  for j in range(num_nodes):  # Parents come before their children.
    slot = jnp.asarray([1 + j], jnp.int32)
    mask_BSS, _ = proposals.extend_ancestors(mask_BSS, parents_BN[:, j : j + 1], slot)
  return mask_BSS


def verifier(name: str, greedy: bool) -> Callable[..., Any]:
  """The tree verifier for a loop's verifier name ('token', 'traversal'); argmax when greedy."""
  return tree_verification.TREE_VERIFIERS["greedy" if greedy else name]


def step(
  tree: TreeShape,
  verifier_name: str,
  sampling: SamplingConfig,
  target: Any,
  drafter: drafters.Drafter,
  target_cache: Any,
  drafter_state: Any,
  tokens_BW: jax.Array,
  lengths_B: jax.Array,
  limit_B: jax.Array,
  key: jax.Array,
) -> StepResult:
  """Draft a tree, score it in one target call, verify it, and compact both caches."""
  batch = tokens_BW.shape[0]
  rows_B = jnp.arange(batch)
  root_B = lengths_B - 1
  with jax.named_scope("draft_tree"):
    proposal, drafter_state = drafter.propose_tree(
      drafter_state,
      tokens_BW,
      lengths_B,
      threefry.fold_in(key, 0),
      tree,
      limit_B,
      sampling,
      target.vocab_size,
    )
  with jax.named_scope("score_tree"):
    offsets_T = tree.position_offsets()
    call = TreeCall(
      root_B,
      jnp.arange(tree.num_nodes + 1, dtype=jnp.int32),
      jnp.asarray(tree.attention_mask()) if proposal.parents is None else row_masks(proposal),
    )
    capture = {"capture_layers": drafter.feature_layers} if drafter.feature_layers else {}
    scored = target(
      jnp.concatenate([tokens_BW[rows_B, root_B][:, None], proposal.tokens], axis=1),
      root_B[:, None] + jnp.asarray(offsets_T)[None, :],
      target_cache,
      tree=call,
      **capture,
    )
    target_logits_BTV, target_cache = scored[:2]
  with jax.named_scope("verify_tree"):
    verdict = verifier(verifier_name, sampling.greedy)(
      threefry.fold_in(key, 1),
      tree,
      proposal.tokens,
      proposal.probs,
      probabilities(target_logits_BTV, sampling),
      proposal.proposed,
      parents_BN=proposal.parents,
    )
  with jax.named_scope("compact"):
    # Node i sits at slot n + i; the path's depth-d node goes to slot n + d - 1.
    source_BD = lengths_B[:, None] + verdict.path
    target_cache = target.compact_cache(target_cache, source_BD, lengths_B)
    drafter_state = drafter.accept_path(drafter_state, source_BD, lengths_B)
    if drafter.feature_layers:  # The target's features along the accepted path: the root's,
      # then the path's nodes' (entries past the accepted depth are never read).
      index_BD1 = jnp.concatenate([jnp.zeros((batch, 1), jnp.int32), 1 + verdict.path], axis=1)
      path_features = jnp.take_along_axis(scored[2], index_BD1[:, :, None], axis=1)
      drafter_state = drafter.observe(drafter_state, path_features, root_B)
  depths_N = jnp.asarray(tree.depths, jnp.int32)
  return StepResult(
    path_tokens=jnp.take_along_axis(proposal.tokens, verdict.path, axis=1),
    num_accepted=verdict.num_accepted,
    next_token=verdict.next_token,
    proposed_depth=jnp.max(jnp.where(proposal.proposed, depths_N[None, :], 0), axis=1),
    proposed_nodes=jnp.sum(proposal.proposed, axis=1, dtype=jnp.int32),
    target_cache=target_cache,
    drafter_state=drafter_state,
    draft_calls=proposal.model_calls,
    nan=model_protocol.has_nan(target_logits_BTV) | proposal.nan,
    rank_counts=rank_counts(tree, proposal, verdict),
  )


def rank_counts(
  tree: TreeShape, proposal: drafters.TreeProposal, verdict: tree_verification.TreeVerdict
) -> tuple[jax.Array, jax.Array]:
  """([B, R] accepted, [B, R] reached): per sibling rank r (a node's index among its parent's
  children in that row, R = ``tree.max_children``), the accepted path's nodes of rank r, and
  the proposed nodes of rank r whose parent is on the accepted path (or is the root). Their
  ratio is the acceptance per sibling rank that shapes Sequoia trees (``tree.sequoia``)."""
  batch, num_nodes = proposal.tokens.shape
  parents_BN = proposal.parents
  nodes_N = jnp.arange(num_nodes)
  if parents_BN is None:  # A static tree: its shape knows its ranks.
    parents_BN = jnp.broadcast_to(jnp.asarray(tree.parents, jnp.int32), (batch, num_nodes))
    rank_BN = jnp.broadcast_to(jnp.asarray(tree.sibling_rank, jnp.int32), (batch, num_nodes))
  else:  # A dynamic tree: node j's rank is its earlier siblings in its row.
    earlier_NN = nodes_N[None, :] < nodes_N[:, None]  # [j, i]: i comes before j.
    same_parent_BNN = parents_BN[:, :, None] == parents_BN[:, None, :]
    rank_BN = jnp.sum(same_parent_BNN & earlier_NN[None], axis=2)
  depth_D = jnp.arange(verdict.path.shape[1])
  accepted_BD = depth_D[None, :] < verdict.num_accepted[:, None]
  on_path_BN = jnp.any(
    (verdict.path[:, :, None] == nodes_N[None, None, :]) & accepted_BD[:, :, None], axis=1
  )
  parent_on_path_BN = jnp.take_along_axis(on_path_BN, jnp.maximum(parents_BN, 0), axis=1)
  reached_BN = proposal.proposed & ((parents_BN < 0) | parent_on_path_BN)
  rank_BNR = jax.nn.one_hot(rank_BN, tree.max_children, dtype=jnp.int32)
  return (
    jnp.sum(rank_BNR * on_path_BN[:, :, None], axis=1),
    jnp.sum(rank_BNR * reached_BN[:, :, None], axis=1),
  )
