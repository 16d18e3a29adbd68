"""What a model call returns: one small type, whatever was asked of the call.

``ModelOutput`` unpacks as the decode protocol's pair, ``logits, cache = model(...)``, and
carries the target's features as an attribute, set only when the call asked for them
(``capture_layers``, decode protocol (g)) and None otherwise. A call never returns a tuple
whose length depends on a keyword. It is a pytree (logits, cache, features), so it crosses jit
boundaries and loop carries like the pair it unpacks as. A user's model may return a plain
``(logits, cache)`` pair; ``of`` reads either.
"""

from __future__ import annotations

from typing import Any

import jax


@jax.tree_util.register_pytree_node_class
class ModelOutput(tuple):
  """(logits_BTV, cache), with ``features`` ([B, T, F] or None) beside them.

  Attributes:
    logits: [B, T, V] the call's logits (``[B, 1, V]`` with ``logits_at``).
    cache: the cache after the call (None for a call made without one).
    features: the hidden states entering the captured layers, concatenated
      ([B, T, C * D]); None unless the call was given ``capture_layers``.
  """

  features: jax.Array | None

  def __new__(cls, logits: jax.Array, cache: Any, features: jax.Array | None = None):
    output = super().__new__(cls, (logits, cache))
    output.features = features
    return output

  @property
  def logits(self) -> jax.Array:
    return self[0]

  @property
  def cache(self) -> Any:
    return self[1]

  def tree_flatten(self):
    return (self[0], self[1], self.features), None

  @classmethod
  def tree_unflatten(cls, aux: None, children) -> ModelOutput:
    del aux
    return cls(*children)

  def __repr__(self) -> str:
    shape = None if self.features is None else self.features.shape
    return f"ModelOutput(logits={self.logits.shape}, features={shape})"


def of(result: Any) -> ModelOutput:
  """A model call's result as a ModelOutput: itself, or a user model's ``(logits, cache)``."""
  if isinstance(result, ModelOutput):
    return result
  logits, cache = result
  return ModelOutput(logits, cache)
