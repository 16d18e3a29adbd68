r"""How a drafter turns its logits into proposals, and which q each proposal is verified with.

Two proposal modes (a drafter's ``proposal`` field), both exact:

  'sampled'  every token is DRAWN from the drafter's real warped q (the target's temperature,
             top-k and top-p), and that q goes to the verifier: min(1, p/q) accepts. Siblings
             in a tree are drawn i.i.d. or without replacement (``TreeShape``), each with the
             distribution it was actually drawn from.
  'greedy'   every token is CHOSEN: the drafter's most likely token (a chain), or the r-th
             most likely for the sibling of rank r (a tree with distinct siblings). A
             deterministic choice is a draw from a point mass, so its q is one-hot, and the
             verifier accepts x~ with probability min(1, p(x~)/1) = p(x~). This is how EAGLE
             is verified in vLLM, SGLang, TensorRT-LLM and tpu-inference.

Why both are exact. The verifiers are exact for any proposal, as long as each token is
reported with the distribution it was drawn from, the tree's shape (how many children a node
gets) is fixed before those children are drawn, and the draws are independent of the
target's coins. A real q is the law of a sampled token; a one-hot q is the law of a chosen
token, and also of ANY token given the draws that produced it. So one-hot verification is
exact for sampled tokens too, and even for a tree reranked or pruned by its own draws; it
only gives acceptance away: it accepts x~ with p(x~), where the real q accepts with
min(1, p(x~)/q(x~)) >= p(x~) (measured: docs/certificate.md). The converse is the fault: a
chosen token verified with the warped q it was not drawn from (the certificate's planted bug
``chosen_real_q``), or a sibling drawn without replacement reported with its parent's whole q
(``siblings_full_q``). Real q is offered only where it is true: sampled tokens, in a tree of
static shape.

At temperature 0 the two coincide: the warped q is one-hot at the argmax already.

Dynamic trees (EAGLE-2, ``tree.dynamic``) are 'greedy' only. Depth d keeps, per row, the w_d
nodes of highest joint draft probability (the product of the draft's warped q along the path,
each factor sharpened to the tree's rank temperature: ``rank_confidence``, ``calibration``)
among the w_d most likely children of each node kept at depth d-1. Which node gets how many
children is then decided by the children's own values: a sampled child would no longer be
distributed as q, so no real q exists to verify it with. Chosen tokens have the one-hot q, and
the tree is a deterministic function of the draft's outputs, settled before the target's
coins: exact. (A dynamic tree with real q would need each node's child count fixed from its
parents' path probabilities BEFORE its children are drawn; not built.)

A drafter with its own reduced vocabulary (the feature head's V_d most frequent tokens) hands
a chain its logits as ``DraftVocabLogits``: warped, drawn from (or argmaxed) over its V_d
entries, the token mapped to the target's id, and q scattered into the target's V. The law is
the same as warping the target-vocabulary logits with -inf outside (temperature, top-k and
top-p see the same finite entries; ties aside, which only decide which q the token is drawn
from, and the verifier gets that q), at V_d / V of the cost: on SmolLM2 8,192 of 49,152.

Functions:
  draw_token(key, logits_BV, sampling, proposal)   one chain position: (token_B, q_BV)
  grow_chain(key, first_logits_BV, step, carry, K, limit_B, sampling, vocab_size, proposal)
      a whole chain: the draft loop every model drafter shares; ``step`` runs its model
  draw_depth(key, tree, depth, parent_q, tokens, greedy_logits)   one depth of a tree
  grow_tree(key, tree, root_logits_BV, root_slot_B, limit_B, sampling, vocab_size, expand, ...)
      a whole tree, depth by depth; ``expand`` runs the drafter's model on a depth's nodes
  grow_dynamic(...)   the same for a dynamic tree, its parents chosen per row
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from specsamp.models.attention import TreeCall
from specsamp.sampling import model_protocol, threefry
from specsamp.sampling.tree import TreeShape
from specsamp.sampling.verification import sample_from
from specsamp.sampling.warping import SamplingConfig, probabilities

PROPOSALS = ("sampled", "greedy")


def fits(proposal: str, tree: TreeShape | None) -> bool:
  """Whether ``proposal`` can fill ``tree``: greedy siblings are the r most likely tokens, so
  they need distinct siblings (a chain, or no tree, has none to speak of); a dynamic tree's
  tokens are chosen, so it needs 'greedy' (module docstring)."""
  if tree is not None and tree.dynamic:
    return proposal == "greedy"
  return proposal != "greedy" or tree is None or tree.is_chain or tree.distinct_siblings


def check_proposal(proposal: str, tree: TreeShape | None = None) -> None:
  """Raises a clear error for an unknown proposal mode, or a tree it cannot fill."""
  if proposal not in PROPOSALS:
    raise ValueError(
      f"proposal must be one of {PROPOSALS} ('sampled': drawn from the real q; 'greedy': the "
      f"most likely tokens, verified with one-hot q), got {proposal!r}."
    )
  if not fits(proposal, tree) and tree.dynamic:
    raise ValueError(
      f"A dynamic tree ({tree.describe()}) keeps the children of highest joint draft "
      "probability, so its tokens are chosen, not drawn, and only one-hot q verifies them "
      "exactly: use proposal='greedy' (--config.speculative.proposal=greedy), or a static "
      "tree with sampled tokens."
    )
  if not fits(proposal, tree):
    raise ValueError(
      f"Greedy proposals choose the r most likely tokens for the r siblings of a node, but the "
      f"tree ({tree.describe()}) draws its siblings i.i.d.: use distinct siblings (a "
      "'/distinct' suffix, e.g. 'chains:2x4/distinct')."
    )


def chosen_q(tokens: jax.Array, warped_q: jax.Array) -> jax.Array | None:
  """The q a CHOSEN token is verified with: the point mass at it (module docstring), written
  None, which every verifier reads as the point mass at the token without a [.., V] one-hot
  (``verification.q_at``, ``verification.excess``). The draft's warped q it was chosen from
  (``warped_q``) is what it must NOT be verified with (the certificate's planted bug
  ``chosen_real_q`` returns it instead)."""
  del tokens, warped_q
  return None


def _q_buffer(first_q: Any, shape: tuple[int, int, int]) -> jax.Array | None:
  """Where a proposal's q go, [B, N, V] zeros, decided by its first position's q
  (``first_q``, an array or its shape): None when that one was chosen (q = None), since a
  proposal's tokens are all drawn or all chosen (``_put``)."""
  return None if first_q is None else jnp.zeros(shape, jnp.float32)


def _put(probs: jax.Array | None, index: Any, q: jax.Array | None) -> jax.Array | None:
  """``probs.at[:, index].set(q)``; None (chosen tokens) stays None."""
  if (probs is None) != (q is None):
    raise ValueError("A proposal's tokens must all be drawn (real q) or all chosen (q = None).")
  return None if q is None else probs.at[:, index].set(q)


@struct.dataclass
class DraftVocabLogits:
  """A drafter's logits over its own vocabulary of V_d target tokens (module docstring): the
  target-vocabulary logits are ``small`` at ``ids`` and -inf elsewhere.

  Attributes:
    small: [B, V_d] the logits over the draft vocabulary.
    ids: [V_d] int32, distinct target ids of the draft vocabulary's entries.
    vocab_size: V, the target's vocabulary.
  """

  small: jax.Array
  ids: jax.Array
  vocab_size: int = struct.field(pytree_node=False)

  def scatter(self, q_BW: jax.Array) -> jax.Array:
    """[B, V]: a distribution over the draft vocabulary placed at its target ids."""
    return jnp.zeros((*q_BW.shape[:-1], self.vocab_size), q_BW.dtype).at[..., self.ids].set(q_BW)


def draw_token(
  key: jax.Array,
  logits_BV: jax.Array | DraftVocabLogits,
  sampling: SamplingConfig,
  proposal: str,
) -> tuple[jax.Array, jax.Array | None]:
  """(token_B, q_BV): one proposed token per row and the distribution it was drawn from; q is
  None for a chosen token (greedy proposals, and any proposal at temperature 0, where the
  warped q is the point mass at the argmax). ``DraftVocabLogits`` are warped and drawn over
  the draft vocabulary, the token mapped to its target id and q placed in the target's V."""
  if isinstance(logits_BV, DraftVocabLogits):
    ids, small_BW = logits_BV.ids, logits_BV.small
    q_BW = probabilities(small_BW, sampling)
    if proposal == "greedy" or sampling.greedy:
      token_B = ids[jnp.argmax(small_BW, axis=-1)].astype(jnp.int32)
      return token_B, chosen_q(token_B, q_BW)
    return ids[sample_from(key, q_BW)].astype(jnp.int32), logits_BV.scatter(q_BW)
  q_BV = probabilities(logits_BV, sampling)  # Warped once: sampled from and verified with.
  if proposal == "greedy" or sampling.greedy:
    token_B = jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
    return token_B, chosen_q(token_B, q_BV)
  return sample_from(key, q_BV), q_BV


def own_probability(logits_BV: jax.Array | DraftVocabLogits, token_B: jax.Array) -> jax.Array:
  """[B] the drafter's own (unwarped) probability of ``token_B``: its confidence."""
  if isinstance(logits_BV, DraftVocabLogits):
    small_BW = logits_BV.small.astype(jnp.float32)
    at_B = jnp.argmax(logits_BV.ids[None, :] == token_B[:, None], axis=-1)
    return jnp.take_along_axis(jax.nn.softmax(small_BW, axis=-1), at_B[:, None], axis=-1)[:, 0]
  return jax.nn.softmax(logits_BV, axis=-1)[jnp.arange(token_B.shape[0]), token_B]


def _has_nan(logits_BV: jax.Array | DraftVocabLogits) -> jax.Array:
  small = logits_BV.small if isinstance(logits_BV, DraftVocabLogits) else logits_BV
  return model_protocol.has_nan(small)


def grow_chain(
  key: jax.Array,
  first_logits_BV: jax.Array,
  step: Callable[[jax.Array, jax.Array, Any], tuple[jax.Array, Any]],
  carry: Any,
  num_draft_tokens: int,
  limit_B: jax.Array,
  sampling: SamplingConfig,
  vocab_size: int,
  proposal: str,
  active_B: jax.Array | None = None,
  confidence_threshold: float = 0.0,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array, Any]:
  """The chain draft loop every model drafter shares: token t (0-based) is drawn from the
  logits before it (``draw_token``, key ``fold_in(key, t)``), then ``step(t + 1, token_B,
  carry) -> (logits_BV, carry)`` runs the drafter's model on it for the next one.

  A row drafts while t < its ``limit_B``, and while it is ``active_B`` (default every row) and
  confident: with ``confidence_threshold`` > 0 it stops after a token whose probability under
  the drafter's own (unwarped) softmax is below it. Rows that stopped ride along until every
  row has, so the model runs only as many steps as the longest row needs.

  Returns:
    (tokens_BG, probs_BGV, num_proposed_B, steps, nan_B, carry): G = ``num_draft_tokens``;
    ``steps`` counts the logits read (the first, then one per ``step`` call); ``nan_B`` marks
    rows whose logits held NaN.
  """
  batch = limit_B.shape[0]

  def draw(t, logits_BV, tokens_BG, probs_BGV, active_B, count_B):
    token_B, q_BV = draw_token(threefry.fold_in(key, t), logits_BV, sampling, proposal)
    confident_B = jnp.ones((batch,), bool)
    if confidence_threshold > 0:
      confident_B = own_probability(logits_BV, token_B) >= confidence_threshold
    count_B = count_B + active_B
    active_B = active_B & (t + 1 < limit_B) & confident_B
    return (
      tokens_BG.at[:, t].set(token_B),
      _put(probs_BGV, t, q_BV),
      active_B,
      count_B,
      _has_nan(logits_BV),
    )

  tokens_BG = jnp.zeros((batch, num_draft_tokens), jnp.int32)
  first_q = jax.eval_shape(lambda x: draw_token(key, x, sampling, proposal)[1], first_logits_BV)
  probs_BGV = _q_buffer(first_q, (batch, num_draft_tokens, vocab_size))
  active_B = (limit_B > 0) & (True if active_B is None else active_B)
  zeros_B = jnp.zeros((batch,), jnp.int32)
  tokens_BG, probs_BGV, active_B, count_B, nan_B = draw(
    0, first_logits_BV, tokens_BG, probs_BGV, active_B, zeros_B
  )

  def cond(loop):
    t, active_B = loop[0], loop[3]
    return (t < num_draft_tokens) & jnp.any(active_B)

  def body(loop):
    t, tokens_BG, probs_BGV, active_B, count_B, nan_B, carry = loop
    logits_BV, carry = step(t, tokens_BG[:, t - 1], carry)
    tokens_BG, probs_BGV, active_B, count_B, step_nan_B = draw(
      t, logits_BV, tokens_BG, probs_BGV, active_B, count_B
    )
    return t + 1, tokens_BG, probs_BGV, active_B, count_B, nan_B | step_nan_B, carry

  steps, tokens_BG, probs_BGV, _, count_B, nan_B, carry = jax.lax.while_loop(
    cond, body, (jnp.int32(1), tokens_BG, probs_BGV, active_B, count_B, nan_B, carry)
  )
  return tokens_BG, probs_BGV, count_B, steps, nan_B, carry


def draw_depth(
  key: jax.Array,
  tree: TreeShape,
  depth: int,
  parent_q_BnV: jax.Array,
  tokens_BN: jax.Array,
  greedy_logits_BnV: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Draws every node at ``depth`` from its parent's q (``parent_q_BnV``, one row per node).

  i.i.d. siblings: one draw for the whole depth. Distinct siblings: rank by rank, each node
  from its parent's q renormalised over the tokens its earlier siblings did not take (rank 0
  with the depth's key, so a chain draws exactly as a chain proposal does).
  Greedy proposals (``greedy_logits_BnV``, the parent's draft logits) with distinct siblings:
  the sibling of rank r is the draft's r-th most likely token, a deterministic proposal with
  one-hot q.

  Returns:
    (tokens_Bn, q_BnV): the nodes' tokens and the distributions they were drawn from (all
    zero for a node left without tokens to draw).
  """
  nodes = tree.nodes_at_depth(depth)
  depth_key = threefry.fold_in(key, depth - 1)
  if not tree.distinct_siblings:
    return sample_from(depth_key, parent_q_BnV), parent_q_BnV
  ranks = [tree.sibling_rank[j] for j in nodes]
  if greedy_logits_BnV is not None:
    _, best_Bnr = jax.lax.top_k(greedy_logits_BnV, max(ranks) + 1)
    tokens_Bn = best_Bnr[:, jnp.arange(len(nodes)), jnp.asarray(ranks)].astype(jnp.int32)
    return tokens_Bn, chosen_q(tokens_Bn, parent_q_BnV)
  tokens_Bn = jnp.zeros(parent_q_BnV.shape[:2], jnp.int32)
  q_BnV = jnp.zeros_like(parent_q_BnV)
  vocab = parent_q_BnV.shape[-1]
  for rank in range(max(ranks) + 1):
    here = [k for k, r in enumerate(ranks) if r == rank]
    taken_BnV = jnp.zeros((tokens_BN.shape[0], len(here), vocab), bool)
    for k_index, k in enumerate(here):
      siblings = tree.children(tree.parents[nodes[k]])[:rank]
      for sibling in siblings:
        local = nodes.index(sibling)
        taken_BnV = taken_BnV.at[:, k_index].set(
          taken_BnV[:, k_index] | jax.nn.one_hot(tokens_Bn[:, local], vocab, dtype=bool)
        )
    left_BnV = jnp.where(taken_BnV, 0.0, parent_q_BnV[:, here])
    mass_Bn1 = left_BnV.sum(-1, keepdims=True)
    left_BnV = jnp.where(mass_Bn1 > 0, left_BnV / jnp.where(mass_Bn1 > 0, mass_Bn1, 1.0), 0.0)
    # Ranks >= 1 draw from a stream of their own, never drawn from itself: fold_in(depth_key,
    # r) encrypts the counter that word r of depth_key's own draw does, and rank 0's second
    # stage (V > 512) used fold_in(depth_key, 1), rank 1's key (2026-11-30's review; no bias
    # measured, but one key both drew and made keys). Rank 0 keeps the depth's key, so a chain
    # still draws as a chain proposal does. No chain position reaches 2**32 - 1.
    rank_key = depth_key
    if rank > 0:
      siblings = threefry.fold_in(threefry.fold_in(key, 2**32 - 1), depth)
      rank_key = threefry.fold_in(siblings, rank)
    drawn_Bn = sample_from(rank_key, jnp.where(mass_Bn1 > 0, left_BnV, 1.0))
    tokens_Bn = tokens_Bn.at[:, here].set(drawn_Bn)
    q_BnV = q_BnV.at[:, here].set(left_BnV)
  return tokens_Bn, q_BnV


# expand(nodes, tokens_Bn, call, positions_Bn, parents_Bn) -> logits_BnV: the drafter's model
# on the nodes of one depth (their tokens drawn; parents_Bn: each row's parent of each node,
# -1 for the root), as one tree call, giving the distributions their children are drawn from.
Expand = Callable[[tuple[int, ...], jax.Array, TreeCall, jax.Array, jax.Array], jax.Array]


def grow_tree(
  key: jax.Array,
  tree: TreeShape,
  root_logits_BV: jax.Array,
  root_slot_B: jax.Array,
  limit_B: jax.Array,
  sampling: SamplingConfig,
  vocab_size: int,
  expand: Expand,
  *,
  proposal: str = "sampled",
  confidence_threshold: float = 0.0,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, int, jax.Array | None]:
  """Grows ``tree`` depth by depth from the root's draft logits (a dynamic tree:
  ``grow_dynamic``, whose per-row parents come last; None for a static tree).

  Every node of a depth is drawn from its parent's warped q (``draw_depth``); a node is
  proposed if its parent was, it had mass to draw from, and its depth is within the row's
  draft limit (and, with ``confidence_threshold``, the draft's own probability of its token
  reached it). Then ``expand`` runs the drafter on the depth's nodes, if any has children,
  as one tree call (``attention.TreeCall``): node j goes to the drafter's cache slot
  ``root_slot_B + 1 + j`` at position ``root_slot_B + depth``, and sees the slots before the
  root's, the root's, and its own ancestors'. The shape is static, so how many children a
  node gets is fixed before they are drawn.

  Returns:
    (tokens_BN, probs_BNV, drafted_BN, nan_B, expansions, None): ``expand`` was called
    ``expansions`` times, once per depth that has children.
  """
  if tree.dynamic:
    return grow_dynamic(tree, root_logits_BV, root_slot_B, limit_B, sampling, vocab_size, expand)
  batch = root_logits_BV.shape[0]
  rows_B = jnp.arange(batch)
  logits_of = {-1: root_logits_BV}  # Draft logits after each node (-1: the root).
  continues = {-1: limit_B > 0}  # Whether a node's children may be proposed.
  tokens_BN = jnp.zeros((batch, tree.num_nodes), jnp.int32)
  drafted_BN = jnp.zeros((batch, tree.num_nodes), bool)
  nan_B = model_protocol.has_nan(root_logits_BV)
  mask_NM = tree.attention_mask()[1:]
  expansions = 0
  for depth in range(1, tree.max_depth + 1):
    nodes = tree.nodes_at_depth(depth)
    parents = [tree.parents[j] for j in nodes]
    parent_logits_BnV = jnp.stack([logits_of[u] for u in parents], axis=1)
    parent_q_BnV = probabilities(parent_logits_BnV, sampling)
    chosen = sampling.greedy or proposal == "greedy"
    greedy_logits_BnV = parent_logits_BnV if chosen else None
    drawn_Bn, q_BnV = draw_depth(key, tree, depth, parent_q_BnV, tokens_BN, greedy_logits_BnV)
    has_mass_Bn = jnp.ones(drawn_Bn.shape, bool) if q_BnV is None else q_BnV.sum(-1) > 0
    tokens_BN = tokens_BN.at[:, nodes].set(drawn_Bn)
    if depth == 1:
      probs_BNV = _q_buffer(q_BnV, (batch, tree.num_nodes, vocab_size))
    probs_BNV = _put(probs_BNV, nodes, q_BnV)
    for k, (j, u) in enumerate(zip(nodes, parents)):
      proposed_B = continues[u] & has_mass_Bn[:, k] & (depth <= limit_B)
      drafted_BN = drafted_BN.at[:, j].set(proposed_B)
      if confidence_threshold > 0:  # The draft's own (unwarped) probability.
        own_B = jax.nn.softmax(parent_logits_BnV[:, k], axis=-1)[rows_B, drawn_Bn[:, k]]
        proposed_B = proposed_B & (own_B >= confidence_threshold)
      continues[j] = proposed_B
    if not any(tree.children(j) for j in nodes):
      continue
    offsets_n = jnp.asarray([1 + j for j in nodes], jnp.int32)
    call = TreeCall(root_slot_B, offsets_n, jnp.asarray(mask_NM[list(nodes)]))
    positions_Bn = jnp.broadcast_to((root_slot_B + depth)[:, None], drawn_Bn.shape)
    parents_Bn = jnp.broadcast_to(jnp.asarray(parents, jnp.int32), drawn_Bn.shape)
    logits_BnV = expand(nodes, drawn_Bn, call, positions_Bn, parents_Bn)
    expansions += 1
    nan_B = nan_B | model_protocol.has_nan(logits_BnV)
    for k, j in enumerate(nodes):
      logits_of[j] = logits_BnV[:, k]
  return tokens_BN, probs_BNV, drafted_BN, nan_B, expansions, None


def extend_ancestors(
  ancestors_BSS: jax.Array, parent_Bn: jax.Array, slot_n: jax.Array
) -> tuple[jax.Array, jax.Array]:
  """Fills rows ``slot_n`` of a tree's [B, S, S] ancestor mask (row r: the tree slots slot r
  sees; 0 is the root, 1 + j node j) for new nodes under ``parent_Bn`` (-1: the root): each
  sees its parent's row and itself. Returns the mask and the new rows [B, n, S]."""
  seen_BnS = jnp.take_along_axis(ancestors_BSS, (parent_Bn + 1)[:, :, None], axis=1)
  seen_BnS = seen_BnS | jax.nn.one_hot(slot_n, ancestors_BSS.shape[-1], dtype=bool)[None]
  return ancestors_BSS.at[:, slot_n].set(seen_BnS), seen_BnS


def rank_confidence(
  logits_BfV: jax.Array, q_BfV: jax.Array, sampling: SamplingConfig, rank_temperature: float
) -> jax.Array:
  """log c^(1/tau) renormalised: how a dynamic tree scores a child. c is the draft's softmax
  at temperature 0 (where the warped q is one-hot) and its warped q otherwise (0 outside the
  warped support: -inf, never kept); tau = ``rank_temperature`` sharpens it (tau < 1), the
  temperature scaling that calibrates an over-spread draft (``calibration``)."""
  log_c_BfV = jax.nn.log_softmax(logits_BfV, axis=-1) if sampling.greedy else jnp.log(q_BfV)
  if rank_temperature == 1.0:
    return log_c_BfV
  return jax.nn.log_softmax(log_c_BfV / rank_temperature, axis=-1)


def grow_dynamic(
  tree: TreeShape,
  root_logits_BV: jax.Array,
  root_slot_B: jax.Array,
  limit_B: jax.Array,
  sampling: SamplingConfig,
  vocab_size: int,
  expand: Expand,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, int, jax.Array]:
  """Grows a dynamic tree (module docstring; EAGLE-2's expansion, its node budget static).

  Depth d (w_d slots): each node kept at depth d-1 (the root at depth 1) offers its w_d most
  likely children under the draft's warped q (its softmax at temperature 0, where the warped
  q is one-hot); the w_d of highest joint probability, the product of q along the path (each
  factor sharpened to the tree's rank temperature, ``rank_confidence``), fill the depth's
  slots, best first. A slot is proposed if its joint probability is positive, its
  parent was proposed and its depth is within the row's draft limit. ``expand`` then runs the
  drafter on them as one tree call whose mask is each row's own (``TreeCall``, [B, n, N+1]):
  node j sees the slots before the root's, the root's and its own ancestors' of that row.

  Returns:
    (tokens_BN, probs_BNV, drafted_BN, nan_B, expansions, parents_BN): probs is None, the
    point mass at each chosen token (``chosen_q``); parents_BN[b, j] is row b's parent of
    node j (-1: the root).
  """
  batch = root_logits_BV.shape[0]
  num_nodes = tree.num_nodes
  slots = num_nodes + 1  # The root's slot, then the nodes'.

  tokens_BN = jnp.zeros((batch, num_nodes), jnp.int32)
  parents_BN = jnp.full((batch, num_nodes), -1, jnp.int32)
  drafted_BN = jnp.zeros((batch, num_nodes), bool)
  # Row r of ancestors_BSS: the tree slots (0: the root, 1 + j: node j) slot r sees.
  ancestors_BSS = jnp.zeros((batch, slots, slots), bool).at[:, 0, 0].set(True)
  frontier = (-1,)  # The previous depth's nodes (-1: the root).
  frontier_logits_BfV = root_logits_BV[:, None]
  frontier_score_Bf = jnp.where(limit_B > 0, 0.0, -jnp.inf)[:, None]  # log joint probability
  nan_B = model_protocol.has_nan(root_logits_BV)
  expansions = 0
  for depth in range(1, tree.max_depth + 1):
    nodes = tree.nodes_at_depth(depth)
    width = len(nodes)
    q_BfV = probabilities(frontier_logits_BfV, sampling)
    confidence_BfV = rank_confidence(frontier_logits_BfV, q_BfV, sampling, tree.rank_temperature)
    score_BfV = frontier_score_Bf[:, :, None] + confidence_BfV
    best_Bfw, token_Bfw = jax.lax.top_k(score_BfV, min(width, vocab_size))
    score_Bn, flat_Bn = jax.lax.top_k(best_Bfw.reshape(batch, -1), width)
    local_Bn = flat_Bn // best_Bfw.shape[-1]  # Which frontier node each kept child hangs under.
    drawn_Bn = jnp.take_along_axis(token_Bfw.reshape(batch, -1), flat_Bn, axis=1).astype(jnp.int32)
    parent_Bn = jnp.asarray(frontier, jnp.int32)[local_Bn]
    proposed_Bn = (score_Bn > -jnp.inf) & (depth <= limit_B)[:, None]
    score_Bn = jnp.where(proposed_Bn, score_Bn, -jnp.inf)  # A child of an unproposed node.
    parent_q_BnV = jnp.take_along_axis(q_BfV, local_Bn[:, :, None], axis=1)
    q_BnV = chosen_q(drawn_Bn, parent_q_BnV)
    if depth == 1:
      probs_BNV = _q_buffer(q_BnV, (batch, num_nodes, vocab_size))
    probs_BNV = _put(probs_BNV, nodes, q_BnV)
    tokens_BN = tokens_BN.at[:, nodes].set(drawn_Bn)
    parents_BN = parents_BN.at[:, nodes].set(parent_Bn)
    drafted_BN = drafted_BN.at[:, nodes].set(proposed_Bn)
    slot_n = jnp.asarray([1 + j for j in nodes], jnp.int32)
    ancestors_BSS, seen_BnS = extend_ancestors(ancestors_BSS, parent_Bn, slot_n)
    if depth == tree.max_depth:
      break
    call = TreeCall(root_slot_B, slot_n, seen_BnS)
    positions_Bn = jnp.broadcast_to((root_slot_B + depth)[:, None], drawn_Bn.shape)
    frontier_logits_BfV = expand(nodes, drawn_Bn, call, positions_Bn, parent_Bn)
    expansions += 1
    nan_B = nan_B | model_protocol.has_nan(frontier_logits_BfV)
    frontier, frontier_score_Bf = nodes, score_Bn
  return tokens_BN, probs_BNV, drafted_BN, nan_B, expansions, parents_BN
