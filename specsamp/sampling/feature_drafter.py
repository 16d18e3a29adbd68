r"""A drafter that reads the target's features: the feature head (``models/feature_head.py``,
EAGLE style) in the speculative loop, sampling every token from its real, warped q.

Positions. A row holds n tokens x_0..x_{n-1}. Head position p consumes the pair
(f_p, x_{p+1}) (the target's features at p and the token that followed) and predicts x_{p+2}.
The head's cache holds pairs 0..m-1 made with the target's true features; the features
f_m..f_{n-2} are *pending*: the target computed them in its last call (the prompt's prefill,
or the last scoring call, whose positions the loop hands over with ``observe``), but their
following tokens were only settled by the verification after it.

Each proposal
  1. catches up: ONE head call on the pending pairs (m..n-2), whose last output (position
     n-2) gives q_1, from which x~_1 is drawn;
  2. drafts: x~_t for t >= 2 from the head's call on (h_{n-3+t}, x~_{t-1}) at position
     n-2+t: its own hidden state stands in for the target's feature it does not have yet.
Then the loop's scoring call on [x_{n-1}, x~_1..x~_K] returns the target's features there
(``capture_layers``), which ``observe`` keeps as the next pending block: nothing the target
computed is recomputed, and the head's drafted cache entries beyond n-2 are rewritten with
true features by the next catch-up before anything reads them.

Exactness: every x~_t is drawn from q_t = warp(head logits), the distribution reported to
the verifier; the features it reads are the target's on the accepted past, and how many
tokens it proposes depends on the past only. So the sampler's output is distributed as the
target's, whatever the head's quality (a reduced draft vocabulary only makes q zero outside
it). Greedy sampling proposes the argmax and equals autoregressive greedy token for token.

A row of one token has no feature yet (the target has not run on it): it proposes nothing in
its first iteration and the loop emits one target token.

A parallel head (``FeatureHeadConfig.parallel``, DFlash / PARD style) drafts from ONE call: the
catch-up pairs and then K - 1 placeholder pairs at positions n-1..n+K-3, whose outputs give
q_2..q_K (q_1 from the last caught-up pair, as above). Pending entries past a row's count are
fed again as its last caught-up pair (the same position and inputs, so the same cache entry),
never at a placeholder's position. Every q_k is computed before any draft is drawn, so each
x~_k ~ q_k is verified exactly with it (``parallel_drafter`` says why); a node of a tree at
depth d draws its children from q_{d+1}.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from specsamp.models.kv_cache import KVCache
from specsamp.sampling import memory, model_protocol, parallel_drafter, proposals
from specsamp.sampling.drafters import Drafter, Proposal, TreeProposal
from specsamp.sampling.tree import TreeShape
from specsamp.sampling.warping import SamplingConfig


@struct.dataclass
class FeatureState:
  """The feature drafter's state.

  Attributes:
    cache: the head's KV cache (one layer).
    pending: [B, P, F] the target's features at positions start..start+P-1 (P = K + 1, the
      scoring call's width); the first n - 1 - start of them are the pending pairs' features.
    start: [B] int32, the first pending position (the head's cache is valid before it).
  """

  cache: KVCache
  pending: jax.Array
  start: jax.Array


def chain_logits(model: Any, h_BD: jax.Array) -> jax.Array | proposals.DraftVocabLogits:
  """What a chain draws from at the head's [B, D] hidden states: with a draft vocabulary, its
  V_d logits and their target ids (``proposals.DraftVocabLogits``: warped and drawn over V_d,
  not V); else the target's head's [B, V] logits (``FeatureDraftModel.logits``)."""
  head = model.head
  if head.config.draft_vocab_size:
    small_BW = head.small_logits(h_BD[:, None])[:, 0].astype(jnp.float32)
    return proposals.DraftVocabLogits(small_BW, head.draft_to_target[...], model.vocab_size)
  return model.logits(h_BD[:, None])[:, 0]


def check_feature_target(target: Any) -> None:
  """Raises a clear error unless ``target`` returns its features (decode protocol, part (g))."""
  if not callable(target) or "capture_layers" not in inspect.signature(target).parameters:
    raise TypeError(
      f"A feature drafter reads the target's hidden features, but the target "
      f"({type(target).__name__}) does not return them: it needs "
      "model(tokens, positions, cache, capture_layers=(...)) -> ModelOutput(logits, cache, "
      "features) "
      "(decode protocol, part (g), in specsamp.sampling.model_protocol)."
    )


@dataclasses.dataclass(frozen=True)
class FeatureDrafter(Drafter):
  """Drafts chains with a feature head (module docstring).

  Attributes:
    model: a ``feature_head.FeatureDraftModel`` (the head and the target it reads).
    proposal: 'sampled' (every token drawn from the head's real warped q) or 'greedy' (its
      most likely tokens, verified with one-hot q, as EAGLE in vLLM): ``proposals.py``.
    confidence_threshold: stop a row's chain (a static tree's branch) after a token whose
      probability under the head's own (unwarped) softmax is below this (0: never stop
      early), as ``ModelDrafter``'s. How many tokens a row proposes then depends on the head's
      output alone, so it stays exact; with ``narrow_scoring`` the target scores fewer.
  """

  model: Any
  proposal: str = "sampled"
  confidence_threshold: float = 0.0
  model_calls_per_prefill = 1

  @property
  def feature_layers(self) -> tuple[int, ...]:
    return self.model.feature_layers

  def check(self, target: Any) -> None:
    check_feature_target(target)
    model_protocol.check_same_vocabulary(target, self.model)
    paired, given = self.model.target.config, getattr(target, "config", None)
    shape = lambda c: (c.d_model, c.num_layers)
    if given is not None and shape(given) != shape(paired):
      raise ValueError(
        f"This feature head was paired with a target of d_model {paired.d_model} and "
        f"{paired.num_layers} layers (it reads layers {list(self.feature_layers)} and shares "
        f"that target's embedding), but samples with one of d_model {given.d_model} and "
        f"{given.num_layers} layers: pair the head with the target it was trained for, "
        "FeatureDraftModel(head, target)."
      )
    proposals.check_proposal(self.proposal)
    if not 0.0 <= self.confidence_threshold < 1.0:
      raise ValueError(f"confidence_threshold must be in [0, 1), got {self.confidence_threshold}.")

  def check_tree(self, tree: TreeShape) -> None:
    proposals.check_proposal(self.proposal, tree)
    if tree.dynamic and self.confidence_threshold > 0:
      raise ValueError(
        "A dynamic tree already spends its node budget where the head is confident; "
        "confidence_threshold applies to static trees and chains."
      )

  def state_bytes(self, batch_size: int, cache_length: int) -> int:
    return memory.cache_bytes(self.model, batch_size, cache_length)

  def step_model(self) -> Any:
    return self.model.as_step_model()

  def call_tokens(self, num_draft_tokens: int) -> int:
    # A parallel head's one call: up to K + 1 caught-up pairs and K - 1 placeholders.
    return 2 * num_draft_tokens if self.model.head.config.parallel else 1

  def empty_state(self, batch_size: int, cache_length: int) -> Any:
    return self.model.init_cache(batch_size, cache_length)  # The head's cache; init adds the rest.

  def kept_state(self, state: FeatureState) -> Any:
    return state.cache

  def init(
    self,
    prompts_BT: jax.Array,
    prompt_lengths_B: jax.Array,
    cache_length: int,
    num_draft_tokens: int,
    state: KVCache | None = None,
    features_BTF: jax.Array | None = None,
  ) -> tuple[FeatureState, jax.Array]:
    """The head's cache over the prompt's pairs 0..n-3 and f_{n-2} pending; (state, nan_B).

    ``features_BTF`` are the target's features at the prompt's positions (its prefill);
    ``state`` a head cache to refill (``empty_state``, or ``kept_state`` of an earlier call)."""
    if features_BTF is None:
      raise ValueError(
        "A feature drafter starts from the target's features at the prompt: init needs "
        "features_BTF (the speculative loop captures them in the target's prefill)."
      )
    batch = prompts_BT.shape[0]
    rows_B = jnp.arange(batch)
    cache = self.model.init_cache(batch, cache_length) if state is None else state
    h_BTD, cache = self.pairs_hidden(prompts_BT, features_BTF, cache)
    start_B = jnp.maximum(prompt_lengths_B - 2, 0)
    pending_BPF = jnp.zeros((batch, num_draft_tokens + 1, features_BTF.shape[-1]))
    pending_BPF = pending_BPF.astype(features_BTF.dtype).at[:, 0].set(features_BTF[rows_B, start_B])
    state = FeatureState(cache=cache.replace(lengths=start_B), pending=pending_BPF, start=start_B)
    return state, model_protocol.has_nan(h_BTD)

  def first_draft_logits(self, target: Any, tokens_BT: Any) -> tuple[jax.Array, jax.Array]:
    """Token t+1 drafted from the pair (target feature at t-1, token t): S = T - 1, from the
    second token on."""
    tokens_BT = jnp.asarray(tokens_BT, jnp.int32)
    batch, length = tokens_BT.shape
    positions_BT = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    scored = target(
      tokens_BT, positions_BT, target.init_cache(batch, length), capture_layers=self.feature_layers
    )
    h_BTD, _ = self.pairs_hidden(tokens_BT, scored.features, self.model.init_cache(batch, length))
    return self.model.logits(h_BTD[:, :-1]), jnp.argmax(scored.logits[:, 1:], axis=-1)

  def pairs_hidden(self, tokens_BT: jax.Array, features_BTF: jax.Array, cache: Any):
    """(h_BTD, cache): the head over the pairs (target feature at t, token t+1) of a text at
    positions t = 0..T-1, its output at t giving the q of token t+2; the last pair has no next
    token and repeats the last one (its output is never read)."""
    batch, width = tokens_BT.shape
    following_BT = jnp.concatenate([tokens_BT[:, 1:], tokens_BT[:, -1:]], axis=1)
    positions_BT = jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32), (batch, width))
    return self.model.hidden(following_BT, self.model.head.fuse(features_BTF), positions_BT, cache)

  def observe(self, state: FeatureState, features_BTF: jax.Array, start_B: jax.Array):
    """Keeps the scoring call's features (positions start_B..start_B+K) as the pending block."""
    return state.replace(pending=features_BTF.astype(state.pending.dtype), start=start_B)

  def rollback(self, state: FeatureState, lengths_B):
    return state.replace(cache=state.cache.replace(lengths=state.start))

  def _pending_pairs(self, state: FeatureState, tokens_BW, lengths_B):
    """(tokens_BP, fused_BPD, positions_BP, count_B): the pending pairs' following tokens, fused
    features and positions, and how many a row has (0 for a one-token row, which has no
    feature yet). Entries past a row's count repeat its last pending pair (the same position
    and inputs, so the same cache entry): a call never writes a slot after position n-2 with
    them."""
    batch, width = tokens_BW.shape
    rows_B = jnp.arange(batch)
    count_B = lengths_B - 1 - state.start  # Pending pairs: 0 (a one-token row) .. K + 1.
    last_B = jnp.maximum(count_B - 1, 0)
    index_BP = jnp.minimum(jnp.arange(state.pending.shape[1])[None, :], last_B[:, None])
    positions_BP = state.start[:, None] + index_BP.astype(jnp.int32)
    following_BP = tokens_BW[rows_B[:, None], jnp.minimum(positions_BP + 1, width - 1)]
    pending_BPF = jnp.take_along_axis(state.pending, index_BP[:, :, None], axis=1)
    return following_BP, self.model.head.fuse(pending_BPF), positions_BP, count_B

  def _catch_up(self, state: FeatureState, tokens_BW, lengths_B):
    """ONE head call on the pending pairs; (h at position n-2, the head's cache, pairs caught
    up per row)."""
    following_BP, fused_BPD, positions_BP, count_B = self._pending_pairs(
      state, tokens_BW, lengths_B
    )
    h_BPD, cache = self.model.hidden(following_BP, fused_BPD, positions_BP, state.cache)
    rows_B = jnp.arange(tokens_BW.shape[0])
    return h_BPD[rows_B, jnp.maximum(count_B - 1, 0)], cache, count_B

  def _parallel_call(self, state: FeatureState, tokens_BW, lengths_B, num_draft_tokens: int):
    """A parallel head's one call (module docstring): (logits_BKV of q_1..q_K, cache, pairs
    caught up per row)."""
    model = self.model
    batch, pending = tokens_BW.shape[0], state.pending.shape[1]
    following_BP, fused_BPD, positions_BP, count_B = self._pending_pairs(
      state, tokens_BW, lengths_B
    )
    embedded_BPD = model.target.embedder.encode(following_BP).astype(fused_BPD.dtype)
    holes = num_draft_tokens - 1
    held_embedded, held_fused = model.head.placeholders(batch, holes, fused_BPD.dtype)
    positions_BH = (lengths_B - 1)[:, None] + jnp.arange(holes, dtype=jnp.int32)[None, :]
    h_BTD, cache = model.head.hidden(
      jnp.concatenate([embedded_BPD, held_embedded], axis=1),
      jnp.concatenate([fused_BPD, held_fused], axis=1),
      jnp.concatenate([positions_BP, positions_BH], axis=1),
      state.cache,
    )
    last_BD = h_BTD[jnp.arange(batch), jnp.maximum(count_B - 1, 0)]
    h_BKD = jnp.concatenate([last_BD[:, None], h_BTD[:, pending:]], axis=1)
    return model.logits(h_BKD), cache, count_B

  def _propose_parallel(
    self, state, tokens_BW, lengths_B, key, num_draft_tokens, limit_B, sampling, vocab_size
  ):
    logits_BKV, cache, count_B = self._parallel_call(state, tokens_BW, lengths_B, num_draft_tokens)
    proposal = parallel_drafter.chain_from(
      key,
      logits_BKV,
      limit_B,
      sampling,
      vocab_size,
      self.proposal,
      active_B=count_B > 0,
      confidence_threshold=self.confidence_threshold,
    )
    return proposal, state.replace(cache=cache)

  def propose(
    self,
    state: FeatureState,
    tokens_BW,
    lengths_B,
    key,
    num_draft_tokens: int,
    limit_B,
    sampling: SamplingConfig,
    vocab_size: int,
  ):
    if self.model.head.config.parallel:
      return self._propose_parallel(
        state, tokens_BW, lengths_B, key, num_draft_tokens, limit_B, sampling, vocab_size
      )
    model = self.model
    # 1. Catch up on the pending pairs; the output at the last one (position n-2) gives q_1.
    h_BD, cache, count_B = self._catch_up(state, tokens_BW, lengths_B)

    # 2. Draft on: the head's own h stands in for the feature at the next position.
    def step(t, token_B, carry):  # The pair (h_{n-3+t}, x~_t) at position n-2+t gives q_{t+1}.
      cache, h_BD = carry
      positions_B1 = (lengths_B - 2 + t)[:, None]
      h_B1D, cache = model.hidden(token_B[:, None], h_BD[:, None], positions_B1, cache)
      return chain_logits(model, h_B1D[:, 0]), (cache, h_B1D[:, 0])

    tokens_BG, probs_BGV, proposed_B, steps, nan_B, (cache, _) = proposals.grow_chain(
      key,
      chain_logits(model, h_BD),
      step,
      (cache, h_BD),
      num_draft_tokens,
      limit_B,
      sampling,
      vocab_size,
      self.proposal,
      active_B=count_B > 0,  # A one-token row has no feature yet: it proposes nothing.
      confidence_threshold=self.confidence_threshold,
    )
    proposal = Proposal(
      tokens=tokens_BG, probs=probs_BGV, num_proposed=proposed_B, model_calls=steps, nan=nan_B
    )
    return proposal, state.replace(cache=cache)

  def propose_tree(
    self,
    state: FeatureState,
    tokens_BW,
    lengths_B,
    key,
    tree: TreeShape,
    limit_B,
    sampling: SamplingConfig,
    vocab_size: int,
  ):
    """Catches up (as ``propose``), then grows ``tree`` depth by depth
    (``proposals.grow_tree``): node j at depth d is the pair (h of its parent, x~_j) at head
    position n-2+d, in head cache slot n-1+j; ONE tree call per depth that has children, each
    node attending to the head's cache before n-1 and to its own ancestors (the tree's root is
    the pair at n-2, whose output gave the root's q). Slots beyond the accepted path are never
    read: the next catch-up rewrites the path's pairs with the target's true features."""
    model = self.model
    if model.head.config.parallel:
      return self._propose_tree_parallel(
        state, tokens_BW, lengths_B, key, tree, limit_B, sampling, vocab_size
      )
    h_BD, cache, count_B = self._catch_up(state, tokens_BW, lengths_B)
    # The head's hidden state after the root (row 0) and after each node j (row 1 + j).
    h_BSD = jnp.zeros((h_BD.shape[0], tree.num_nodes + 1, h_BD.shape[-1]), h_BD.dtype)
    h_BSD = h_BSD.at[:, 0].set(h_BD)

    def expand(nodes, drawn_Bn, call, positions_Bn, parents_Bn):
      nonlocal cache, h_BSD
      parents_BnD = jnp.take_along_axis(h_BSD, (parents_Bn + 1)[:, :, None], axis=1)
      h_BnD, cache = model.hidden(drawn_Bn, parents_BnD, positions_Bn, cache, tree=call)
      h_BSD = h_BSD.at[:, [1 + j for j in nodes]].set(h_BnD)
      return model.logits(h_BnD)

    tokens_BN, probs_BNV, drafted_BN, nan_B, expansions, parents_BN = proposals.grow_tree(
      key,
      tree,
      model.logits(h_BD[:, None])[:, 0],
      jnp.maximum(lengths_B - 2, 0),  # The head's root: the pair at n-2.
      jnp.where(count_B > 0, limit_B, 0),  # A one-token row has no feature: nothing.
      sampling,
      vocab_size,
      expand,
      proposal=self.proposal,
      confidence_threshold=self.confidence_threshold,
    )
    proposal = TreeProposal(
      tokens=tokens_BN,
      probs=probs_BNV,
      drafted=drafted_BN,
      model_calls=jnp.int32(1 + expansions),
      nan=nan_B,
      parents=parents_BN,
    )
    return proposal, state.replace(cache=cache)

  def _propose_tree_parallel(
    self, state, tokens_BW, lengths_B, key, tree, limit_B, sampling, vocab_size
  ):
    """A parallel head's tree: one call, then every node at depth d draws its children from
    q_{d+1} (no call per depth)."""
    logits_BKV, cache, count_B = self._parallel_call(state, tokens_BW, lengths_B, tree.max_depth)
    proposal = parallel_drafter.tree_from(
      key,
      tree,
      logits_BKV,
      jnp.maximum(lengths_B - 2, 0),
      jnp.where(count_B > 0, limit_B, 0),
      sampling,
      vocab_size,
      self.proposal,
      self.confidence_threshold,
    )
    return proposal, state.replace(cache=cache)
