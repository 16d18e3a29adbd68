r"""Verification of a draft TREE (multi-draft / token-tree speculative sampling).

Notation (``tree.py``): N draft nodes hang under the root, breadth first; node i holds x~_i,
drawn from q_i, the distribution it was ACTUALLY drawn from (the draft's q at its parent for
i.i.d. siblings; that q renormalised over the tokens earlier siblings did not take, for
siblings without replacement). p_root is the target at the root and p_i the target after
node i (for its children, or the bonus token). Arrays: ``q_BNV[:, i]`` = q_i,
``p_BN1V[:, 0]`` = p_root, ``p_BN1V[:, i+1]`` = p_i. A node not proposed is absent (so are
its descendants). Verifiers only ever use a node's own q_i: siblings need not share q.

Recursive rejection sampling (SpecInfer, Miao et al. 2023, arXiv 2305.09781, multi-step
speculative sampling; siblings without replacement as in Jeon et al. 2024, arXiv
2402.14160), with nodes that share the accepted prefix merged:
  u = root;  r = p_root;  alive = {root}
  for d = 1..D:
    for each proposed node j at depth d with parent(j) in alive, in index order:
      if eta_j < min(1, r(x~_j) / q_j(x~_j)): u = j; stop trying at depth d   (strict)
      else: r = norm(max(0, r - q_j))                                (r if no mass)
    if none accepted: emit y ~ r; done
    alive = {proposed j at depth d : parent(j) in alive, x~_j = x~_u}  (same context)
    r = p_u
  emit y ~ r                                               (all D depths accepted: bonus)
Merged duplicates (i.i.d. siblings that drew the same token) have children that are fresh
draws from q at the same context, so they all stay candidates at the next depth.

Traversal verification (Weng et al. 2025, arXiv 2505.12398; the paper's p_alpha is w, its
M_b(. | X) is R_X and M_s the q of the sibling being verified) accepts whole root paths, leaves
first. On a chain it is Sun et al.'s block verification (``verification.block_verify``):
  w_root = 1;  R_root = p_root
  visit(v):
    for each proposed child c of v, in order:
      w_c = min(1, w_v R_v(x~_c) / q_c(x~_c));  R_c = p_c
      visit(c)                                # returns only if c's subtree and c were rejected
      m = sum_x max(0, w_v R_v(x) - q_c(x))
      R_v = norm(max(0, w_v R_v - q_c))                                (R_v if m = 0)
      w_v = m / (m + 1 - w_v)                       (0 if m = 0; the root keeps w = 1)
    if eta_v < w_v (always at the root): accept the root path of v, emit y ~ R_v, stop
  visit(root)
The nodes are thus tested in post-order (children in index order, then the parent), one coin
each. Why it is exact: by induction on the subtree, visit(v) with (w_v, R_v) outputs the
continuation s with probability w_v R_v(s_1) P_target(s_2.. | s_1) and rejects with
probability 1 - w_v. Child c then outputs min(q_c, w_v R_v)(x) P(.. | x) over its draws x; it is
rejected with probability 1 - w_v + m, leaving target mass max(0, w_v R_v - q_c) = m R_v', which
the remaining children and v's own coin hand out with weight m / (m + 1 - w_v). The update never
depends on the rejected token, so later siblings may be drawn from any q given earlier ones.
(Weng et al. write the sibling update as M_s renormalised without the rejected token, which
is q of the next sibling when siblings are drawn without replacement.)

Dynamic trees (EAGLE-2, ``tree.dynamic``): every row has its own parents, a node at depth d
under one of depth d-1's nodes (``parents_BN``). The token verifier runs as above with parent(j)
read per row; nothing in its proof uses the shape beyond each node's own q and that the shape
is settled before the target's coins. A dynamic tree's shape and tokens are a deterministic
function of the draft's outputs on the accepted past, so its q is one-hot (``proposals.py``).

Greedy (temperature 0): at each depth accept the first alive proposed child with
x~_j = argmax p_u, merging duplicates as above; emit argmax p_u at the last accepted u.

Random draws: node j's coin is ``draws.bernoulli_from_words(words[:, :, j], .)`` with
``words = draws.random_words(coin_key, (B, N))`` and ``coin_key, emit_key = split(key)``;
the emitted token is ``draws.categorical(emit_key, .)``. On ``tree.chain(K)`` these are the
bits ``verification.token_verify`` and ``block_verify`` use, and the probabilities are formed
by the same expressions (the bonus distribution included), so the verdicts are bit-identical
to theirs (tested on CPU; a compiler that fuses the two programs differently could round a
probability differently, which changes a verdict with probability ~1e-7).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specsamp.sampling import draws, threefry, verification
from specsamp.sampling.tree import TreeShape
from specsamp.sampling.verification import _clipped_ratio

Coin = Callable[[int, jax.Array], jax.Array]
"""(node j, probability [B]) -> [B] bool: the coin ``eta_j < probability`` for node j."""


@struct.dataclass
class TreeVerdict:
  """The outcome of verifying one draft tree per row.

  Attributes:
    num_accepted: [B] int32, n in 0..D: the depth of the accepted path (draft tokens accepted).
    path: [B, D] int32, the node accepted at depth 1..D (0 past depth n).
    next_token: [B] int32, the token emitted after the accepted path.
  """

  num_accepted: jax.Array
  path: jax.Array
  next_token: jax.Array


@struct.dataclass
class _Trace:
  """A verifier run for given coins: the verdict less the emitted token, the distribution it is
  drawn from, and each node's coin probability and whether its coin was used ([B, N])."""

  num_accepted: jax.Array
  path: jax.Array
  emit_probs: jax.Array
  coin_probs: jax.Array
  tested: jax.Array

  def verdict(self, emit_key: jax.Array) -> TreeVerdict:
    return TreeVerdict(
      num_accepted=self.num_accepted,
      path=self.path,
      next_token=verification.sample_from(emit_key, self.emit_probs),
    )


def _take(x_BV: jax.Array, index_B: jax.Array) -> jax.Array:
  return jnp.take_along_axis(x_BV, index_B[:, None].astype(jnp.int32), axis=1)[:, 0]


def _row(p_BN1V: jax.Array, row_B: jax.Array) -> jax.Array:
  return jnp.take_along_axis(p_BN1V, row_B[:, None, None].astype(jnp.int32), axis=1)[:, 0]


def _node_q(q_BNV: jax.Array | None, j: int) -> jax.Array | None:
  """Node j's q, [B, V]; None (the point mass at its token) for chosen tokens."""
  return None if q_BNV is None else q_BNV[:, j]


def _word_coins(key: jax.Array, shape: tuple[int, int]) -> Coin:
  """Node j's coin from element [:, j] of one [B, N] block of 64-bit words."""
  words = draws.random_words(key, shape)
  return lambda j, probability_B: draws.bernoulli_from_words(words[:, :, j], probability_B)


def _stack(columns: list[jax.Array]) -> jax.Array:
  return jnp.stack(columns, axis=1)


def _parent_alive(tree: TreeShape, parents_BN, alive: dict, j: int) -> jax.Array:
  """[B]: whether node j's parent is alive; its parent per row when ``parents_BN`` is given
  (a dynamic tree: a node at depth d hangs under one of depth d-1's nodes, or the root)."""
  if parents_BN is None:
    return alive[tree.parents[j]]
  depth = tree.depths[j]
  if depth == 1:
    return alive[-1]
  previous = tree.nodes_at_depth(depth - 1)
  alive_Bn = jnp.stack([alive[u] for u in previous], axis=1)
  return _take(alive_Bn, parents_BN[:, j] - previous[0])


def _token_trace(
  tree: TreeShape,
  tokens_BN,
  q_BNV,
  p_BN1V,
  drafted_BN,
  coin: Coin,
  greedy: bool = False,
  parents_BN=None,
) -> _Trace:
  """Recursive rejection sampling with merged prefixes (module docstring); ``greedy``: accept
  the first alive child equal to argmax p_u instead (no coins, no residuals). ``parents_BN``:
  each row's own parents (a dynamic tree); else the tree's static ones."""
  batch, num_nodes = tokens_BN.shape
  ones_B = jnp.ones((batch,), bool)
  alive = {-1: ones_B}
  r_BV = p_BN1V[:, 0]
  fresh_B = ones_B  # r is still p_u (no sibling rejected at this depth).
  stopped_B = ~ones_B
  row_B = jnp.zeros((batch,), jnp.int32)  # p row of the last accepted node (0: the root).
  num_accepted_B = jnp.zeros((batch,), jnp.int32)
  path, coin_probs, tested = [], [None] * num_nodes, [None] * num_nodes
  best_BN1 = jnp.argmax(p_BN1V, axis=-1).astype(jnp.int32)
  for depth in range(1, tree.max_depth + 1):
    accepted_B, node_B = ~ones_B, jnp.zeros((batch,), jnp.int32)
    best_B = _take(best_BN1, row_B)
    for j in tree.nodes_at_depth(depth):
      x_B, q_BV = tokens_BN[:, j], _node_q(q_BNV, j)
      tried_B = _parent_alive(tree, parents_BN, alive, j) & drafted_BN[:, j]
      tried_B &= ~accepted_B & ~stopped_B
      if greedy:
        probability_B = (x_B == best_B).astype(jnp.float32)
        accept_B = tried_B & (x_B == best_B)
      else:
        probability_B = _clipped_ratio(_take(r_BV, x_B), verification.q_at(q_BV, x_B))
        accept_B = tried_B & coin(j, probability_B)
        reject_B = tried_B & ~accept_B
        r_BV = jnp.where(reject_B[:, None], verification.residual(r_BV, q_BV, token_B=x_B), r_BV)
        fresh_B &= ~reject_B
      coin_probs[j], tested[j] = probability_B, tried_B
      accepted_B |= accept_B
      node_B = jnp.where(accept_B, j, node_B)
    stopped_B |= ~accepted_B
    token_B = _take(tokens_BN, node_B)
    for j in tree.nodes_at_depth(depth):
      parent_alive_B = _parent_alive(tree, parents_BN, alive, j)
      alive[j] = accepted_B & parent_alive_B & drafted_BN[:, j] & (tokens_BN[:, j] == token_B)
    row_B = jnp.where(accepted_B, node_B + 1, row_B)
    r_BV = jnp.where(accepted_B[:, None], _row(p_BN1V, row_B), r_BV)
    fresh_B |= accepted_B
    num_accepted_B += accepted_B.astype(jnp.int32)
    path.append(jnp.where(accepted_B, node_B, 0))
  if greedy:
    emit_BV = jax.nn.one_hot(_take(best_BN1, row_B), p_BN1V.shape[-1], dtype=p_BN1V.dtype)
  else:
    # norm(p_u), formed as token_verify forms its bonus distribution (same bits on a chain).
    emit_BV = jnp.where(fresh_B[:, None], verification.residual(r_BV, jnp.zeros_like(r_BV)), r_BV)
  return _Trace(num_accepted_B, _stack(path), emit_BV, _stack(coin_probs), _stack(tested))


def _stop_probability(mass_B: jax.Array, weight_B: jax.Array) -> jax.Array:
  """m / (m + 1 - w), 0 where m = 0 (as ``verification.block_stop_probabilities``)."""
  denominator_B = mass_B + 1.0 - weight_B
  return jnp.where(mass_B > 0, mass_B / jnp.where(denominator_B > 0, denominator_B, 1.0), 0.0)


def _path_table(tree: TreeShape) -> tuple[np.ndarray, np.ndarray]:
  """([N+1, D] the root path of each row's node by depth, [N+1] its depth); row 0: the root."""
  paths = np.zeros((tree.num_nodes + 1, tree.max_depth), np.int32)
  for i, parent in enumerate(tree.parents):
    paths[i + 1] = paths[parent + 1]
    paths[i + 1, tree.depths[i] - 1] = i
  return paths, np.asarray((0, *tree.depths), np.int32)


def _traversal_trace(tree: TreeShape, tokens_BN, q_BNV, p_BN1V, drafted_BN, coin: Coin) -> _Trace:
  """Traversal verification (module docstring), one coin per node in post-order."""
  batch, num_nodes = tokens_BN.shape
  weight = {-1: jnp.ones((batch,), p_BN1V.dtype)}  # w_v
  target = {-1: p_BN1V[:, 0]}  # R_v
  fresh = {-1: jnp.ones((batch,), bool)}  # No child of v rejected yet: R_v = p_v.
  coin_probs, tested = [None] * num_nodes, [None] * num_nodes
  done_B = jnp.zeros((batch,), bool)
  node_B = jnp.full((batch,), -1, jnp.int32)
  emit_BV = jnp.zeros_like(p_BN1V[:, 0])

  def emit_distribution(v):
    # norm(w_v p_v) = p_v where fresh, formed as block_verify forms its bonus distribution.
    bonus_BV = verification.residual(target[v], jnp.zeros_like(target[v]), weight[v])
    return jnp.where(fresh[v][:, None], bonus_BV, target[v])

  def visit(v):
    nonlocal done_B, node_B, emit_BV
    for c in tree.children(v):
      x_B, q_BV = tokens_BN[:, c], _node_q(q_BNV, c)
      weight[c] = _clipped_ratio(weight[v] * _take(target[v], x_B), verification.q_at(q_BV, x_B))
      target[c], fresh[c] = p_BN1V[:, c + 1], jnp.ones((batch,), bool)
      visit(c)
      rejected_B = drafted_BN[:, c] & ~done_B  # c's subtree and c itself
      mass_B = jnp.sum(verification.excess(weight[v][:, None] * target[v], q_BV, x_B), axis=-1)
      residual_BV = verification.residual(target[v], q_BV, weight[v], x_B)
      target[v] = jnp.where(rejected_B[:, None], residual_BV, target[v])
      if v >= 0:  # the root keeps w = 1
        weight[v] = jnp.where(rejected_B, _stop_probability(mass_B, weight[v]), weight[v])
      fresh[v] &= ~rejected_B
    if v >= 0:
      tested[v], coin_probs[v] = drafted_BN[:, v] & ~done_B, weight[v]
      accept_B = tested[v] & coin(v, weight[v])
      emit_BV = jnp.where(accept_B[:, None], emit_distribution(v), emit_BV)
      node_B = jnp.where(accept_B, v, node_B)
      done_B |= accept_B

  visit(-1)
  emit_BV = jnp.where(done_B[:, None], emit_BV, emit_distribution(-1))
  paths, depths = _path_table(tree)
  num_accepted_B, path_BD = jnp.asarray(depths)[node_B + 1], jnp.asarray(paths)[node_B + 1]
  return _Trace(num_accepted_B, path_BD, emit_BV, _stack(coin_probs), _stack(tested))


def tree_token_verify(
  key: jax.Array,
  tree: TreeShape,
  tokens_BN: jax.Array,
  q_BNV: jax.Array | None,
  p_BN1V: jax.Array,
  drafted_BN: jax.Array,
  parents_BN: jax.Array | None = None,
) -> TreeVerdict:
  """Recursive rejection sampling over the tree, merging equal prefixes (module docstring).

  Args:
    key: PRNG key; split into the coins' key and the emitted token's key.
    tree: the static tree shape.
    tokens_BN: [B, N] int32, node i's draft token.
    q_BNV: [B, N, V] float32, the distribution node i's token was drawn from; None for chosen
      tokens (the point mass at each: ``verification`` reads it without a one-hot array).
    p_BN1V: [B, N+1, V] float32, the target at the root (0) and after node i (i+1).
    drafted_BN: [B, N] bool, nodes proposed (closed under ancestors).
    parents_BN: [B, N] int32, each row's parent of node i (-1: the root), for a dynamic tree
      (``tree.dynamic``); None: the tree's static parents.

  Returns:
    The accepted depth, path and next token per row. On ``tree.chain(K)`` with every node
    proposed, bit-identical to ``verification.token_verify(key, tokens, q, p)``.
  """
  coin_key, emit_key = threefry.split(key)
  coin = _word_coins(coin_key, tokens_BN.shape)
  trace = _token_trace(tree, tokens_BN, q_BNV, p_BN1V, drafted_BN, coin, parents_BN=parents_BN)
  return trace.verdict(emit_key)


def traversal_verify(
  key: jax.Array,
  tree: TreeShape,
  tokens_BN: jax.Array,
  q_BNV: jax.Array | None,
  p_BN1V: jax.Array,
  drafted_BN: jax.Array,
  parents_BN: jax.Array | None = None,
) -> TreeVerdict:
  """Traversal verification, Weng et al. 2025 (module docstring); arguments as
  ``tree_token_verify``. On ``tree.chain(K)``, bit-identical to ``verification.block_verify``.
  Its post-order walk follows the static tree: a dynamic tree is refused."""
  if parents_BN is not None or tree.dynamic:
    raise ValueError(
      "Traversal verification walks a static tree; a dynamic tree (per-row parents) is "
      "verified by verifier='token'."
    )
  coin_key, emit_key = threefry.split(key)
  coin = _word_coins(coin_key, tokens_BN.shape)
  return _traversal_trace(tree, tokens_BN, q_BNV, p_BN1V, drafted_BN, coin).verdict(emit_key)


def tree_greedy_verify(
  key: jax.Array,
  tree: TreeShape,
  tokens_BN: jax.Array,
  q_BNV: jax.Array | None,
  p_BN1V: jax.Array,
  drafted_BN: jax.Array,
  parents_BN: jax.Array | None = None,
) -> TreeVerdict:
  """Temperature 0: follow the target's argmax down the tree (merging equal prefixes) and emit
  the argmax after the last accepted node; key and q are not needed. On a chain, equal to
  ``verification.greedy_verify``."""
  del key
  trace = _token_trace(
    tree, tokens_BN, q_BNV, p_BN1V, drafted_BN, coin=None, greedy=True, parents_BN=parents_BN
  )
  return TreeVerdict(
    num_accepted=trace.num_accepted,
    path=trace.path,
    next_token=jnp.argmax(trace.emit_probs, axis=-1).astype(jnp.int32),
  )


TreeVerifier = Callable[..., TreeVerdict]
"""(key, tree, tokens_BN, q_BNV, p_BN1V, drafted_BN, parents_BN=None) -> TreeVerdict."""

TREE_VERIFIERS: dict[str, TreeVerifier] = {
  "token": tree_token_verify,
  "traversal": traversal_verify,
  "argmax": tree_greedy_verify,
}
"""The exact tree verifiers by name; 'greedy' is what they amount to at temperature 0."""
