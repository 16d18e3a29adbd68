r"""Where draft tokens come from: the drafter interface and its implementations.

The speculative loop (``speculative.py``) asks a drafter for up to K proposed
tokens per row and the distributions they were drawn from; it never looks
inside. A drafter is exact whatever it proposes, as long as it reports the
distribution q_t that x~_t was actually drawn from (a deterministic proposal
has one-hot q) and decides how many tokens to propose from its own draws and
the past only, never from the target's scores of this block.

  ModelDrafter(model)          a separate draft model (Chen et al.), or
  ModelDrafter(EarlyExit(target, L))
                               self-speculative: the target's first L layers,
                               its final norm and head, sharing its weights
  PromptLookupDrafter(n)       no model: the continuation of the most recent
                               earlier occurrence of the row's last n tokens
                               in its own context (prompt lookup decoding)

Interface (all inside jit; ``Drafter.split``/``merge`` cross the boundary):

  init(prompts_BT, prompt_lengths_B, cache_length, num_draft_tokens, state=None,
       features_BTF=None) -> (state, nan_B)
      (``state``: an earlier call's, to refill instead of allocating, from ``empty_state``;
      ``features_BTF``: the target's features at the prompt, for a drafter that reads them)
  propose(state, tokens_BW, lengths_B, key, num_draft_tokens, limit_B, sampling, vocab_size)
      -> (Proposal, state)
  observe(state, features_BTF, start_B) -> state   the target's features at the scored
      positions start_B.. (only a drafter with ``feature_layers`` gets any; default: no-op)
  rollback(state, lengths_B) -> state
  model_calls_per_prefill: 1 for a model, 0 for lookup

Outside jit: ``check(target)``, ``check_tree(tree)``, ``state_bytes``, ``empty_state``,
``step_model()`` (what a draft step's cost is timed on) and ``first_draft_logits`` (the
logits a first draft position is drawn from, teacher-forced: what calibration fits). Nothing
outside a drafter asks which drafter it is.

``limit_B`` is each row's draft length this iteration (K, or what the
adaptive schedule allows, see ``speculative.py``); a drafter may propose fewer
(``Proposal.num_proposed``), e.g. when a lookup finds no match, or when a
draft model's confidence drops below ``confidence_threshold``.

A row with n tokens keeps positions 0..n-2 in a model drafter's cache (the
last token is fed by the next proposal), as in the target's cache.

Tree proposals (``tree.py``; ``speculative_generate(..., tree=...)``):

  propose_tree(state, tokens_BW, lengths_B, key, tree, limit_B, sampling, vocab_size)
      -> (TreeProposal, state)
  accept_path(state, source_BD, start_B) -> state     (after verification: the accepted
      path's cache slots to the row's consecutive positions, before ``rollback``)

A ModelDrafter grows the tree depth by depth: one draft call on the root
(as for a chain), then ONE tree call per depth on all of that depth's nodes
(``attention.TreeCall``: each node attends to the row's cache and its own
ancestors), and draws every node of the next depth from its parent's q, i.i.d.
or without replacement (``TreeShape.distinct_siblings``), as ``proposals.grow_tree``
does for every model drafter. Any drafter can propose a chain-shaped tree; prompt
lookup proposes only chains.

Model drafters propose in one of two modes (``proposal``, ``proposals.py``):
'sampled' draws every token from the real warped q; 'greedy' chooses the most
likely tokens and reports a one-hot q. Both are exact.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx, struct

from specsamp.config_fields import is_int
from specsamp.sampling import memory, model_protocol, proposals
from specsamp.sampling.autoregressive import prefill
from specsamp.sampling.tree import TreeShape
from specsamp.sampling.warping import SamplingConfig


@struct.dataclass
class Proposal:
  """Up to G = K proposed tokens per row.

  Attributes:
    tokens: [B, G] int32; entries past ``num_proposed`` are valid ids, never verified.
    probs: [B, G, V] the warped distributions the tokens were drawn from; None for chosen
      tokens (prompt lookup, greedy proposals, temperature 0): the point mass at each, which
      the verifiers read at the token without a one-hot array (``proposals.chosen_q``).
    num_proposed: [B] int32 in 0..G.
    model_calls: scalar int32, draft model calls made.
    nan: [B] bool, the drafter produced NaN for the row.
  """

  tokens: jax.Array
  probs: jax.Array | None
  num_proposed: jax.Array
  model_calls: jax.Array
  nan: jax.Array


@struct.dataclass
class TreeProposal:
  """A draft tree of N nodes per row (``tree.TreeShape``, breadth-first).

  Attributes:
    tokens: [B, N] int32, each node's token.
    probs: [B, N, V] the distribution each node's token was drawn from (its parent's warped
      q, renormalised over the tokens earlier siblings took when drawn without replacement);
      None for chosen tokens, as ``Proposal.probs``.
    drafted: [B, N] bool, which nodes were drafted; a node not drafted (past the row's draft
      limit, below a confidence stop, or out of tokens to draw) is never accepted, nor its
      descendants. (A mask: ``num_proposed`` is always a count.)
    model_calls: scalar int32, draft model calls made.
    nan: [B] bool, the drafter produced NaN for the row.
    parents: [B, N] int32, each row's parent of node i (-1: the root) for a dynamic tree
      (``tree.dynamic``); None for a static tree, whose parents are the shape's.
  """

  tokens: jax.Array
  probs: jax.Array | None
  drafted: jax.Array
  model_calls: jax.Array
  nan: jax.Array
  parents: jax.Array | None = None


class Drafter:
  """Base class. Subclasses are frozen dataclasses; a field named ``model`` holds the arrays
  (any decode-protocol model, or None), every other field is static and hashable."""

  model_calls_per_prefill = 0
  # Target layers whose entering hidden states the drafter reads (a feature drafter,
  # ``feature_drafter.py``); the loop then captures them in the target's prefill and scoring
  # calls and hands them over with ``init`` and ``observe``.
  feature_layers: tuple[int, ...] = ()

  def split(self) -> tuple[Any, Any]:
    """(static, dynamic): the hashable structure, and the arrays to pass into jit. The arrays
    are the ``model`` field's and those of any other field holding an ``nnx.Module`` (a
    parallel draft's sequential head)."""
    names = [
      f.name
      for f in dataclasses.fields(self)
      if f.name == "model" or isinstance(getattr(self, f.name), nnx.Module)
    ]
    settings = tuple(
      (f.name, getattr(self, f.name)) for f in dataclasses.fields(self) if f.name not in names
    )
    statics, dynamics = {}, {}
    for name in names:
      value = getattr(self, name)
      statics[name], dynamics[name] = (
        (None, None) if value is None else model_protocol.split_model(value)
      )
    return (type(self), settings, tuple(statics.items())), dynamics

  @staticmethod
  def merge(static: Any, dynamic: Any) -> Drafter:
    cls, settings, statics = static
    fields = dict(settings)
    for name, value_static in statics:
      fields[name] = (
        None if value_static is None else model_protocol.merge_model(value_static, dynamic[name])
      )
    return cls(**fields)

  def check(self, target: Any) -> None:
    """Raises a clear error if this drafter cannot draft for ``target``."""

  def empty_state(self, batch_size: int, cache_length: int) -> Any:
    """A state for ``init(..., state=...)`` to fill (a draft model's empty cache), or None
    when ``init`` allocates its own: what a kept-cache sampler allocates once."""
    return None

  def kept_state(self, state: Any) -> Any:
    """What a kept-cache sampler keeps of a call's final state for its next call: the part
    ``empty_state`` allocates, of the same structure (None: nothing), so that the next call
    is the same compiled program as the first, not a second compilation."""
    del state
    return None

  def step_model(self) -> Any:
    """The decode-protocol model one draft step calls (what a draft step's cost is timed
    on), or None for a drafter that calls no model (prompt lookup)."""
    return None

  def call_tokens(self, num_draft_tokens: int) -> int:
    """Tokens per row of one drafting call of ``step_model()`` at draft length K: 1 for a
    drafter that calls its model once per draft token; a parallel drafter's one call is wider
    (what the sample job times a drafting call at)."""
    del num_draft_tokens
    return 1

  def init(
    self,
    prompts_BT,
    prompt_lengths_B,
    cache_length: int,
    num_draft_tokens: int,
    state: Any = None,
    features_BTF: Any = None,
  ) -> tuple[Any, Any]:
    """(state, nan_B): the drafter's state after the prompt (module docstring)."""
    raise NotImplementedError

  def observe(self, state, features_BTF, start_B):
    """Takes the target's features at the scored positions ``start_B``..: a drafter that
    reads them (``feature_layers``) keeps them; any other ignores this."""
    return state

  def first_draft_logits(self, target: Any, tokens_BT: Any) -> tuple[Any, Any]:
    """(logits_BSV, argmax_BS): the logits this drafter draws a first draft position from,
    after each prefix of ``tokens_BT`` it can draft from, and the target's argmax after the
    same prefix (teacher-forced). What ``calibration`` fits a rank temperature to."""
    raise ValueError(
      f"{type(self).__name__} has no model logits to calibrate: a dynamic tree needs a "
      "model drafter or a feature drafter."
    )

  def state_bytes(self, batch_size: int, cache_length: int) -> int:
    """Bytes of the state ``init`` allocates (a draft model's KV cache), for the memory check
    the sampler runs before allocating."""
    return 0

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
    raise NotImplementedError

  def rollback(self, state, lengths_B):
    return state

  def check_tree(self, tree: TreeShape) -> None:
    """Raises a clear error if this drafter cannot propose ``tree``: the base class proposes
    chains only."""
    if not tree.is_chain:
      raise ValueError(
        f"{type(self).__name__} proposes single chains only; the tree {tree.describe()} "
        "needs a model drafter (a draft model or self-speculative)."
      )

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
  ) -> tuple[TreeProposal, Any]:
    """A chain-shaped tree from ``propose`` (subclasses that grow real trees override this)."""
    proposal, state = self.propose(
      state, tokens_BW, lengths_B, key, tree.num_nodes, limit_B, sampling, vocab_size
    )
    drafted_BN = jnp.arange(tree.num_nodes)[None, :] < proposal.num_proposed[:, None]
    return TreeProposal(
      proposal.tokens, proposal.probs, drafted_BN, proposal.model_calls, proposal.nan
    ), state

  def accept_path(self, state, source_BD, start_B):
    """Moves the accepted path's cache slots ``source_BD`` to ``start_B`` onwards."""
    return state


@dataclasses.dataclass(frozen=True)
class ModelDrafter(Drafter):
  """Drafts with a model that follows the decode protocol, sampling from its warped q.

  Attributes:
    model: the draft model (a small model, or ``EarlyExit(target, L)``).
    confidence_threshold: stop a row's draft after a token whose probability under the
      draft's softmax is below this (HF's assistant_confidence_threshold); 0 never stops early.
      Rows that stopped ride along until every row has, so the draft model runs only as
      many steps as the longest row needs.
    proposal: 'sampled' (drawn from the real warped q) or 'greedy' (the most likely tokens,
      verified with one-hot q): ``proposals.py``.
  """

  model: Any
  confidence_threshold: float = 0.0
  proposal: str = "sampled"
  model_calls_per_prefill = 1

  def check(self, target: Any) -> None:
    model_protocol.check_model(self.model, "draft")
    model_protocol.check_same_vocabulary(target, self.model)
    if not 0.0 <= self.confidence_threshold < 1.0:
      raise ValueError(f"confidence_threshold must be in [0, 1), got {self.confidence_threshold}.")
    proposals.check_proposal(self.proposal)

  def state_bytes(self, batch_size: int, cache_length: int) -> int:
    return memory.cache_bytes(self.model, batch_size, cache_length)

  def step_model(self) -> Any:
    return self.model

  def empty_state(self, batch_size: int, cache_length: int) -> Any:
    return self.model.init_cache(batch_size, cache_length)

  def kept_state(self, state: Any) -> Any:
    return state  # The draft model's cache, whole.

  def init(
    self,
    prompts_BT,
    prompt_lengths_B,
    cache_length: int,
    num_draft_tokens: int,
    state: Any = None,
    features_BTF: Any = None,
  ):
    batch = prompts_BT.shape[0]
    cache = self.model.init_cache(batch, cache_length) if state is None else state
    logits, cache = prefill(self.model, prompts_BT, prompt_lengths_B, cache)
    return cache.replace(lengths=prompt_lengths_B - 1), model_protocol.has_nan(logits)

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
    rows_B = jnp.arange(tokens_BW.shape[0])
    # The first call takes the tokens at n-2 and n-1: re-feeding n-2 rewrites the same cache
    # entry, and after a full accept it is the draft's own last token, which it has not seen.
    positions_B2 = jnp.stack([jnp.maximum(lengths_B - 2, 0), lengths_B - 1], axis=1)
    logits_B2V, cache = self.model(tokens_BW[rows_B[:, None], positions_B2], positions_B2, cache)

    def step(t, token_B, cache):  # Token t - 1 at position n - 2 + t gives q_t.
      logits_B1V, cache = self.model(token_B[:, None], (lengths_B + t - 1)[:, None], cache)
      return logits_B1V[:, 0], cache

    tokens_BG, probs_BGV, count_B, steps, nan_B, cache = proposals.grow_chain(
      key,
      logits_B2V[:, -1],
      step,
      cache,
      num_draft_tokens,
      limit_B,
      sampling,
      vocab_size,
      self.proposal,
      confidence_threshold=self.confidence_threshold,
    )
    return Proposal(
      tokens=tokens_BG, probs=probs_BGV, num_proposed=count_B, model_calls=steps, nan=nan_B
    ), cache

  def rollback(self, cache, lengths_B):
    return cache.replace(lengths=lengths_B - 1)

  def first_draft_logits(self, target: Any, tokens_BT: Any) -> tuple[Any, Any]:
    """Token t+1 drafted from tokens 0..t: S = T."""
    tokens_BT = jnp.asarray(tokens_BT, jnp.int32)
    batch, length = tokens_BT.shape
    positions_BT = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    target_logits_BTV, _ = target(tokens_BT, positions_BT, target.init_cache(batch, length))
    draft_logits_BTV, _ = self.model(tokens_BT, positions_BT, self.model.init_cache(batch, length))
    return draft_logits_BTV, jnp.argmax(target_logits_BTV, axis=-1)

  def check_tree(self, tree: TreeShape) -> None:
    model_protocol.check_tree_support(self.model, "draft")
    self.check_tree_options(tree)

  def check_tree_options(self, tree: TreeShape) -> None:
    """The proposal mode and confidence stop against ``tree`` (the model's tree calls apart)."""
    proposals.check_proposal(self.proposal, tree)
    if tree.dynamic and self.confidence_threshold > 0:
      raise ValueError(
        "A dynamic tree already spends its node budget where the draft is confident; "
        "confidence_threshold applies to static trees and chains."
      )

  def accept_path(self, cache, source_BD, start_B):
    return self.model.compact_cache(cache, source_BD, start_B)

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
    """Grows ``tree`` depth by depth (``proposals.grow_tree``): a call on the root, then one
    tree call per depth that has children (module docstring). Node i goes to draft cache slot
    n + i of a row of n tokens, as in the target's tree call."""
    rows_B = jnp.arange(tokens_BW.shape[0])
    root_B = lengths_B - 1
    positions_B2 = jnp.stack([jnp.maximum(lengths_B - 2, 0), root_B], axis=1)
    logits_B2V, cache = self.model(tokens_BW[rows_B[:, None], positions_B2], positions_B2, cache)

    def expand(nodes, drawn_Bn, call, positions_Bn, parents_Bn):
      nonlocal cache
      logits_BnV, cache = self.model(drawn_Bn, positions_Bn, cache, tree=call)
      return logits_BnV

    tokens_BN, probs_BNV, drafted_BN, nan_B, expansions, parents_BN = proposals.grow_tree(
      key,
      tree,
      logits_B2V[:, -1],
      root_B,
      limit_B,
      sampling,
      vocab_size,
      expand,
      proposal=self.proposal,
      confidence_threshold=self.confidence_threshold,
    )
    return TreeProposal(
      tokens=tokens_BN,
      probs=probs_BNV,
      drafted=drafted_BN,
      model_calls=jnp.int32(1 + expansions),
      nan=nan_B,
      parents=parents_BN,
    ), cache


@dataclasses.dataclass(frozen=True)
class PromptLookupDrafter(Drafter):
  """Prompt lookup (n-gram) drafting: no model, no cache.

  For each row, find the most recent earlier occurrence of its last n tokens in its own
  context (prompt and generated so far), trying n = max_ngram down to min_ngram, and
  propose the tokens that followed it (as many as are known, up to the row's limit). The
  proposal is deterministic, so q is one-hot and verification accepts x~_t with
  probability p_t(x~_t); a row with no match proposes nothing and takes one target token.
  """

  max_ngram: int = 3
  min_ngram: int = 1

  def check(self, target: Any) -> None:
    if not (is_int(self.min_ngram) and is_int(self.max_ngram)) or not (
      1 <= self.min_ngram <= self.max_ngram
    ):
      raise ValueError(
        f"Prompt lookup needs ints 1 <= min_ngram <= max_ngram, got {self.min_ngram!r}, "
        f"{self.max_ngram!r}."
      )

  def init(
    self,
    prompts_BT,
    prompt_lengths_B,
    cache_length: int,
    num_draft_tokens: int,
    state: Any = None,
    features_BTF: Any = None,
  ):
    return (), jnp.zeros(prompts_BT.shape[:1], bool)

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
    batch, width = tokens_BW.shape
    rows_B = jnp.arange(batch)
    starts_W = jnp.arange(width)
    best_start_B = jnp.full((batch,), -1, jnp.int32)  # Where the continuation begins.
    for n in range(self.min_ngram, self.max_ngram + 1):  # Longer n-grams override shorter.
      match_BW = jnp.ones((batch, width), bool)
      for i in range(n):
        suffix_B = tokens_BW[rows_B, jnp.maximum(lengths_B - n + i, 0)]
        shifted_BW = jnp.pad(tokens_BW[:, i:], ((0, 0), (0, i)), constant_values=-1)
        match_BW &= shifted_BW == suffix_B[:, None]
      # A window at j is an EARLIER occurrence with a known continuation: j + n <= length - 1.
      valid_BW = (starts_W[None, :] + n <= lengths_B[:, None] - 1) & (lengths_B[:, None] >= n)
      last_j_B = jnp.max(jnp.where(match_BW & valid_BW, starts_W[None, :], -1), axis=1)
      best_start_B = jnp.where(last_j_B >= 0, last_j_B + n, best_start_B)
    found_B = best_start_B >= 0
    available_B = jnp.where(found_B, lengths_B - best_start_B, 0)
    count_B = jnp.clip(jnp.minimum(available_B, limit_B), 0, num_draft_tokens).astype(jnp.int32)
    offsets_G = jnp.arange(num_draft_tokens)
    source_BG = jnp.clip(best_start_B[:, None] + offsets_G[None, :], 0, width - 1)
    tokens_BG = jnp.where(
      offsets_G[None, :] < count_B[:, None], tokens_BW[rows_B[:, None], source_BG], 0
    ).astype(jnp.int32)
    return Proposal(
      tokens=tokens_BG,
      probs=None,  # Copied, not drawn: the point mass at each token (``proposals.chosen_q``).
      num_proposed=count_B,
      model_calls=jnp.int32(0),
      nan=jnp.zeros((batch,), bool),
    ), state


def self_speculative(target: Any, num_layers: int, **options: Any) -> ModelDrafter:
  """A drafter from the target's first ``num_layers`` layers (its weights, no copy)."""
  from specsamp.models.transformer import EarlyExit

  return ModelDrafter(EarlyExit(target, num_layers), **options)


def as_drafter(draft: Any) -> Drafter:
  """A Drafter as is; a decode-protocol model becomes a ModelDrafter."""
  if isinstance(draft, Drafter):
    return draft
  model_protocol.check_model(draft, "draft")
  return ModelDrafter(draft)
