"""Hugging Face ``config.json`` <-> ``TransformerConfig`` for the architectures specsamp runs.

Supported ``model_type``s and what each sets beyond the shared Llama body
(pre-norm RMSNorm, RoPE in the half-split layout, grouped-query attention):

  llama    SwiGLU MLP (also SmolLM, Llama 2 / 3 / 3.1+ with 'llama3' RoPE scaling)
  mistral  llama + a sliding window on every layer
  qwen2    llama + biases on q/k/v
  arcee    llama with a plain (non-gated) MLP: how specsamp's own Chinchilla-
           style models (plain GELU MLP) are expressed in the HF format
  gemma    GeGLU, tied and sqrt(d_model)-scaled embeddings, RMSNorm * (1 + w)
  gemma2   gemma + sandwich norms, query_pre_attn_scalar, logit soft-caps and
           sliding-window attention on alternate layers

Anything else, or a feature of a supported type that specsamp does not
implement (attention output biases, MLP biases, YaRN RoPE, quantized weights),
is refused with ``UnsupportedArchitecture`` naming the field, rather than
imported into a model that would silently compute something else.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from specsamp.models.config import DTYPES, TransformerConfig

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "arcee", "gemma", "gemma2")
_GEMMA = ("gemma", "gemma2")
_ARCHITECTURE_CLASS = {
  "llama": "LlamaForCausalLM",
  "mistral": "MistralForCausalLM",
  "qwen2": "Qwen2ForCausalLM",
  "arcee": "ArceeForCausalLM",
  "gemma": "GemmaForCausalLM",
  "gemma2": "Gemma2ForCausalLM",
}
# HF activation name -> (activation, gelu_approximate); a gated family maps gelu to geglu.
_ACTIVATIONS = {
  "silu": ("swiglu", True),
  "swish": ("swiglu", True),
  "gelu_pytorch_tanh": ("gelu", True),
  "gelu_new": ("gelu", True),
  "gelu_fast": ("gelu", True),
  "gelu": ("gelu", False),
  "relu": ("relu", True),
  "relu2": ("relu2", True),
}
_TORCH_DTYPES = {
  "float32": "float32",
  "bfloat16": "bfloat16",
  "float16": "float16",
  "float64": "float64",
}


class UnsupportedArchitecture(ValueError):
  """A Hugging Face model that specsamp cannot run exactly."""


def read_config(directory: str) -> dict[str, Any]:
  path = os.path.join(directory, "config.json")
  if not os.path.exists(path):
    raise FileNotFoundError(f"No config.json in {directory}: not a Hugging Face model directory.")
  with open(path) as f:
    return json.load(f)


def checkpoint_dtype(hf: Mapping[str, Any]) -> str | None:
  """The dtype the config says the weights are stored in ('dtype', older 'torch_dtype')."""
  name = hf.get("dtype") or hf.get("torch_dtype")
  return _TORCH_DTYPES.get(str(name).replace("torch.", "")) if name else None


def _rope(hf: Mapping[str, Any]) -> dict[str, Any]:
  """RoPE fields from 'rope_parameters' (transformers 5) or 'rope_theta' + 'rope_scaling'."""
  params = dict(hf.get("rope_parameters") or {})
  scaling = dict(hf.get("rope_scaling") or {})
  theta = params.get("rope_theta", hf.get("rope_theta", 10_000.0))
  merged = {**scaling, **params}
  kind = merged.get("rope_type", merged.get("type", "default"))
  fields: dict[str, Any] = {"rope_theta": float(theta)}
  if kind == "default":
    return fields
  if kind not in ("linear", "llama3"):
    raise UnsupportedArchitecture(
      f"RoPE scaling {kind!r} is not implemented in specsamp (supported: default, linear, llama3)."
    )
  fields.update(rope_scaling=kind, rope_scaling_factor=float(merged["factor"]))
  if kind == "llama3":
    fields.update(
      rope_low_freq_factor=float(merged["low_freq_factor"]),
      rope_high_freq_factor=float(merged["high_freq_factor"]),
      rope_original_max_position=int(merged["original_max_position_embeddings"]),
    )
  return fields


def _window(hf: Mapping[str, Any], model_type: str, num_layers: int) -> dict[str, Any]:
  """sliding_window and its layer pattern from 'layer_types' (or the family's default)."""
  window = hf.get("sliding_window")
  types = hf.get("layer_types")
  if types is None:
    if window is None or (model_type == "qwen2" and not hf.get("use_sliding_window")):
      return {}
    if model_type == "qwen2":
      raise UnsupportedArchitecture(
        "qwen2 with use_sliding_window=true and no layer_types: "
        "specsamp cannot tell which layers slide."
      )
    types = [
      "sliding_attention" if model_type == "mistral" or (i + 1) % 2 else "full_attention"
      for i in range(num_layers)
    ]
  unknown = sorted(set(types) - {"sliding_attention", "full_attention"})
  if unknown or len(types) != num_layers:
    raise UnsupportedArchitecture(
      f"layer_types {types} is not one entry of sliding_attention / full_attention per layer."
    )
  sliding = [kind == "sliding_attention" for kind in types]
  if not any(sliding):
    return {}
  if window is None:
    raise UnsupportedArchitecture("layer_types has sliding layers but sliding_window is null.")
  for pattern in range(1, num_layers + 2):
    if all(s == (pattern == 1 or (i + 1) % pattern != 0) for i, s in enumerate(sliding)):
      return {"sliding_window": int(window), "sliding_window_pattern": pattern}
  raise UnsupportedArchitecture(
    f"layer_types {types}: specsamp supports sliding windows on every layer or on all layers "
    "but every P-th."
  )


def _refuse(condition: bool, model_type: str, what: str) -> None:
  if condition:
    raise UnsupportedArchitecture(f"{model_type} with {what} is not supported by specsamp.")


def from_hf(
  hf: Mapping[str, Any],
  *,
  param_dtype: str | None = None,
  dtype: str | None = None,
  tensor_parallel: str = "auto",
) -> TransformerConfig:
  """The TransformerConfig of an HF config.json dict.

  Args:
    hf: the parsed config.json.
    param_dtype: dtype to hold the weights in; default the checkpoint's.
    dtype: activation dtype; default ``param_dtype``.
    tensor_parallel: 'auto' or 'shard_map' (see TransformerConfig).
  """
  model_type = hf.get("model_type")
  if model_type not in SUPPORTED_MODEL_TYPES:
    archs = hf.get("architectures")
    raise UnsupportedArchitecture(
      f"Hugging Face model_type {model_type!r} (architectures {archs}) is not supported; "
      f"specsamp imports {', '.join(SUPPORTED_MODEL_TYPES)}."
    )
  if hf.get("quantization_config"):
    raise UnsupportedArchitecture(
      f"The checkpoint is quantized ({hf['quantization_config'].get('quant_method', '?')}); "
      "specsamp imports float weights (float32, bfloat16 or float16) only."
    )
  _refuse(bool(hf.get("mlp_bias")), model_type, "mlp_bias=true")
  _refuse(
    bool(hf.get("attention_bias")) and model_type != "qwen2",
    model_type,
    "attention_bias=true (biases on every projection)",
  )
  _refuse(
    bool(hf.get("use_bidirectional_attention")), model_type, "use_bidirectional_attention=true"
  )
  if model_type == "gemma2":
    act_name = hf.get("hidden_activation") or hf.get("hidden_act")
  else:
    act_name = hf.get("hidden_act", "silu")
    if model_type == "gemma" and act_name == "gelu":
      act_name = "gelu_pytorch_tanh"  # Gemma's legacy value; transformers maps it so too.
  if act_name not in _ACTIVATIONS:
    raise UnsupportedArchitecture(
      f"{model_type} with hidden activation {act_name!r} is not "
      f"supported (known: {sorted(_ACTIVATIONS)})."
    )
  activation, approximate = _ACTIVATIONS[act_name]
  if model_type != "arcee":  # Every other supported family has a gated MLP.
    if activation not in ("swiglu", "gelu"):
      raise UnsupportedArchitecture(f"{model_type} with a gated {act_name!r} MLP is not supported.")
    activation = "swiglu" if activation == "swiglu" else "geglu"
  elif activation == "swiglu":
    raise UnsupportedArchitecture("arcee with a plain silu MLP is not supported.")

  stored = checkpoint_dtype(hf) or "float32"
  param_dtype = param_dtype or stored
  for name, value in (("param_dtype", param_dtype), ("dtype", dtype)):
    if value is not None and value not in DTYPES:
      raise ValueError(f"{name} must be one of {DTYPES}, got {value!r}.")
  num_heads = int(hf["num_attention_heads"])
  num_layers = int(hf["num_hidden_layers"])
  gemma = model_type in _GEMMA
  head_dim = int(hf.get("head_dim") or int(hf["hidden_size"]) // num_heads)
  fields: dict[str, Any] = dict(
    vocab_size=int(hf["vocab_size"]),
    num_layers=num_layers,
    d_model=int(hf["hidden_size"]),
    num_heads=num_heads,
    num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
    ffn_dim=int(hf["intermediate_size"]),
    head_dim=head_dim if head_dim != int(hf["hidden_size"]) // num_heads else None,
    mlp_activation=activation,
    gelu_approximate=approximate,
    norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
    norm_plus_one=gemma,
    scale_embeddings=gemma,
    qkv_bias=model_type == "qwen2",
    tie_embeddings=bool(hf.get("tie_word_embeddings", gemma)),
    param_dtype=param_dtype,
    dtype=dtype or param_dtype,
    tensor_parallel=tensor_parallel,
    **_rope(hf),
    **_window(hf, model_type, num_layers),
  )
  if model_type == "gemma2":
    fields.update(
      post_norms=True,
      query_pre_attn_scalar=float(hf.get("query_pre_attn_scalar") or head_dim),
      attn_logit_softcap=hf.get("attn_logit_softcapping"),
      final_logit_softcap=hf.get("final_logit_softcapping"),
    )
  return TransformerConfig(**fields)


def model_type_of(config: TransformerConfig) -> str:
  """The HF model_type that expresses ``config`` (checked by a round trip in ``to_hf``)."""
  if config.post_norms:
    return "gemma2"
  if config.norm_plus_one:
    return "gemma"
  if not config.gated_mlp:
    return "arcee"
  if config.qkv_bias:
    return "qwen2"
  if config.sliding_window is not None:
    return "mistral"
  return "llama"


def to_hf(
  config: TransformerConfig,
  *,
  dtype: str | None = None,
  special_ids: Mapping[str, int | None] | None = None,
) -> dict[str, Any]:
  """The HF config.json dict of ``config``; refuses configs no supported type expresses exactly.

  Args:
    config: the model.
    dtype: the dtype the exported weights are stored in (default param_dtype).
    special_ids: bos/eos/pad token ids to record (``bos_token_id`` etc.).
  """
  model_type = model_type_of(config)
  gated = {"swiglu": "silu", "geglu": "gelu_pytorch_tanh" if config.gelu_approximate else "gelu"}
  plain = {
    "gelu": "gelu_pytorch_tanh" if config.gelu_approximate else "gelu",
    "relu": "relu",
    "relu2": "relu2",
  }
  act = (gated if config.gated_mlp else plain)[config.mlp_activation]
  rope: dict[str, Any] = {
    "rope_type": "default" if config.rope_scaling == "none" else config.rope_scaling,
    "rope_theta": config.rope_theta,
  }
  if config.rope_scaling != "none":
    rope["factor"] = config.rope_scaling_factor
  if config.rope_scaling == "llama3":
    rope.update(
      low_freq_factor=config.rope_low_freq_factor,
      high_freq_factor=config.rope_high_freq_factor,
      original_max_position_embeddings=config.rope_original_max_position,
    )
  hf: dict[str, Any] = {
    "architectures": [_ARCHITECTURE_CLASS[model_type]],
    "model_type": model_type,
    "vocab_size": config.vocab_size,
    "hidden_size": config.d_model,
    "intermediate_size": config.ffn_dim,
    "num_hidden_layers": config.num_layers,
    "num_attention_heads": config.num_heads,
    "num_key_value_heads": config.num_kv_heads,
    "head_dim": config.resolved_head_dim,
    ("hidden_activation" if model_type == "gemma2" else "hidden_act"): act,
    "rms_norm_eps": config.norm_eps,
    "tie_word_embeddings": config.tie_embeddings,
    "rope_parameters": rope,
    "rope_theta": config.rope_theta,
    "dtype": dtype or config.param_dtype,
    "attention_bias": config.qkv_bias,
    "mlp_bias": False,
    "max_position_embeddings": 8192,
  }
  if config.sliding_window is not None:
    hf["sliding_window"] = config.sliding_window
    hf["layer_types"] = [
      "sliding_attention" if config.layer_window(i) else "full_attention"
      for i in range(config.num_layers)
    ]
    if model_type == "qwen2":
      hf["use_sliding_window"] = True
  if model_type == "gemma2":
    scalar = config.query_pre_attn_scalar
    hf.update(
      query_pre_attn_scalar=int(scalar) if float(scalar).is_integer() else scalar,
      attn_logit_softcapping=config.attn_logit_softcap,
      final_logit_softcapping=config.final_logit_softcap,
    )
  hf.update({key: value for key, value in (special_ids or {}).items() if value is not None})
  back = from_hf(
    hf, param_dtype=config.param_dtype, dtype=config.dtype, tensor_parallel=config.tensor_parallel
  )
  if back != config:
    differ = {
      f.name: (getattr(config, f.name), getattr(back, f.name))
      for f in dataclasses.fields(config)
      if getattr(config, f.name) != getattr(back, f.name)
    }
    raise UnsupportedArchitecture(
      f"No Hugging Face architecture specsamp exports expresses this model exactly; as "
      f"{model_type!r} these fields would change (ours, exported): {differ}."
    )
  return hf
