"""keras-hub on the JAX backend, driven on specsamp's exported weights as its users drive it.

keras-hub 0.32.0 (``keras_hub.samplers``) samples inside one ``ops.while_loop``:
``GreedySampler``, ``RandomSampler`` and ``TopPSampler`` autoregressively, and
``SpeculativeSampler`` speculatively. Its ``generate()`` wires SpeculativeSampler
only for Gemma 4 with its MTP assistant (``Gemma4CausalLM.generate_step`` builds
``draft_next`` and ``verify_next``); a separate draft model has no wiring yet.
``speculative_lm`` gives ``LlamaCausalLM`` the same wiring for a separate Llama draft,
in the sampler's documented call contract:

  draft_next(prompt, draft_cache, index)   one draft step on the token at index - 1
                                           (the draft's own KV cache, as ``next``)
  verify_next(prompt, cache, index, k)     one target call on the k + 1 tokens at
                                           index - 1 .. index + k - 1, the start clamped
                                           so the window stays in the buffer (as Gemma 4's)

Everything else (drafting, acceptance, the bonus token, the loop) is keras-hub's own code.
``generate()`` (compiled by keras) is what the timing runs; ``batched_runner`` vmaps the same
``generate_step`` over independent runs with their own seeds, for the exactness test.

keras must run on the JAX backend: KERAS_BACKEND is set to "jax" here when unset, which only
takes effect before keras is first imported. Install (no TensorFlow needed on JAX):
  pip install --no-deps keras==3.15.1 keras-hub==0.32.0 optree==0.20.0 namex==0.1.0
(tokenizers and regex, which keras-hub imports, come with the hf extra's transformers).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

os.environ.setdefault("KERAS_BACKEND", "jax")

INSTALL = "pip install --no-deps keras==3.15.1 keras-hub==0.32.0 optree==0.20.0 namex==0.1.0"


def modules() -> tuple[Any, Any]:
  """(keras, keras_hub), checked to run on the JAX backend."""
  try:
    import keras
    import keras_hub
  except ImportError as error:
    raise ImportError(f"The keras-hub comparison needs keras and keras-hub: {INSTALL}.") from error
  if keras.config.backend() != "jax":
    raise RuntimeError(
      f"keras runs on the {keras.config.backend()!r} backend; the comparison needs 'jax'. Set "
      "KERAS_BACKEND=jax before anything imports keras."
    )
  return keras, keras_hub


def load_causal_lm(directory: str) -> Any:
  """keras-hub's ``LlamaCausalLM`` from an HF-format directory (``Backbone.from_preset``, which
  converts a Llama checkpoint through keras-hub's transformers converter), without a
  preprocessor: inputs are token ids."""
  _, keras_hub = modules()
  if not os.path.isfile(os.path.join(directory, "config.json")):
    raise FileNotFoundError(
      f"No HF model in {directory} (config.json missing); write one with "
      "specsamp.hf.export_model or scripts/export_hf.py."
    )
  backbone = keras_hub.models.Backbone.from_preset(directory)
  if not isinstance(backbone, keras_hub.models.LlamaBackbone):
    raise ValueError(
      f"{directory} loads as {type(backbone).__name__} in keras-hub; the comparison drives "
      "LlamaCausalLM (export a model with SwiGLU MLP, no biases, no soft-caps: HF 'llama')."
    )
  return keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)


def logits(lm: Any, tokens_BT: np.ndarray) -> np.ndarray:
  """[B, T, V] logits of keras-hub's backbone on ``tokens_BT`` (a full causal pass)."""
  hidden = lm.backbone({"token_ids": tokens_BT, "padding_mask": np.ones_like(tokens_BT)})
  return np.asarray(lm.backbone.token_embedding(hidden, reverse=True))


def make_sampler(
  temperature: float, top_p: float, num_draft_tokens: int | None, seed: int = 0
) -> Any:
  """keras-hub's sampler for a mode, as its users build one: GreedySampler (T = 0),
  RandomSampler (T > 0, top-p 1) or TopPSampler; with ``num_draft_tokens``, a
  SpeculativeSampler with that one as ``base_sampler`` (None for greedy) and the same
  temperature, as ``Gemma4CausalLM.generate`` builds it."""
  _, keras_hub = modules()
  samplers = keras_hub.samplers
  if temperature == 0:
    base = None if num_draft_tokens else samplers.GreedySampler()
  elif top_p >= 1:
    base = samplers.RandomSampler(temperature=temperature, seed=seed)
  else:
    base = samplers.TopPSampler(p=top_p, temperature=temperature, seed=seed)
  if not num_draft_tokens:
    return base
  return samplers.SpeculativeSampler(
    num_speculative_tokens=num_draft_tokens,
    base_sampler=base,
    temperature=temperature if temperature > 0 else 1.0,
    seed=seed,
  )


@functools.cache
def _speculative_class() -> type:
  keras, keras_hub = modules()
  ops = keras.ops

  class SpeculativeLlamaCausalLM(keras_hub.models.LlamaCausalLM):
    """LlamaCausalLM whose generate_step hands SpeculativeSampler a separate Llama draft."""

    def __init__(self, backbone, draft, **kwargs):
      super().__init__(backbone=backbone, preprocessor=None, **kwargs)
      self.draft = draft  # A LlamaCausalLM; tracked, so its weights are jit arguments too.
      self.verify_calls = None  # Set to a list to count target verify calls (host callback).

    def _count(self):
      if self.verify_calls is not None:
        self.verify_calls.append(1)

    def generate_step(self, inputs, stop_token_ids=None):
      token_ids, padding_mask = inputs["token_ids"], inputs["padding_mask"]
      _, cache = self._build_cache(token_ids)
      _, draft_cache = self.draft._build_cache(token_ids)
      index = ops.min(ops.sum(ops.cast(padding_mask, "int32"), axis=-1))

      def one_step(lm):
        def step(prompt, cache, index):  # As LlamaCausalLM.generate_step's `next`.
          batch = ops.shape(prompt)[0]
          token = ops.slice(prompt, [0, index - 1], [batch, 1])
          logits, hidden, cache = lm.call_with_cache(token, cache, index - 1)
          return ops.squeeze(logits, axis=1), ops.squeeze(hidden, axis=1), cache

        return step

      def verify_next(prompt, cache, index, k):  # As Gemma4CausalLM's, without its extras.
        batch, max_length = ops.shape(prompt)
        start = ops.maximum(0, ops.minimum(index - 1, max_length - k - 1))
        window = ops.slice(prompt, [0, start], [batch, k + 1])
        logits, hidden, cache = self.call_with_cache(window, cache, start)
        if self.verify_calls is not None:
          jax.debug.callback(self._count)
        aligned = ops.minimum(ops.arange(k + 1) + (index - 1 - start), k)
        return ops.take(logits, aligned, axis=1), ops.take(hidden, aligned, axis=1), cache

      tokens = self.sampler(
        next=one_step(self),
        prompt=token_ids,
        cache=cache,
        index=index,
        mask=padding_mask,
        stop_token_ids=stop_token_ids,
        model=self,
        draft_next=one_step(self.draft),
        draft_cache=draft_cache,
        verify_next=verify_next,
      )
      return {"token_ids": tokens, "padding_mask": ops.ones_like(tokens, dtype="bool")}

  return SpeculativeLlamaCausalLM


def speculative_lm(target_dir: str, draft_dir: str) -> Any:
  """A LlamaCausalLM of ``target_dir`` that samples with a SpeculativeSampler (set by
  ``compile(sampler=...)``) whose draft is the LlamaCausalLM of ``draft_dir``."""
  target, draft = load_causal_lm(target_dir), load_causal_lm(draft_dir)
  if target.backbone.vocabulary_size != draft.backbone.vocabulary_size:
    raise ValueError(
      f"Target and draft vocabularies differ ({target.backbone.vocabulary_size} vs "
      f"{draft.backbone.vocabulary_size}): speculative sampling needs one vocabulary."
    )
  return _speculative_class()(target.backbone, draft)


def set_sampler(lm: Any, sampler: Any) -> None:
  """Makes ``lm.generate`` sample with ``sampler`` (keras-hub's ``compile(sampler=...)``)."""
  lm.compile(sampler=sampler)


def inputs_of(prompts_BT: np.ndarray, max_new_tokens: int) -> dict[str, np.ndarray]:
  """keras-hub generate inputs: equal-length prompts padded with ``max_new_tokens`` slots."""
  batch, length = prompts_BT.shape
  token_ids = np.zeros((batch, length + max_new_tokens), np.int32)
  token_ids[:, :length] = prompts_BT
  return {
    "token_ids": token_ids,
    "padding_mask": np.broadcast_to(np.arange(token_ids.shape[1]) < length, token_ids.shape),
  }


def generate(lm: Any, prompts_BT: np.ndarray, max_new_tokens: int) -> np.ndarray:
  """[B, max_new_tokens] tokens of keras-hub's ``generate`` (compiled by keras on first use)."""
  out = lm.generate(inputs_of(prompts_BT, max_new_tokens), stop_token_ids=None)
  return np.asarray(out["token_ids"])[:, prompts_BT.shape[1] :]


def batched_runner(
  lm: Any, prompts_BT: np.ndarray, max_new_tokens: int
) -> Callable[[np.ndarray], jax.Array]:
  """seeds [I] -> tokens [I, B, max_new_tokens]: I independent runs of ``lm.generate_step``
  (keras-hub's sampling body with ``lm``'s sampler) on ``prompts_BT``, each with its own
  sampler seed, vmapped in one jitted call."""
  keras, _ = modules()
  (seed_variable,) = lm.sampler.variables  # The sampler's one SeedGenerator state.
  variables = lm.trainable_variables + lm.non_trainable_variables
  inputs = {key: jnp.asarray(value) for key, value in inputs_of(prompts_BT, max_new_tokens).items()}

  def one(seed, weights):
    state = jnp.stack([seed, jnp.zeros_like(seed)]).astype(seed_variable.dtype)
    with keras.StatelessScope(state_mapping=[(seed_variable, state), *zip(variables, weights)]):
      out = lm.generate_step(inputs, stop_token_ids=None)
    return out["token_ids"][:, prompts_BT.shape[1] :]

  run = jax.jit(jax.vmap(one, in_axes=(0, None)))
  weights = [v.value for v in variables]
  return lambda seeds: run(jnp.asarray(seeds, jnp.uint32), weights)
