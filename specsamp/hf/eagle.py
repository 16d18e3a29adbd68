r"""Published EAGLE-3 heads (the EAGLE project's format) as specsamp feature heads.

A published EAGLE-3 head (e.g. yuhuili/EAGLE3-LLaMA3.1-Instruct-8B) is a directory with a
``config.json`` and ``model.safetensors`` or ``pytorch_model.bin``:

  fc.weight                                [d, 3d]   the fusion of the captured features, in
                                                     ascending layer order (2, N//2, N-3)
  midlayer.self_attn.{q,k,v}_proj.weight   [H*hd, 2d], [K*hd, 2d]: they read
                                                     concat(norm(embedding), norm(fused))
  midlayer.self_attn.o_proj.weight         [d, H*hd]
  midlayer.mlp.{gate,up,down}_proj.weight  SiLU-gated MLP
  midlayer.input_layernorm.weight          the embedding's norm
  midlayer.hidden_norm.weight              the fused feature's norm
  midlayer.post_attention_layernorm.weight
  norm.weight, lm_head.weight [V_d, d]     the head's own output over V_d draft tokens
  d2t [V_d] int                            an OFFSET: target id = draft id + d2t[draft id]
  t2d [V] bool                             membership of each target id (not needed here)

There is no embedding: the target's is shared. Its RoPE runs at ``rope_theta`` from the config,
10000 when absent, unscaled, whatever the target's RoPE. These are the names and semantics of
the EAGLE project's ``eagle/model/cnets.py`` and ``eagle/traineagle3/cnets.py``, which vLLM's
and SGLang's loaders read the same way.

``load_eagle3`` maps such a head onto ``feature_head.FeatureHead`` and pairs it with its target.
What specsamp's head does not implement is refused by name: a head wider than its target
(``target_hidden_size`` other than ``hidden_size``), an fc bias, ``norm_before_residual``, more
than one layer, an activation other than SiLU, RoPE scaling, attention biases, and tensors it
has no place for. ``save_eagle3`` writes the same format.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specsamp import files, sharding
from specsamp.hf import weights
from specsamp.hf.safetensors_io import SafetensorsFile, write_file
from specsamp.models.feature_head import FeatureDraftModel, FeatureHead, FeatureHeadConfig
from specsamp.training import checkpoint

CONFIG_FILE = "config.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
DEFAULT_ROPE_THETA = 10_000.0  # EAGLE-3 trains its head at this base when the config has none.


# Tensors of a published head that the import reads otherwise or not at all: the maps between
# the vocabularies (d2t is read below; t2d follows from it) and a copy of the target's embedding.
_IGNORED_TENSORS = ("d2t", "t2d", "embed_tokens.weight")


class EagleImportError(ValueError):
  pass


def read_config(directory: str) -> dict[str, Any]:
  path = os.path.join(os.path.expanduser(directory), CONFIG_FILE)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"No {CONFIG_FILE} in {directory}: not an EAGLE-3 head directory.")
  config = files.read_json(path)
  if not isinstance(config, dict):
    raise ValueError(f"{path} is not an EAGLE-3 head's config (a JSON object).")
  return config


def head_config(hf: dict[str, Any], target: Any) -> FeatureHeadConfig:
  """The FeatureHeadConfig of an EAGLE-3 ``config.json`` for ``target``; what specsamp's head
  cannot be is refused by name."""
  t = target.config
  d = hf.get("hidden_size")
  lacking = [
    key for key in ("hidden_size", "num_attention_heads", "intermediate_size") if key not in hf
  ]
  if lacking:
    raise EagleImportError(f"This EAGLE-3 head's config.json lacks {', '.join(lacking)}.")
  rope = dict(hf.get("rope_scaling") or {}, **(hf.get("rope_parameters") or {}))
  scaling = rope.get("rope_type", rope.get("type", "default"))
  checks = [
    (hf.get("num_hidden_layers", 1) == 1, "num_hidden_layers must be 1 (one decoder layer)"),
    (hf.get("hidden_act", "silu") == "silu", "hidden_act must be 'silu'"),
    (not hf.get("bias", False), "an fc bias ('bias': true) is not supported"),
    (not hf.get("norm_before_residual", False), "norm_before_residual is not supported"),
    (
      scaling == "default",
      f"RoPE scaling {scaling!r} is not supported (specsamp's head runs unscaled RoPE)",
    ),
    (not hf.get("attention_bias", False), "attention biases ('attention_bias': true)"),
    (
      d == t.d_model,
      f"hidden_size {d} must equal the target's d_model {t.d_model} (the head shares its "
      "embedding)",
    ),
    (
      hf.get("target_hidden_size", d) == t.d_model,
      f"target_hidden_size {hf.get('target_hidden_size')} must equal the target's d_model "
      f"{t.d_model}",
    ),
    (
      hf.get("vocab_size") == t.vocab_size,
      f"vocab_size {hf.get('vocab_size')} must equal the target's {t.vocab_size}",
    ),
    (t.mlp_activation == "swiglu", "the target must be SiLU-gated (swiglu), as EAGLE-3's head"),
  ]
  refused = [why for ok, why in checks if not ok]
  if refused:
    raise EagleImportError("This EAGLE-3 head cannot be imported: " + "; ".join(refused) + ".")
  layers = hf.get("eagle_config", {}).get("eagle_aux_hidden_state_layer_ids") or ()
  heads = hf["num_attention_heads"]
  return FeatureHeadConfig(
    feature_layers=tuple(layers),
    num_heads=heads,
    num_kv_heads=hf.get("num_key_value_heads", heads),
    head_dim=hf.get("head_dim") or d // heads,
    ffn_dim=hf["intermediate_size"],
    draft_vocab_size=hf.get("draft_vocab_size") or hf["vocab_size"],
    rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", DEFAULT_ROPE_THETA))),
    norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
  ).resolve(t)


def entries(config: FeatureHeadConfig, d: int) -> list[weights.Entry]:
  """Every tensor of an EAGLE-3 head, with its place in ``FeatureHead`` and the transforms."""
  n, k, h, f = config.num_heads, config.num_kv_heads, config.head_dim, config.ffn_dim
  c, v = len(config.feature_layers), config.draft_vocab_size
  same = (weights._identity, weights._identity)
  flip = (weights._transpose, weights._transpose)

  def entry(path, name, shape, transforms):
    return weights.Entry(path, name, shape, *transforms)

  return [
    entry(("fc_FD",), "fc.weight", (d, c * d), flip),
    entry(
      ("q_ENH",),
      "midlayer.self_attn.q_proj.weight",
      (n * h, 2 * d),
      weights._split_out(2 * d, n, h),
    ),
    entry(
      ("k_EKH",),
      "midlayer.self_attn.k_proj.weight",
      (k * h, 2 * d),
      weights._split_out(2 * d, k, h),
    ),
    entry(
      ("v_EKH",),
      "midlayer.self_attn.v_proj.weight",
      (k * h, 2 * d),
      weights._split_out(2 * d, k, h),
    ),
    entry(("o_NHD",), "midlayer.self_attn.o_proj.weight", (d, n * h), weights._split_in(n, h, d)),
    entry(("mlp", "gate_DF"), "midlayer.mlp.gate_proj.weight", (f, d), flip),
    entry(("mlp", "up_DF"), "midlayer.mlp.up_proj.weight", (f, d), flip),
    entry(("mlp", "down_FD"), "midlayer.mlp.down_proj.weight", (d, f), flip),
    entry(("embed_norm", "scale_D"), "midlayer.input_layernorm.weight", (d,), same),
    entry(("feature_norm", "scale_D"), "midlayer.hidden_norm.weight", (d,), same),
    entry(("mlp_norm", "scale_D"), "midlayer.post_attention_layernorm.weight", (d,), same),
    entry(("out_norm", "scale_D"), "norm.weight", (d,), same),
    entry(("out_DW",), "lm_head.weight", (v, d), flip),
  ]


def _read_tensors(directory: str) -> dict[str, np.ndarray]:
  directory = os.path.expanduser(directory)
  safetensors, torch_file = (os.path.join(directory, name) for name in WEIGHT_FILES)
  if os.path.isfile(safetensors):
    file = SafetensorsFile(safetensors)
    return {name: file.tensor(name) for name in file.keys()}
  if os.path.isfile(torch_file):
    try:
      import torch
    except ImportError as error:
      raise EagleImportError(
        f"{torch_file} is a PyTorch pickle; reading it needs torch (pip install -e '.[hf]'), "
        "or convert it to model.safetensors."
      ) from error
    state = torch.load(torch_file, map_location="cpu", weights_only=True)
    return {
      name: value.float().numpy() if value.is_floating_point() else value.numpy()
      for name, value in state.items()
    }
  raise FileNotFoundError(f"No {' or '.join(WEIGHT_FILES)} in {directory}.")


def load_eagle3(
  directory: str, target: Any, mesh: jax.sharding.Mesh | None = None
) -> FeatureDraftModel:
  """The EAGLE-3 head in ``directory`` as a feature head on ``target`` (module docstring)."""
  config = head_config(read_config(directory), target)
  tensors = _read_tensors(directory)
  d = target.config.d_model
  abstract = sharding.abstract_model(
    lambda rngs: FeatureHead(config, target.config, rngs=rngs), mesh or checkpoint.default_mesh()
  )
  known = {e.hf_name for e in entries(config, d)} | set(_IGNORED_TENSORS)
  unexpected = sorted(
    name for name in set(tensors) - known if not name.endswith(weights.IGNORED_SUFFIXES)
  )
  if unexpected:
    raise EagleImportError(
      f"{directory} holds tensors specsamp's head has no place for: {unexpected[:4]} (a bias, "
      "another layer: a head of another architecture than its config.json says)."
    )
  params: dict = {}
  for e in entries(config, d):
    if e.hf_name not in tensors:
      raise EagleImportError(f"{directory} lacks {e.hf_name} (shape {list(e.hf_shape)}).")
    array = np.asarray(tensors[e.hf_name])
    if array.shape != e.hf_shape:
      raise EagleImportError(
        f"{e.hf_name} has shape {list(array.shape)}; this head's config needs {list(e.hf_shape)}."
      )
    node = params
    for key in e.path[:-1]:
      node = node.setdefault(key, {})
    node[e.path[-1]] = e.to_ours(array)
  vocab = config.draft_vocab_size
  if "d2t" in tensors:
    mapping = np.arange(vocab) + np.asarray(tensors["d2t"]).astype(np.int64)
  elif vocab == target.vocab_size:
    mapping = np.arange(vocab)
  else:
    raise EagleImportError(f"{directory} has a draft vocabulary of {vocab} tokens but no d2t map.")
  if mapping.shape != (vocab,) or mapping.min() < 0 or mapping.max() >= target.vocab_size:
    raise EagleImportError(f"d2t maps draft ids outside the target's {target.vocab_size} tokens.")
  if len(np.unique(mapping)) != vocab:
    raise EagleImportError("d2t maps two draft ids to one target id.")
  params["draft_to_target"] = mapping.astype(np.int32)
  dtype = jnp.dtype(target.config.param_dtype)
  placed = jax.tree.map(
    lambda shape, sharding_, value: jax.device_put(
      np.asarray(value).astype(shape.dtype if shape.dtype != jnp.float32 else dtype), sharding_
    ),
    abstract.shapes,
    abstract.shardings,
    params,
  )
  return FeatureDraftModel(abstract.merge(placed), target)


def save_eagle3(model: FeatureDraftModel, directory: str) -> None:
  """Writes ``model``'s head in the EAGLE-3 format (config.json + model.safetensors)."""
  head, target = model.head, model.target
  config, t = head.config, target.config
  if not config.draft_vocab_size:
    raise EagleImportError("An EAGLE-3 head has its own output head: draft_vocab_size must be > 0.")
  # What an EAGLE-3 config.json cannot say is refused, not dropped (2026-11-30's review): its
  # layer is a Llama layer (SiLU-gated MLP; over a plain GELU target the gate is missing), and
  # a head on the target's scaled RoPE (rope_theta 0) was written as unscaled, and reloaded so.
  if t.mlp_activation != "swiglu":
    raise EagleImportError(
      f"An EAGLE-3 head is a Llama layer (SiLU-gated MLP); this one runs the target's "
      f"{t.mlp_activation!r} MLP and has no EAGLE-3 form."
    )
  if not config.rope_theta and t.rope_scaling != "none":
    raise EagleImportError(
      f"This head runs the target's {t.rope_scaling!r}-scaled RoPE, which an EAGLE-3 "
      "config.json does not carry (load_eagle3 refuses scaling too): give the head a "
      "rope_theta of its own to save it."
    )
  d = t.d_model
  state = {}
  for e in entries(config, d):
    value = head
    for key in e.path:
      value = getattr(value, key)
    state[e.hf_name] = np.asarray(e.to_hf(np.asarray(value[...], np.float32)))
  mapping = np.asarray(head.draft_to_target[...], np.int64)
  state["d2t"] = mapping - np.arange(len(mapping))
  t2d = np.zeros(t.vocab_size, bool)
  t2d[mapping] = True
  state["t2d"] = t2d
  os.makedirs(directory, exist_ok=True)
  write_file(os.path.join(directory, WEIGHT_FILES[0]), state)
  hf = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "model_type": "llama",  # What AutoConfig (vLLM, SGLang) reads a published head by.
    "tie_word_embeddings": False,
    "max_position_embeddings": t.max_position or 2048,
    "hidden_size": d,
    "intermediate_size": config.ffn_dim,
    "num_attention_heads": config.num_heads,
    "num_key_value_heads": config.num_kv_heads,
    "head_dim": config.head_dim,
    "num_hidden_layers": 1,
    "hidden_act": "silu",
    "rms_norm_eps": config.norm_eps,
    "rope_theta": config.rope_theta or t.rope_theta,
    "vocab_size": t.vocab_size,
    "draft_vocab_size": config.draft_vocab_size,
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(config.feature_layers)},
  }
  with open(os.path.join(directory, CONFIG_FILE), "w") as f:
    json.dump(hf, f, indent=2)
