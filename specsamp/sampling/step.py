r"""One iteration of the speculative loop, behind one interface.

The loop (``speculative.py``) chooses its step once, when it is built
(``SpeculativeLoop.step``), and calls it every iteration the same way, never asking which
kind it holds:

  step(target, drafter, StepInput, key, synthetic_acceptance) -> StepResult

  chain_step.ChainStep   one chain of K draft tokens, K + 1 positions scored in one target
                         call, verified by 'token', 'block' or 'synthetic' (argmax at T=0)
  tree_step.TreeStep     a tree of draft tokens scored in one target call with tree
                         attention, verified by 'token' (recursive rejection sampling) or
                         'traversal' (argmax at T=0), the accepted path then compacted in
                         both caches

Each step owns its verifier. Everything else an iteration does (appending, EOS,
max_new_tokens, the schedules, statistics, the caches' rollback) is the loop's, shared.
"""

from __future__ import annotations

from typing import Any, Protocol

import jax
from flax import struct


@struct.dataclass
class StepInput:
  """What a step reads of the loop's state, for a row of n tokens whose caches hold
  positions 0..n-2.

  Attributes:
    tokens: [B, W] every row's tokens so far (prompt and generated), padded.
    lengths: [B] n per row.
    limit: [B] k_b, the most draft tokens (a tree: the deepest depth) the row may propose.
    target_cache: the target's KV cache.
    drafter_state: the drafter's state (a draft model's cache, a feature head's features).
  """

  tokens: jax.Array
  lengths: jax.Array
  limit: jax.Array
  target_cache: Any
  drafter_state: Any


@struct.dataclass
class StepResult:
  """What the loop needs from one draft-score-verify step (chain or tree).

  Attributes:
    path_tokens: [B, D] the accepted draft tokens, in order (entries past num_accepted unused).
    num_accepted: [B] draft tokens accepted.
    next_token: [B] the emitted token.
    draft_depth: [B] the deepest proposed draft position (k_b for a chain).
    num_proposed: [B] draft tokens proposed in all (k_b for a chain, nodes for a tree).
    target_cache, drafter_state: after the step, not yet rolled back.
    draft_calls: scalar, draft model calls.
    scored_tokens: scalar, the positions per row the scoring call ran on (K + 1 for a chain,
      fewer with narrow scoring; the tree's nodes + 1).
    nan: [B] either model produced NaN for the row.
    rank_counts: ([B, R], [B, R]) accepted and reached nodes per sibling rank (a tree's,
      ``tree_step.rank_counts``); None for a chain (rank 0 only, counted from the verdict).
  """

  path_tokens: jax.Array
  num_accepted: jax.Array
  next_token: jax.Array
  draft_depth: jax.Array
  num_proposed: jax.Array
  target_cache: Any
  drafter_state: Any
  draft_calls: jax.Array
  nan: jax.Array
  scored_tokens: jax.Array
  rank_counts: tuple[jax.Array, jax.Array] | None = None


class Step(Protocol):
  """A chain step or a tree step: hashable static settings, called inside the jitted loop."""

  @property
  def ranks(self) -> int:
    """Sibling ranks the statistics keep per row (1 for a chain)."""
    ...

  def __call__(
    self,
    target: Any,
    drafter: Any,
    inputs: StepInput,
    key: jax.Array,
    synthetic_acceptance: jax.Array,
  ) -> StepResult: ...
