r"""Prompt lookup where the row's context repeats, the feature head everywhere else: one chain
drafter from two (``drafter='feature+lookup'``), or both side by side in one tree.

Each proposal looks up the row's last n-gram earlier in its own context (``PromptLookupDrafter``,
n = ``max_ngram`` down to ``min_ngram``). A row with a match proposes the tokens that followed
it, copied (q the point mass at each); a row without one proposes the feature head's chain,
drawn from the head's real q (``FeatureDrafter``). The head catches up on the target's features
in every iteration either way, so its cache is whole when it is next asked; its K drafting
steps run only when some row has no match (``lax.cond``: at batch 1, an iteration that copies
costs no head step).

Why it pays: text that quotes its context (code an answer rewrites or explains, a document a
summary cites) is drafted best by copying, and a copy costs nothing, while a trained head
predicts the rest. On SmolLM2's held-out greedy answers (docs/training_on_answers.md section 11)
prompt lookup alone reaches tau(K=4) = 2.85 and the shipped head 1.92; lookup where it matches
a 2-gram and the head elsewhere, 3.12.

Side by side (``tree='chains:2xK'``, ``propose_tree``): the copy as chain 0 and the head's
chain as chain 1 of one tree call, so greedy verification keeps whichever run is longer rather
than a rule choosing one before the target has spoken; on the same answers, in the greedy loop
at K = 4, 2.66 tokens per target call against the chain's 2.43 (its copy after 1-grams too:
``tree_min_ngram``), for a call of 2K + 1 tokens instead of K + 1
(docs/training_on_answers.md section 15).

Exactness: which drafter a row uses depends only on its context, known before any draft is
drawn, and each draft is verified with the q it came from (the point mass for a copied token,
the head's warped q for a drawn one). So the proposal's law is that of a chain drafter whose
q_t is a function of the past and x~_<t, and the sampler's output is the target's
(tests/test_lookup_feature_drafter.py; the certificate's ``feature_lookup`` cases).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from specsamp.sampling.drafters import PromptLookupDrafter, Proposal, TreeProposal
from specsamp.sampling.feature_drafter import FeatureDrafter
from specsamp.sampling.tree import TreeShape, chains
from specsamp.sampling.warping import SamplingConfig

MIN_NGRAM = 2
"""The shortest n-gram that makes a row copy: a single repeated token is a poor reason to (on
SmolLM2's held-out answers, 1-grams cost 0.07 tau; docs/training_on_answers.md section 11)."""


def is_side_by_side(tree: TreeShape) -> bool:
  """Whether ``tree`` is the one 'feature+lookup' proposes: ``chains:2xK``, the copy beside the
  head's chain (``LookupFeatureDrafter.propose_tree``)."""
  return tree.parents == chains(2, tree.max_depth).parents


def copied_q(point_BKV: jax.Array, drawn_BKV: jax.Array) -> jax.Array:
  """The q a copied draft is verified with: the point mass at it (``point_BKV``). The head's q
  at the same position (``drawn_BKV``: what the row would have drawn from) is what it must NOT
  be verified with (the certificate's planted bug ``copied_drawn_q`` returns it instead)."""
  del drawn_BKV
  return point_BKV


@struct.dataclass
class LookupFeatureDrafter(FeatureDrafter):
  """A feature head (``FeatureDrafter``'s fields) with prompt lookup first (module docstring).

  Attributes:
    max_ngram: the longest n-gram looked up.
    min_ngram: the shortest n-gram that counts as a match (2: a single repeated token does not
      make a row copy).
    head_draft_tokens: the most tokens a row drafted by the head proposes (0: the loop's K, as
      a copying row). A copy costs nothing and is accepted far more often than the head's
      later drafts, so K can be long for copies and short for the head; with narrow scoring
      a head row is then scored at this width + 1. A constant, so the proposal's law stays a
      function of the row's context (exactness as above).
    tree_min_ngram: the shortest n-gram that makes the copy branch of the side-by-side tree
      draft (``propose_tree``). 1: beside the head's chain a copy costs the head nothing, so a
      single repeated token is reason enough (on SmolLM2's held-out answers, K = 4, 2.66
      tokens per target call in the greedy loop against 2.53 with 2-grams; in a chain, where
      the copy replaces the head, 1-grams cost 0.19).
  """

  max_ngram: int = 3
  min_ngram: int = MIN_NGRAM
  head_draft_tokens: int = 0
  tree_min_ngram: int = 1

  def lookup(self, tree: bool = False) -> PromptLookupDrafter:
    minimum = self.tree_min_ngram if tree else self.min_ngram
    return PromptLookupDrafter(max_ngram=self.max_ngram, min_ngram=minimum)

  def head_limit(self, limit_B: jax.Array) -> jax.Array:
    """The most tokens a row's head chain drafts: ``limit_B``, capped at ``head_draft_tokens``."""
    return jnp.minimum(limit_B, self.head_draft_tokens) if self.head_draft_tokens else limit_B

  def copies_q(self, copied_BK: jax.Array, drawn_BKV: jax.Array) -> jax.Array:
    """[B, K, V] the q copied tokens are verified with (``copied_q``): their point masses."""
    point_BKV = jax.nn.one_hot(copied_BK, drawn_BKV.shape[-1], dtype=drawn_BKV.dtype)
    return copied_q(point_BKV, drawn_BKV)

  def check(self, target: Any) -> None:
    super().check(target)
    self.lookup().check(target)
    self.lookup(tree=True).check(target)
    if not isinstance(self.head_draft_tokens, int) or self.head_draft_tokens < 0:
      raise ValueError(
        f"head_draft_tokens must be an int >= 0 (0: the loop's K), got {self.head_draft_tokens!r}."
      )
    if self.model.head.config.parallel:
      raise ValueError(
        "drafter='feature+lookup' drafts with a sequential feature head; this one is a "
        "parallel head (parallel_head)."
      )

  def check_tree(self, tree: TreeShape) -> None:
    if not is_side_by_side(tree):
      raise ValueError(
        "drafter='feature+lookup' proposes a chain, or the copy and the head's chain side by "
        f"side as the tree 'chains:2x{tree.max_depth}'; got another tree (use 'feature' for "
        "trees of the head's own)."
      )
    super().check_tree(tree)

  def propose_tree(
    self,
    state,
    tokens_BW,
    lengths_B,
    key,
    tree: TreeShape,
    limit_B,
    sampling: SamplingConfig,
    vocab_size: int,
  ):
    """The copy and the head's chain side by side: the tree ``chains:2xK`` with prompt lookup's
    continuation as chain 0 (point-mass q, not drafted where the row has no match) and the
    head's chain as chain 1 (its real q), in the layout of ``tree.chains``. The head drafts in
    every iteration; which tokens either chain holds depends only on the row's context and
    the head's own draws, so each node's q is the law it was drawn from, and the tree
    verifiers' sibling update holds for siblings drawn from any q (``tree_verification``)."""
    K = tree.max_depth
    copied, _ = self.lookup(tree=True).propose(
      (), tokens_BW, lengths_B, key, K, limit_B, sampling, vocab_size
    )
    drawn, state = FeatureDrafter.propose(
      self, state, tokens_BW, lengths_B, key, K, self.head_limit(limit_B), sampling, vocab_size
    )
    depth_K = jnp.arange(K)
    side_by_side = (
      lambda copy, head: jnp.stack([copy, head], axis=2).reshape(  # noqa: E731
        copy.shape[0], 2 * K, *copy.shape[2:]
      )
    )
    probs = drawn.probs
    if probs is not None:
      probs = side_by_side(self.copies_q(copied.tokens, probs), probs)
    proposal = TreeProposal(
      tokens=side_by_side(copied.tokens, drawn.tokens),
      probs=probs,
      drafted=side_by_side(
        depth_K[None] < copied.num_proposed[:, None], depth_K[None] < drawn.num_proposed[:, None]
      ),
      model_calls=drawn.model_calls,
      nan=drawn.nan,
    )
    return proposal, state

  def propose(
    self,
    state,
    tokens_BW,
    lengths_B,
    key,
    num_draft_tokens: int,
    limit_B,
    sampling: SamplingConfig,
    vocab_size: int,
  ):
    copied, _ = self.lookup().propose(
      (), tokens_BW, lengths_B, key, num_draft_tokens, limit_B, sampling, vocab_size
    )
    copy_B = copied.num_proposed > 0
    head_limit_B = self.head_limit(limit_B)

    def head(state):
      return FeatureDrafter.propose(
        self, state, tokens_BW, lengths_B, key, num_draft_tokens, head_limit_B, sampling, vocab_size
      )

    def copy_only(state):  # Every row copies: the head only catches up.
      shapes, _ = jax.eval_shape(head, state)
      _, cache, _ = self._catch_up(state, tokens_BW, lengths_B)
      unused = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
      return unused, state.replace(cache=cache)

    drawn, state = jax.lax.cond(jnp.all(copy_B), copy_only, head, state)
    probs = drawn.probs
    if probs is not None:  # Drawn tokens carry q; a copied row's q is the point mass.
      probs = jnp.where(copy_B[:, None, None], self.copies_q(copied.tokens, probs), probs)
    proposal = Proposal(
      tokens=jnp.where(copy_B[:, None], copied.tokens, drawn.tokens),
      probs=probs,
      num_proposed=jnp.where(copy_B, copied.num_proposed, drawn.num_proposed),
      model_calls=drawn.model_calls,
      nan=jnp.where(copy_B, False, drawn.nan),
    )
    return proposal, state
