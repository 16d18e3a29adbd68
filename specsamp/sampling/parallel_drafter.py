r"""Parallel drafting (PARD style): K draft distributions from ONE draft model call.

A parallel draft model is an ordinary causal Transformer (any decode-protocol model) trained
so that placeholder tokens after the committed ones predict tokens further ahead
(``training/parallel.py``): after the row's last committed token at position n - 1, the
placeholder (``mask_token_id``) at position n + k - 2 predicts the token at n + k - 1.

Each iteration makes one call of width 2K on a row of n committed tokens:

  positions  n-K-1 ... n-2  n-1 | n     n+1   ...  n+K-2
  tokens     x     ...  x   x   | MASK  MASK  ...  MASK
  logits                    q_1 | q_2   q_3   ...  q_K

The K + 1 committed tokens before n re-feed what the last iteration accepted (at most K
drafts and the bonus token, which the draft cache holds only as placeholders or not at all);
re-feeding a position the cache already holds rewrites the same entry. Positions are clamped
at 0 for short rows (a repeated position 0 writes the same entry). The placeholders' cache
entries are stale after the call and are never read: the next call re-feeds every position
from n onwards before its queries attend to them.

Exactness with real q. Every q_k comes out of that one call, computed from the committed
tokens and the placeholders only, before any draft token is drawn; then x~_k ~ q_k is drawn
for each k independently (``proposals.grow_chain``, key fold_in(key, k - 1)). The proposal's
joint law is prod_k q_k(x~_k), so the law of x~_k given x~_1..x~_{k-1} is q_k itself: that is
what token-wise, block and tree verification need reported, and they get it. Had q_k been
computed from the drafts (feeding x~_<k back in, as a sequential drafter does), the same
tokens would have to be reported with q_k(. | x~_<k); reporting the placeholder q_k for them
would be the planted bug ``parallel_wrong_q`` (each token verified with another position's q).

Trees: a node at depth d has its children drawn from q_{d+1}, whatever its own token (no
model call per depth: ``expand`` hands back the precomputed q). With the sequential head, a
node's children are drawn from q_{d+1} corrected by the head's recurrence along the path to
that node (each node's carry is its parent's stepped on its token), so siblings' subtrees see
different q, as a draft model's would; each q is computed before the children are drawn from
it, and it is the q the tree reports. Greedy proposals (the most
likely token of each q_k, one-hot q) and dynamic trees work as for any model drafter.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import jax
import jax.numpy as jnp

from specsamp.config_fields import is_int
from specsamp.sampling import proposals
from specsamp.sampling.drafters import ModelDrafter, Proposal, TreeProposal
from specsamp.sampling.model_protocol import PaddedVocabulary
from specsamp.sampling.tree import TreeShape
from specsamp.sampling.warping import SamplingConfig


def window(
  tokens_BW: jax.Array, lengths_B: jax.Array, num_draft_tokens: int, mask_token_id: int
) -> tuple[jax.Array, jax.Array]:
  """(tokens_B2K, positions_B2K): the K + 1 committed tokens before each row's length and
  K - 1 placeholders after it (module docstring)."""
  rows_B = jnp.arange(tokens_BW.shape[0])
  back_R = jnp.arange(-num_draft_tokens - 1, 0)
  real_BR = jnp.maximum(lengths_B[:, None] + back_R[None, :], 0)
  masks_BM = lengths_B[:, None] + jnp.arange(num_draft_tokens - 1)[None, :]
  tokens_BR = tokens_BW[rows_B[:, None], real_BR]
  placeholders_BM = jnp.full(masks_BM.shape, mask_token_id, tokens_BW.dtype)
  tokens = jnp.concatenate([tokens_BR, placeholders_BM], axis=1)
  positions = jnp.concatenate([real_BR, masks_BM], axis=1).astype(jnp.int32)
  return tokens, positions


def chain_from(
  key,
  logits_BKV,
  limit_B,
  sampling: SamplingConfig,
  vocab_size: int,
  proposal: str,
  active_B=None,
  confidence_threshold: float = 0.0,
  step=None,
  carry=None,
) -> Proposal:
  """A chain drawn from q_1..q_K computed in one call (``proposals.grow_chain`` with no model
  step: token k is drawn from q_k whatever came before it); one draft call. ``step`` (with
  its first ``carry``) replaces that: ``step(t, x~_t, carry) -> (logits of q_{t+1}, carry)``,
  as the sequential head corrects q_{t+1} with the token drawn before it."""
  if step is None:
    step = lambda t, token_B, carry: (logits_BKV[:, t], carry)  # noqa: E731
  tokens_BG, probs_BGV, count_B, _, nan_B, _ = proposals.grow_chain(
    key,
    logits_BKV[:, 0],
    step,
    carry,
    logits_BKV.shape[1],
    limit_B,
    sampling,
    vocab_size,
    proposal,
    active_B=active_B,
    confidence_threshold=confidence_threshold,
  )
  return Proposal(
    tokens=tokens_BG, probs=probs_BGV, num_proposed=count_B, model_calls=jnp.int32(1), nan=nan_B
  )


def tree_from(
  key,
  tree: TreeShape,
  logits_BKV,
  root_slot_B,
  limit_B,
  sampling: SamplingConfig,
  vocab_size: int,
  proposal: str,
  confidence_threshold: float = 0.0,
  step=None,
  carry=None,
) -> TreeProposal:
  """A tree drawn from q_1..q_D computed in one call: every node at depth d draws its children
  from q_{d+1} (``proposals.grow_tree`` with an ``expand`` that calls no model). ``step``
  (``chain_from``'s, on [B * n] rows) makes q_{d+1} a node's own: each node's carry is its
  parent's stepped on the node's token, so its children's q sees the path to it."""
  batch, vocab = logits_BKV.shape[0], logits_BKV.shape[-1]
  # Each tree slot's carry (0: the root, 1 + j: node j), filled depth by depth.
  carries = {"BSD": None if carry is None else jnp.repeat(carry[:, None], tree.num_nodes + 1, 1)}

  def expand(nodes, drawn_Bn, call, positions_Bn, parents_Bn):
    depth = tree.depths[nodes[0]]
    width = len(nodes)
    if step is None:
      return jnp.broadcast_to(logits_BKV[:, depth][:, None], (batch, width, vocab))
    # Row b's parent of each node (per row in a dynamic tree), its carry, one step on the node.
    parent_BnD = jnp.take_along_axis(carries["BSD"], (parents_Bn + 1)[:, :, None], axis=1)
    logits, carry_BnD = step(
      depth, drawn_Bn.reshape(-1), parent_BnD.reshape(batch * width, -1), width
    )
    slots = jnp.asarray([1 + j for j in nodes], jnp.int32)
    carries["BSD"] = carries["BSD"].at[:, slots].set(carry_BnD.reshape(batch, width, -1))
    return logits.reshape(batch, width, -1)

  tokens_BN, probs_BNV, drafted_BN, nan_B, _, parents_BN = proposals.grow_tree(
    key,
    tree,
    logits_BKV[:, 0],
    root_slot_B,
    limit_B,
    sampling,
    vocab_size,
    expand,
    proposal=proposal,
    confidence_threshold=confidence_threshold,
  )
  return TreeProposal(
    tokens=tokens_BN,
    probs=probs_BNV,
    drafted=drafted_BN,
    model_calls=jnp.int32(1),
    nan=nan_B,
    parents=parents_BN,
  )


@dataclasses.dataclass(frozen=True)
class ParallelDrafter(ModelDrafter):
  """Drafts K tokens from one call of a parallel draft model (module docstring).

  Attributes:
    model: the parallel draft model (a decode-protocol model trained with placeholders).
    mask_token_id: the placeholder's token id, a vocabulary row the tokenizer never emits.
    confidence_threshold, proposal: as ``ModelDrafter``.
  """

  mask_token_id: int = -1  # None by default: token 0 is a real token of most vocabularies.
  # A sequential head (``models/sequential_head.py``): q_k for k >= 2 also sees the drafts
  # x~_1..x~_{k-1} through a small recurrence run after the pass (one head step per draft
  # token, no model call). None: the K draws are independent.
  head: Any = None

  def check(self, target: Any) -> None:
    super().check(target)
    if self.mask_token_id == -1:
      raise ValueError(
        "A ParallelDrafter needs mask_token_id: the placeholder token its draft was trained "
        "with (distill.mask_token)."
      )
    padded = isinstance(self.model, PaddedVocabulary)
    # The draft's own embedding rows: a padded draft clamps ids past them to its last real row,
    # so a placeholder there read a real token instead of the one it was trained with.
    rows = self.model.model.vocab_size if padded else self.model.vocab_size
    if not is_int(self.mask_token_id) or not 0 <= self.mask_token_id < rows:
      raise ValueError(
        f"mask_token_id {self.mask_token_id} is not a row of the parallel draft's "
        f"{rows}-token vocabulary."
      )
    if self.head is not None:
      self._check_head(padded)

  def _check_head(self, padded: bool) -> None:
    """A sequential head is a ``SequentialHead`` over a specsamp Transformer draft of its
    width, unpadded: it reads the draft's embedder, hidden states and output head (these
    failed with AttributeErrors while tracing before 2026-11-30)."""
    from specsamp.models.sequential_head import SequentialHead

    if not isinstance(self.head, SequentialHead):
      raise ValueError(
        f"head must be a SequentialHead (specsamp/models/sequential_head.py), got "
        f"{type(self.head).__name__}."
      )
    if padded:
      raise ValueError(
        "A sequential head reads the parallel draft's own output head, which a draft padded "
        "to the target's vocabulary (PaddedVocabulary) does not cover: train the draft with "
        "the target's vocabulary size to use a head."
      )
    config = getattr(self.model, "config", None)
    if getattr(config, "num_layers", None) is None or not all(
      hasattr(self.model, name) for name in ("embedder", "output")
    ):
      raise ValueError(
        "A sequential head needs a specsamp Transformer as the parallel draft (its embedder, "
        f"hidden states and output head), got {type(self.model).__name__}."
      )
    if self.head.d_model != config.d_model:
      raise ValueError(
        f"The sequential head reads {self.head.d_model}-wide hidden states, but the parallel "
        f"draft's are {config.d_model} wide: it was trained over another draft."
      )

  def call_tokens(self, num_draft_tokens: int) -> int:
    return 2 * num_draft_tokens  # ``window``: K + 1 committed tokens and K - 1 placeholders.

  def distributions(self, cache, tokens_BW, lengths_B, num_draft_tokens: int):
    """(logits_BKV, cache): q_1..q_K's logits from one call (only the last K positions through
    the head when the model can: ``Transformer(logits_from=)``, 15% of the call on this CPU)."""
    tokens_B2K, positions_B2K = window(tokens_BW, lengths_B, num_draft_tokens, self.mask_token_id)
    if "logits_from" in inspect.signature(self.model).parameters:
      return self.model(tokens_B2K, positions_B2K, cache, logits_from=num_draft_tokens)[:2]
    logits_B2KV, cache = self.model(tokens_B2K, positions_B2K, cache)
    return logits_B2KV[:, num_draft_tokens:], cache

  def hidden_states(self, cache, tokens_BW, lengths_B, num_draft_tokens: int):
    """(logits_BKV, cache, h_BKD): ``distributions`` and the last layer's hidden states at
    the K draft positions (before the final norm), which the sequential head reads."""
    tokens_B2K, positions_B2K = window(tokens_BW, lengths_B, num_draft_tokens, self.mask_token_id)
    out = self.model(
      tokens_B2K,
      positions_B2K,
      cache,
      capture_layers=(self.model.config.num_layers,),
      logits_from=num_draft_tokens,
    )
    return out.logits, out.cache, out.features[:, num_draft_tokens:]

  def propose(
    self,
    cache,
    tokens_BW,
    lengths_B,
    key,
    num_draft_tokens: int,
    limit_B,
    sampling: SamplingConfig,
    vocab_size: int,
  ):
    if self.head is None:
      logits_BKV, cache = self.distributions(cache, tokens_BW, lengths_B, num_draft_tokens)
      step = carry = None
    else:
      logits_BKV, cache, step, carry = self._sequential(
        cache, tokens_BW, lengths_B, num_draft_tokens
      )
    proposal = chain_from(
      key,
      logits_BKV,
      limit_B,
      sampling,
      vocab_size,
      self.proposal,
      confidence_threshold=self.confidence_threshold,
      step=step,
      carry=carry,
    )
    return proposal, cache

  def _sequential(self, cache, tokens_BW, lengths_B, num_draft_tokens: int):
    """(logits_BKV, cache, step, carry) for a chain with the sequential head: x~_1 ~ q_1 from
    the pass; then for k >= 2 ``step`` runs the head's recurrence on x~_{k-1} (drawn) and reads
    q_k from h_k and r_{k-1} (``models/sequential_head.py``). Every q_k is computed before
    x~_k is drawn and is the one reported."""
    from specsamp.models.sequential_head import draft_step

    logits_BKV, cache, h_BKD = self.hidden_states(cache, tokens_BW, lengths_B, num_draft_tokens)

    def step(t, token_B, r_BD, width=1):
      """q_{t+1} after x~_t = ``token_B``; ``width`` nodes per row (a tree's depth t, the
      rows' nodes back to back) share the row's h_{t+1}."""
      return draft_step(self.head, self.model, jnp.repeat(h_BKD[:, t], width, 0), r_BD, token_B)

    # The carry starts in the dtype a step gives it, as in training: over a bfloat16 draft the
    # float32 head makes it float32. Started in bfloat16, a chain's loop refused its changed
    # carry, and a tree's buffer cast every step back to bfloat16 (2026-11-30).
    start = jnp.zeros(h_BKD[:, 0].shape, h_BKD.dtype)
    stepped = jax.eval_shape(step, 0, jnp.zeros(h_BKD.shape[:1], jnp.int32), start)[1]
    return logits_BKV, cache, step, start.astype(stepped.dtype)

  def propose_tree(
    self,
    cache,
    tokens_BW,
    lengths_B,
    key,
    tree: TreeShape,
    limit_B,
    sampling: SamplingConfig,
    vocab_size: int,
  ) -> tuple[TreeProposal, Any]:
    """Every node at depth d draws its children from q_{d+1} (no call per depth); with the
    sequential head, from q_{d+1} corrected along the node's own path (one head step per
    node, batched per depth)."""
    if self.head is None:
      logits_BKV, cache = self.distributions(cache, tokens_BW, lengths_B, tree.max_depth)
      step = carry = None
    else:
      logits_BKV, cache, step, carry = self._sequential(cache, tokens_BW, lengths_B, tree.max_depth)
    proposal = tree_from(
      key,
      tree,
      logits_BKV,
      lengths_B - 1,
      limit_B,
      sampling,
      vocab_size,
      self.proposal,
      confidence_threshold=self.confidence_threshold,
      step=step,
      carry=carry,
    )
    return proposal, cache

  def check_tree(self, tree: TreeShape) -> None:
    """Any tree: no tree call reaches the model (``propose_tree``)."""
    self.check_tree_options(tree)

  def accept_path(self, cache, source_BD, start_B):
    """Nothing to move: tree nodes never enter the draft cache (the next call re-feeds)."""
    return cache
