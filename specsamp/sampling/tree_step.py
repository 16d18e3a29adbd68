r"""One iteration's draft-score-verify for a TREE proposal (multi-draft / token trees).

The speculative loop (``speculative.py``) builds a ``TreeStep`` in place of the
``chain_step.ChainStep`` when it is given a ``tree.TreeShape``: the same call and the same
result (``step.py``), so everything else in the loop (appending, EOS, max_new_tokens,
statistics, schedules, the caches' rollback) is shared. For a row of n tokens, whose caches
hold positions 0..n-2:

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

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from specsamp.models.attention import TreeCall
from specsamp.sampling import drafters, model_protocol, proposals, threefry, tree_verification
from specsamp.sampling import tree as tree_lib
from specsamp.sampling.step import StepInput, StepResult
from specsamp.sampling.tree import TreeShape
from specsamp.sampling.warping import SamplingConfig, probabilities

VERIFIERS = ("token", "traversal")  # A user's choice of exact tree verifier (argmax at T=0).


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
  if not isinstance(tree, TreeShape):  # An AttributeError on max_depth before 2026-11-30.
    raise ValueError(
      f"tree must be None, a tree spec string (e.g. 'tree:2,2') or a TreeShape, got {tree!r}."
    )
  if tree.max_depth != num_draft_tokens:
    raise ValueError(
      f"num_draft_tokens={num_draft_tokens} must equal the tree's depth, {tree.max_depth} "
      f"({tree.describe()}): a tree's depth is its draft length."
    )
  if verifier not in VERIFIERS:
    raise ValueError(
      f"A tree is verified by one of {VERIFIERS} (both exact), got verifier={verifier!r}."
    )
  if tree.dynamic and verifier != "token":
    raise ValueError(
      f"A dynamic tree ({tree.describe()}) has per-row parents, which the token verifier "
      f"reads; verifier={verifier!r} walks a static tree. Use verifier='token'."
    )
  check_widths(tree, target.vocab_size)
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
  return tree_verification.TREE_VERIFIERS["argmax" if greedy else name]


@dataclasses.dataclass(frozen=True)
class TreeStep:
  """The tree step's static settings (hashable); calling it runs one step.

  Attributes:
    tree: the proposal's shape; its depth is the draft length.
    sampling: the warping both models sample with.
    verifier: 'token' (recursive rejection sampling) or 'traversal' (argmax at T=0).
  """

  tree: TreeShape
  sampling: SamplingConfig
  verifier: str

  @property
  def ranks(self) -> int:
    return self.tree.max_children

  def __call__(
    self,
    target: Any,
    drafter: drafters.Drafter,
    inputs: StepInput,
    key: jax.Array,
    synthetic_acceptance: jax.Array,
  ) -> StepResult:
    """Draft a tree, score it in one target call, verify it, and compact both caches
    (``synthetic_acceptance`` is a chain's benchmark setting; a tree takes none)."""
    tree, sampling = self.tree, self.sampling
    tokens_BW, lengths_B = inputs.tokens, inputs.lengths
    batch = tokens_BW.shape[0]
    rows_B = jnp.arange(batch)
    root_B = lengths_B - 1
    with jax.named_scope("draft_tree"):
      proposal, drafter_state = drafter.propose_tree(
        inputs.drafter_state,
        tokens_BW,
        lengths_B,
        threefry.fold_in(key, 0),
        tree,
        inputs.limit,
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
      scored = model_protocol.score(
        target,
        jnp.concatenate([tokens_BW[rows_B, root_B][:, None], proposal.tokens], axis=1),
        root_B[:, None] + jnp.asarray(offsets_T)[None, :],
        inputs.target_cache,
        drafter.feature_layers,
        tree=call,
      )
      target_logits_BTV, target_cache = scored
    with jax.named_scope("verify_tree"):
      verdict = verifier(self.verifier, sampling.greedy)(
        threefry.fold_in(key, 1),
        tree,
        proposal.tokens,
        proposal.probs,
        probabilities(target_logits_BTV, sampling),
        proposal.drafted,
        parents_BN=proposal.parents,
      )
    with jax.named_scope("compact"):
      # Node i sits at slot n + i; the path's depth-d node goes to slot n + d - 1.
      source_BD = lengths_B[:, None] + verdict.path
      target_cache = target.compact_cache(target_cache, source_BD, lengths_B)
      drafter_state = drafter.accept_path(drafter_state, source_BD, lengths_B)
      if scored.features is not None:  # The target's features along the accepted path: the
        # root's, then the path's nodes' (entries past the accepted depth are never read).
        index_BD1 = jnp.concatenate([jnp.zeros((batch, 1), jnp.int32), 1 + verdict.path], 1)
        path_features = jnp.take_along_axis(scored.features, index_BD1[:, :, None], axis=1)
        drafter_state = drafter.observe(drafter_state, path_features, root_B)
    depths_N = jnp.asarray(tree.depths, jnp.int32)
    return StepResult(
      path_tokens=jnp.take_along_axis(proposal.tokens, verdict.path, axis=1),
      num_accepted=verdict.num_accepted,
      next_token=verdict.next_token,
      draft_depth=jnp.max(jnp.where(proposal.drafted, depths_N[None, :], 0), axis=1),
      num_proposed=jnp.sum(proposal.drafted, axis=1, dtype=jnp.int32),
      target_cache=target_cache,
      drafter_state=drafter_state,
      draft_calls=proposal.model_calls,
      nan=model_protocol.has_nan(target_logits_BTV) | proposal.nan,
      scored_tokens=jnp.int32(tree.num_nodes + 1),
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
  reached_BN = proposal.drafted & ((parents_BN < 0) | parent_on_path_BN)
  rank_BNR = jax.nn.one_hot(rank_BN, tree.max_children, dtype=jnp.int32)
  return (
    jnp.sum(rank_BNR * on_path_BN[:, :, None], axis=1),
    jnp.sum(rank_BNR * reached_BN[:, :, None], axis=1),
  )


def check_widths(tree: TreeShape, vocab_size: int) -> None:
  """Refuses a tree that asks for more distinct tokens at a node or a depth than the
  vocabulary has (checked by the sampler, and by the scripts before anything trains)."""
  if tree.dynamic and max(tree.widths) > vocab_size:
    raise ValueError(
      f"A dynamic tree's depth keeps at most one child per token of the vocabulary "
      f"({vocab_size}), but {tree.describe()} asks for {max(tree.widths)}."
    )
  if not tree.dynamic and tree.distinct_siblings and tree.max_children > vocab_size:
    raise ValueError(
      f"A node's distinct siblings are at most the vocabulary's {vocab_size} tokens, but "
      f"{tree.describe()} gives a node {tree.max_children} children (i.i.d. siblings, "
      "'chains:' or '/iid', may repeat a token)."
    )
