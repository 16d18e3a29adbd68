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
  qwen3    llama + RMSNorm on each query and key head (q_norm / k_norm)
  gemma3_text  gemma2 + q/k norm, sliding windows on 5 layers of every 6 (``layer_types`` or
           ``sliding_window_pattern``), a RoPE base of their own for the sliding layers
           (``rope_local_base_freq``) and RoPE scaling on the global layers only
  phi3     llama with q/k/v fused into ``qkv_proj`` and gate/up into ``gate_up_proj`` (split
           on import, joined again on export with ``model_type='phi3'``); a sliding window
           on every layer when set. LongRoPE (Phi-3 128k) and partial rotary dimensions
           (Phi-4-mini) are refused by name.
  qwen3_moe    qwen3 with every MLP a routed mixture of experts (top-k softmax routing,
           ``norm_topk_prob``); dense layers between sparse ones (``mlp_only_layers``,
           ``decoder_sparse_step`` > 1) are refused

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

from specsamp.models.config import DTYPES, NOT_IDENTITY_FIELDS, TransformerConfig

SUPPORTED_MODEL_TYPES = (
  "llama",
  "mistral",
  "qwen2",
  "arcee",
  "gemma",
  "gemma2",
  "qwen3",
  "gemma3_text",
  "phi3",
  "qwen3_moe",
)
_GEMMA = ("gemma", "gemma2", "gemma3_text")
_SANDWICH = ("gemma2", "gemma3_text")  # Norms after each branch, query_pre_attn_scalar.
_QWEN = ("qwen2", "qwen3", "qwen3_moe")  # Windows only with use_sliding_window.
_ARCHITECTURE_CLASS = {
  "llama": "LlamaForCausalLM",
  "mistral": "MistralForCausalLM",
  "qwen2": "Qwen2ForCausalLM",
  "arcee": "ArceeForCausalLM",
  "gemma": "GemmaForCausalLM",
  "gemma2": "Gemma2ForCausalLM",
  "qwen3": "Qwen3ForCausalLM",
  "gemma3_text": "Gemma3ForCausalLM",
  "phi3": "Phi3ForCausalLM",
  "qwen3_moe": "Qwen3MoeForCausalLM",
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


def read_config(path: str) -> dict[str, Any]:
  """The config.json of a Hugging Face model directory, or a config.json file itself (a
  published model's shapes, e.g. configs/hf/llama-3.1-8b/config.json), as a dict."""
  path = os.path.expanduser(path)
  if os.path.isdir(path) or not os.path.exists(path):
    directory, path = path, os.path.join(path, "config.json")
    if not os.path.exists(path):
      raise FileNotFoundError(f"No config.json in {directory}: not a Hugging Face model directory.")
  try:
    with open(path) as f:
      config = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as error:
    raise ValueError(f"{path} is not valid JSON: {error}.") from None
  if not isinstance(config, dict):
    raise ValueError(f"{path} is not a Hugging Face config (a JSON object).")
  return config


def _require(fields: Mapping[str, Any], keys: tuple[str, ...], what: str) -> None:
  """Refuses ``fields`` that lack any of ``keys``, naming them (a KeyError from deep inside
  the import named only the key)."""
  lacking = [key for key in keys if fields.get(key) is None]
  if lacking:
    raise ValueError(f"config.json lacks {', '.join(lacking)}, which {what} needs.")


def checkpoint_dtype(hf: Mapping[str, Any]) -> str | None:
  """The dtype the config says the weights are stored in ('dtype', older 'torch_dtype')."""
  name = hf.get("dtype") or hf.get("torch_dtype")
  return _TORCH_DTYPES.get(str(name).replace("torch.", "")) if name else None


def _rope_parameters(hf: Mapping[str, Any], model_type: str) -> tuple[dict, dict | None]:
  """(the global layers' RoPE parameters, the sliding layers' or None) from 'rope_parameters'
  (transformers 5; Gemma 3 keys it by layer type) or 'rope_theta' + 'rope_scaling' (+ Gemma 3's
  'rope_local_base_freq')."""
  params = dict(hf.get("rope_parameters") or {})
  scaling = dict(hf.get("rope_scaling") or {})
  if params and scaling:
    # transformers 5 takes a non-empty rope_scaling in place of the whole rope_parameters (its
    # rope_theta too). Model cards tell users to add one to config.json: merged under
    # rope_parameters' rope_type 'default' it was dropped, and the model ran unscaled (logits
    # off by 1.2x their largest, 2026-11-30). A scaling the parameters already hold is fine.
    held = params.get("full_attention", params) if model_type == "gemma3_text" else params
    named = lambda d: {("rope_type" if k == "type" else k): v for k, v in d.items()}
    # The theta transformers then runs: the scaling's, else a top-level rope_theta (else its
    # class default, which no file states): the parameters' must be that one.
    theta = named(scaling).get("rope_theta", hf.get("rope_theta"))
    theta_lost = "rope_theta" in held and theta != held["rope_theta"]
    if theta_lost or any(named(held).get(k) != v for k, v in named(scaling).items()):
      raise ValueError(
        f"config.json has both rope_scaling ({scaling}) and rope_parameters ({params}), which "
        "disagree; transformers 5 uses rope_scaling alone and drops rope_parameters, its "
        "rope_theta too. Write the scaling into rope_parameters (with its rope_theta) and "
        "remove rope_scaling, so that the file says one thing."
      )
  if model_type != "gemma3_text":
    return {"rope_theta": hf.get("rope_theta", 10_000.0), **scaling, **params}, None
  if "full_attention" in params or "sliding_attention" in params:
    full = dict(params.get("full_attention") or {})
    local = dict(params.get("sliding_attention") or {})
  else:
    full = {**scaling, **params}
    local = {"rope_type": "default"}
  full.setdefault("rope_theta", hf.get("rope_theta", 1_000_000.0))
  local.setdefault("rope_theta", hf.get("rope_local_base_freq", 10_000.0))
  return full, local


def _rope(hf: Mapping[str, Any], model_type: str) -> dict[str, Any]:
  """RoPE fields from 'rope_parameters' (transformers 5) or 'rope_theta' + 'rope_scaling'."""
  merged, local = _rope_parameters(hf, model_type)
  partial = merged.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
  if float(partial) != 1.0:
    raise UnsupportedArchitecture(
      f"{model_type} with partial_rotary_factor={partial} (RoPE on part of each head) is not "
      "implemented in specsamp."
    )
  kind = merged.get("rope_type", merged.get("type", "default"))
  fields: dict[str, Any] = {"rope_theta": float(merged["rope_theta"])}
  if local is not None:
    local_kind = local.get("rope_type", local.get("type", "default"))
    if local_kind != "default":
      raise UnsupportedArchitecture(
        f"RoPE scaling {local_kind!r} on the sliding-window layers is not implemented in "
        "specsamp (they take a base of their own, unscaled)."
      )
    fields["rope_local_theta"] = float(local["rope_theta"])
  if kind == "default":
    return fields
  if kind not in ("linear", "llama3"):
    raise UnsupportedArchitecture(
      f"RoPE scaling {kind!r} is not implemented in specsamp (supported: default, linear, llama3)."
    )
  needs = ("factor",)
  if kind == "llama3":
    needs += ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
  _require(merged, needs, f"its {kind!r} RoPE scaling")
  fields.update(rope_scaling=kind, rope_scaling_factor=float(merged["factor"]))
  if kind == "llama3":
    fields.update(
      rope_low_freq_factor=float(merged["low_freq_factor"]),
      rope_high_freq_factor=float(merged["high_freq_factor"]),
      rope_original_max_position=int(merged["original_max_position_embeddings"]),
    )
  return fields


# Which layers slide, as transformers 5 decides it (each family's modeling and configuration
# files): never in llama, arcee and gemma, which ignore a sliding_window in config.json; every
# layer in phi3 and qwen3_moe, which ignore layer_types; by layer_types in mistral (AutoConfig
# reads a mistral config.json with layer_types as Ministral's), qwen2, qwen3, gemma2 and
# gemma3_text, whose default is the family's own (mistral: every layer; qwen: the layers from
# max_window_layers on; gemma2: every second; gemma3: 5 of every sliding_window_pattern = 6).
_NO_WINDOW = ("llama", "arcee", "gemma")
# transformers' (attn_logit_softcapping, final_logit_softcapping) when config.json has no key.
_SOFTCAPS = {"gemma2": (50.0, 30.0), "gemma3_text": (None, None)}
_DEFAULT_WINDOW = 4096  # transformers' sliding_window when config.json has no such key.
_WINDOW_ON_EVERY_LAYER = ("phi3", "qwen3_moe")


def _window(hf: Mapping[str, Any], model_type: str, num_layers: int) -> dict[str, Any]:
  """sliding_window and its layer pattern, read as transformers reads the family's config."""
  # transformers' default when the key is absent (null is no window).
  window = hf.get("sliding_window", None if model_type == "phi3" else _DEFAULT_WINDOW)
  types = hf.get("layer_types")
  if model_type in _NO_WINDOW:
    return {}
  if model_type in _QWEN and not hf.get("use_sliding_window"):
    return {}  # transformers ignores the window (and layer_types' sliding entries) then.
  if window is None and types is None:
    return {}
  if model_type in _WINDOW_ON_EVERY_LAYER:
    return {} if window is None else {"sliding_window": int(window), "sliding_window_pattern": 1}
  if types is None:
    if model_type in _QWEN:
      first = int(hf.get("max_window_layers", 28))
      types = ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
    else:
      every = {"mistral": 1, "gemma2": 2}.get(model_type)
      every = every or int(hf.get("sliding_window_pattern") or 6)
      types = [
        "sliding_attention" if every == 1 or (i + 1) % every else "full_attention"
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
    f"{model_type} with sliding layers {[i for i, s in enumerate(sliding) if s]} of "
    f"{num_layers}: specsamp supports sliding windows on every layer or on all layers but "
    "every P-th."
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
    hint = {
      "gemma3": " Gemma 3 4B and larger are multimodal checkpoints; specsamp imports the text "
      "model, model_type 'gemma3_text' (Gemma 3 1B and 270M).",
      "mixtral": " Its mixture of experts is supported in the qwen3_moe form.",
    }.get(model_type, "")
    raise UnsupportedArchitecture(
      f"Hugging Face model_type {model_type!r} (architectures {archs}) is not supported; "
      f"specsamp imports {', '.join(SUPPORTED_MODEL_TYPES)}.{hint}"
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
  # As transformers 5 reads it: Gemma 2/3's MLP reads hidden_activation alone, Gemma's
  # hidden_act, both defaulting to the tanh GELU (a Gemma without the key ran SwiGLU, and a
  # Gemma 2 with hidden_act 'gelu' alone an exact GELU, until 2026-11-30).
  if model_type in _SANDWICH:
    act_name = hf.get("hidden_activation") or "gelu_pytorch_tanh"
  else:
    default_act = {"arcee": "relu2", "gemma": "gelu_pytorch_tanh"}.get(model_type, "silu")
    act_name = hf.get("hidden_act") or default_act
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

  shapes = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
  if model_type == "qwen3_moe":
    shapes += ("moe_intermediate_size", "num_experts_per_tok")
    if hf.get("num_experts") is None:
      shapes += ("num_local_experts",)
  else:
    shapes += ("intermediate_size",)
  _require(hf, shapes, f"a {model_type} model")
  stored = checkpoint_dtype(hf) or "float32"
  param_dtype = param_dtype or stored
  for name, value in (("param_dtype", param_dtype), ("dtype", dtype)):
    if value is not None and value not in DTYPES:
      raise ValueError(f"{name} must be one of {DTYPES}, got {value!r}.")
  num_heads = int(hf["num_attention_heads"])
  num_layers = int(hf["num_hidden_layers"])
  gemma = model_type in _GEMMA
  # transformers' default where config.json leaves head_dim out: Gemma's 256 and Qwen3's 128
  # (hidden / heads was read, and the import failed on the weights' shapes), else hidden / heads.
  default_head_dim = {"qwen3": 128, **dict.fromkeys(_GEMMA, 256)}.get(model_type)
  head_dim = int(hf.get("head_dim") or default_head_dim or int(hf["hidden_size"]) // num_heads)
  ffn_dim = int(hf.get("intermediate_size") or 0)
  moe: dict[str, Any] = {}
  if model_type == "qwen3_moe":
    _refuse(bool(hf.get("mlp_only_layers")), model_type, "dense mlp_only_layers")
    _refuse(int(hf.get("decoder_sparse_step", 1)) != 1, model_type, "decoder_sparse_step != 1")
    _refuse(
      bool(hf.get("shared_expert_intermediate_size")), model_type, "shared experts (qwen2_moe's)"
    )
    ffn_dim = int(hf["moe_intermediate_size"])
    moe = dict(
      num_experts=int(hf.get("num_experts") or hf["num_local_experts"]),
      experts_per_token=int(hf["num_experts_per_tok"]),
      normalize_expert_weights=bool(hf.get("norm_topk_prob", False)),
    )
  fields: dict[str, Any] = dict(
    vocab_size=int(hf["vocab_size"]),
    num_layers=num_layers,
    d_model=int(hf["hidden_size"]),
    num_heads=num_heads,
    num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
    ffn_dim=ffn_dim,
    head_dim=head_dim if head_dim != int(hf["hidden_size"]) // num_heads else None,
    mlp_activation=activation,
    gelu_approximate=approximate,
    norm_eps=float(hf.get("rms_norm_eps", 1e-5 if model_type in ("phi3", "arcee") else 1e-6)),
    norm_plus_one=gemma,
    scale_embeddings=gemma,
    qkv_bias=model_type == "qwen2",
    tie_embeddings=bool(hf.get("tie_word_embeddings", gemma)),
    max_position=int(hf["max_position_embeddings"]) if hf.get("max_position_embeddings") else None,
    param_dtype=param_dtype,
    dtype=dtype or param_dtype,
    tensor_parallel=tensor_parallel,
    qk_norm=model_type in ("qwen3", "qwen3_moe", "gemma3_text"),
    **moe,
    **_rope(hf, model_type),
    **_window(hf, model_type, num_layers),
  )
  if fields.get("rope_local_theta") is not None and "sliding_window" not in fields:
    del fields["rope_local_theta"]  # No sliding layers: every layer is a global one.
  if model_type in _SANDWICH:
    fields.update(
      post_norms=True,
      # An absent key reads as transformers' default for the family (null: none).
      query_pre_attn_scalar=float(hf.get("query_pre_attn_scalar", 256) or head_dim),
      attn_logit_softcap=hf.get("attn_logit_softcapping", _SOFTCAPS[model_type][0]),
      final_logit_softcap=hf.get("final_logit_softcapping", _SOFTCAPS[model_type][1]),
    )
  return TransformerConfig(**fields)


def model_type_of(config: TransformerConfig) -> str:
  """The HF model_type that expresses ``config`` (checked by a round trip in ``to_hf``)."""
  if config.num_experts:
    return "qwen3_moe"
  if config.post_norms:
    return "gemma3_text" if config.qk_norm else "gemma2"
  if config.qk_norm:
    return "qwen3"
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
  model_type: str | None = None,
) -> dict[str, Any]:
  """The HF config.json dict of ``config``; refuses configs no supported type expresses exactly.

  Args:
    config: the model.
    dtype: the dtype the exported weights are stored in (default param_dtype).
    special_ids: bos/eos/pad token ids to record (``bos_token_id`` etc.).
    model_type: the HF type to write (default ``model_type_of(config)``), e.g. 'phi3'.
  """
  model_type = model_type or model_type_of(config)
  if model_type not in SUPPORTED_MODEL_TYPES:
    raise UnsupportedArchitecture(
      f"Cannot export as model_type {model_type!r}; specsamp writes {SUPPORTED_MODEL_TYPES}."
    )
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
    ("hidden_activation" if model_type in _SANDWICH else "hidden_act"): act,
    "rms_norm_eps": config.norm_eps,
    "tie_word_embeddings": config.tie_embeddings,
    "rope_parameters": rope,
    # The same scaling in the form transformers 4 and older converters read (transformers 5
    # reads rope_parameters): without it they would run a scaled model unscaled.
    "rope_scaling": None if config.rope_scaling == "none" else dict(rope),
    "rope_theta": config.rope_theta,
    "dtype": dtype or config.param_dtype,
    "attention_bias": config.qkv_bias,
    "mlp_bias": False,
    # The imported model's own; a model specsamp trained records none: its RoPE's scaled
    # range for llama3 scaling, else 8192 (written; the model computes nothing with it).
    "max_position_embeddings": config.max_position
    or (
      int(config.rope_original_max_position * config.rope_scaling_factor)
      if config.rope_scaling == "llama3"
      else 8192
    ),
  }
  hf["sliding_window"] = None  # Explicitly: an absent key reads as 4096 in most families.
  if config.sliding_window is not None:
    hf["sliding_window"] = config.sliding_window
    hf["layer_types"] = [
      "sliding_attention" if config.layer_window(i) else "full_attention"
      for i in range(config.num_layers)
    ]
    if model_type in _QWEN:
      hf["use_sliding_window"] = True
  elif model_type in ("gemma2", "gemma3_text"):
    # Without layer_types transformers lays out sliding layers by default (every second, 5 of
    # 6) and, with a null window, cannot run them: every layer a full one, said so. Its forward
    # builds the sliding mask all the same and needs a window for it, which no layer uses.
    hf["layer_types"] = ["full_attention"] * config.num_layers
    hf["sliding_window"] = _DEFAULT_WINDOW
  if model_type in _SANDWICH:
    scalar = config.query_pre_attn_scalar
    hf.update(
      query_pre_attn_scalar=int(scalar) if float(scalar).is_integer() else scalar,
      attn_logit_softcapping=config.attn_logit_softcap,
      final_logit_softcapping=config.final_logit_softcap,
    )
  if model_type == "gemma3_text":  # Per layer type (transformers 5's form).
    local = {"rope_type": "default", "rope_theta": config.rope_local_theta or config.rope_theta}
    hf["rope_parameters"] = {"full_attention": rope, "sliding_attention": local}
    del hf["rope_theta"]
  if model_type == "qwen3_moe":
    hf.update(
      num_experts=config.num_experts,
      num_experts_per_tok=config.experts_per_token,
      norm_topk_prob=config.normalize_expert_weights,
      moe_intermediate_size=config.ffn_dim,
      decoder_sparse_step=1,
      mlp_only_layers=[],
    )
  # No pad id unless the tokenizer gives one: a family's default (Phi-3's 32000) may lie
  # outside the vocabulary, which transformers refuses as the embedding's padding_idx.
  hf["pad_token_id"] = None
  # Nor bos / eos: a family's defaults (Arcee's 128000 / 128001) may be no token of this model.
  hf["bos_token_id"] = hf["eos_token_id"] = None
  hf.update({key: value for key, value in (special_ids or {}).items() if value is not None})
  # How the model runs (its layers scanned or unrolled, ...) and what it only says about itself
  # (max_position, which the export writes a value for even when it is None) need no match.
  kept = {name: getattr(config, name) for name in NOT_IDENTITY_FIELDS}
  back = from_hf(hf, param_dtype=config.param_dtype).replace(**kept)
  if back.resolved_head_dim == config.resolved_head_dim:
    # head_dim written out where it is d_model // num_heads (the paper's 70B config) is the
    # same model, which from_hf reads back as None: refused as another model (2026-11-30).
    back = back.replace(head_dim=config.head_dim)
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
