"""The decode protocol the samplers rely on, and how models cross a jit boundary.

Any object can be a target or a draft model if it

  (a) has ``vocab_size`` (int),
  (b) makes an empty cache: ``init_cache(batch_size, max_length) -> cache``,
      a pytree with a ``lengths`` [B] int32 field,
  (c) maps ``(tokens_BT, positions_BT, cache) -> (logits_BTV, cache)``,
      processing T >= 1 tokens per row at per-row positions (consecutive within
      a row), and setting ``cache.lengths`` to one past each row's last position,
  (d) is a Flax NNX module or a JAX pytree (e.g. a ``flax.struct.dataclass``),
      so its arrays can be passed into the sampler's jitted loop.

Samplers only read ``cache.lengths`` and replace it (``cache.replace(lengths=...)``)
to roll rows back; cache entries beyond a row's length must never be read.
specsamp's Transformer is one such model; a bigram table is another.

Tree proposals (``speculative_generate(..., tree=...)``) need two more things
from the target and from a model drafter:

  (e) ``model(tokens_BT, positions_BT, cache, tree=TreeCall(root_B, offsets_T, mask_TM))``:
      token t is written to slot root_B + offsets_T[t] (slots are no longer
      positions: siblings share a position), and attends to the slots before
      root_B and to the tree slots root_B + m with mask_TM[t, m]
      (``specsamp.models.attention.TreeCall``; a dynamic tree gives one mask per row,
      [B, T, M], and ``TreeCall.mask_BTM`` reads either);
  (f) ``model.compact_cache(cache, source_BD, start_B) -> cache``: copies slot
      source_BD[b, j] to start_B[b] + j (the accepted path to consecutive slots).

A feature-level drafter (``feature_drafter.FeatureDrafter``, EAGLE style) needs one more thing
from the target, and only from the target:

  (g) ``model(tokens_BT, positions_BT, cache, capture_layers=(l_1, ..., l_C))
      -> ModelOutput(logits_BTV, cache, features_BTF)``: the same call, whose output
      (``specsamp.models.output``, which unpacks as the pair (c) returns) also carries the
      hidden states entering layers l_1 < ... < l_C (before their norm; layer 0's is the embedding),
      concatenated along the features, F = C * D. The loop captures them in the prefill and
      in every scoring call, so the drafter reads what the target computed anyway.
  A target without (g) is refused by name when a feature drafter is asked for
  (``feature_drafter.check_feature_target``).

One optional part saves memory in every prefill:

  (h) a model with ``accepts_logits_at = True`` takes ``model(tokens_BT, positions_BT, cache,
      logits_at=index_B)`` and returns logits [B, 1, V] of token index_B[b] of each row only
      (the cache is written for all T tokens, as always). The prefill needs each row's last
      prompt logits; without (h) it computes [B, T, V] and keeps one row of it: for
      Qwen3-30B-A3B, float32 logits over 151,936 ids at 1,915 prompt positions, 1.2 GB per row
      per copy (tests/test_models.py, docs/benchmarks.md).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
from flax import nnx

from specsamp.models import output
from specsamp.models.output import ModelOutput


@runtime_checkable
class DecodeModel(Protocol):
  """Structural type of a target or draft model (see the module docstring)."""

  vocab_size: int

  def init_cache(self, batch_size: int, max_length: int) -> Any: ...

  def __call__(
    self, tokens_BT: jax.Array, positions_BT: jax.Array, cache: Any
  ) -> tuple[jax.Array, Any]: ...


def check_model(model: Any, role: str = "model") -> None:
  """Raises a clear error if ``model`` does not follow the decode protocol."""
  missing = [name for name in ("vocab_size", "init_cache", "__call__") if not hasattr(model, name)]
  if missing:
    raise TypeError(
      f"The {role} ({type(model).__name__}) does not follow specsamp's decode "
      f"protocol: missing {missing}. See specsamp.sampling.model_protocol."
    )


def check_tree_support(model: Any, role: str = "model") -> None:
  """Raises a clear error unless ``model`` can take tree calls (parts (e) and (f))."""
  if not hasattr(model, "compact_cache"):
    raise TypeError(
      f"The {role} ({type(model).__name__}) cannot score or draft a tree: tree proposals need "
      "a model that takes tree=TreeCall(...) calls and has compact_cache(cache, source_BD, "
      "start_B) (decode protocol, parts (e) and (f), in specsamp.sampling.model_protocol)."
    )


def check_same_vocabulary(target: Any, draft: Any) -> None:
  """Raises a clear error unless draft and target share one vocabulary size."""
  if target.vocab_size != draft.vocab_size:
    hint = ""
    if draft.vocab_size < target.vocab_size:
      hint = (
        " If the two differ only by padding rows of an embedding (e.g. Qwen2.5-0.5B's 151,936 "
        "against Qwen2.5-72B's 152,064, both over the same 151,665 tokens), wrap the draft in "
        "model_protocol.PaddedVocabulary(draft, target.vocab_size, real_vocab_size=...)."
      )
    raise ValueError(
      f"The draft's vocabulary ({draft.vocab_size}) differs from the target's "
      f"({target.vocab_size}); speculative sampling compares token ids, so both models need "
      f"one shared vocabulary (same tokenizer, same embedding size).{hint}"
    )


class PaddedVocabulary(nnx.Module):
  """A draft whose embedding has fewer rows than the target's, over the same real tokens: its
  logits are padded with -inf up to ``vocab_size``, so its q is 0 on the target's padding ids.
  That stays exact (speculative sampling needs only the q a proposal was drawn from; the
  residual max(0, p - q) gives the target's own mass on every id the draft cannot propose).
  A padding id the target emits (its untrained rows keep some probability) is fed to the
  draft as its last id: what the draft then proposes is still drawn from the q it reports.

  Refuses anything but padding: ``real_vocab_size`` (the tokenizer's size) must fit in both
  embeddings, and the draft's must be the smaller one.
  """

  def __init__(self, model: Any, vocab_size: int, *, real_vocab_size: int):
    if not real_vocab_size <= model.vocab_size < vocab_size:
      raise ValueError(
        f"A padded vocabulary needs real_vocab_size <= draft ({model.vocab_size}) < target "
        f"({vocab_size}); got real_vocab_size={real_vocab_size}: the two embeddings must "
        "hold the same real tokens, and differ only in padding rows."
      )
    self.model = model
    self.vocab_size = vocab_size
    self.real_vocab_size = real_vocab_size

  @property
  def config(self) -> Any:
    return self.model.config

  @property
  def accepts_logits_at(self) -> bool:
    return takes_logits_at(self.model)

  def init_cache(self, *args, **kwargs) -> Any:
    return self.model.init_cache(*args, **kwargs)

  def compact_cache(self, *args, **kwargs) -> Any:
    return self.model.compact_cache(*args, **kwargs)

  def __call__(self, tokens_BT: jax.Array, *args, **kwargs) -> ModelOutput:
    tokens_BT = jnp.minimum(tokens_BT, self.model.vocab_size - 1)
    out = output.of(self.model(tokens_BT, *args, **kwargs))
    padding = self.vocab_size - out.logits.shape[-1]
    logits_BTV = jnp.pad(
      out.logits, [(0, 0)] * (out.logits.ndim - 1) + [(0, padding)], constant_values=-jnp.inf
    )
    return ModelOutput(logits_BTV, out.cache, out.features)


def score(
  target: Any,
  tokens_BT: jax.Array,
  positions_BT: jax.Array,
  cache: Any,
  capture_layers: tuple[int, ...] = (),
  **call: Any,
) -> ModelOutput:
  """One call of the target (a scoring call, or the prefill's), as a ``ModelOutput``: with
  ``capture_layers`` (a feature drafter's) its features too (part (g)); without, a plain
  decode-protocol call, so any target serves a drafter that reads no features. ``call``: e.g.
  ``tree=`` (part (e)) or ``logits_at=`` (part (h))."""
  if capture_layers:
    call["capture_layers"] = capture_layers
  return output.of(target(tokens_BT, positions_BT, cache, **call))


def takes_logits_at(model: Any) -> bool:
  """Whether ``model`` implements the decode protocol's optional part (h)."""
  return getattr(model, "accepts_logits_at", False) is True


def has_nan(logits: jax.Array) -> jax.Array:
  """[B] bool: row b of ``logits`` ([B, ..., V]) holds a NaN, a +inf, or a vector over V that is
  -inf throughout. None of them is a distribution (a softmax of them is NaN): float16 overflow
  gives +inf, and a broken weight or an overflowed norm gives any of the three. A -inf entry
  alone is a masked or padded token, and stays allowed."""
  # One reduction: the max over V is NaN with any NaN (XLA's max propagates it), +inf with any
  # +inf, and -inf only when every entry is.
  broken = ~jnp.isfinite(jnp.max(logits, axis=-1))
  return jnp.any(broken, axis=tuple(range(1, broken.ndim)))


def split_model(model: Any) -> tuple[Any, Any]:
  """Splits a model into (static, dynamic): the hashable structure and its arrays."""
  if isinstance(model, nnx.Module):
    return nnx.split(model)
  leaves, treedef = jax.tree.flatten(model)
  return treedef, leaves


def merge_model(static: Any, dynamic: Any) -> Any:
  """Inverse of ``split_model``; call inside jitted code."""
  if isinstance(static, nnx.GraphDef):
    return nnx.merge(static, dynamic)
  return jax.tree.unflatten(static, dynamic)
