"""The tensor-by-tensor map between HF parameter names/layouts and specsamp's.

HF stores each projection as a torch Linear weight [out, in]; specsamp keeps
einsum-ready layouts with explicit head axes (``q_DNH``, ``o_NHD``). Every
transform here is a transpose and/or a reshape that numpy performs as a VIEW
of the memory-mapped tensor, so slicing one device's shard out of it reads
only that shard's bytes. ``to_hf`` is the exact inverse.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from specsamp.models.config import TransformerConfig

Path = tuple  # Keys into the parameters' pure dict, e.g. ('blocks', 'attn', 'q_DNH').


@dataclasses.dataclass(frozen=True)
class Entry:
  """One HF tensor (or a block of rows of one): where it lives in each format and how to move
  between layouts.

  Attributes:
    path: the parameter in specsamp's pure dict.
    hf_name, hf_shape: the HF tensor and its whole shape.
    to_ours, to_hf: layout transforms (views) of this entry's part of the tensor.
    index: the leading indices of ``path``'s stacked parameter this tensor fills: (layer,)
      for a block's parameter, (layer, expert) for one expert of a mixture of experts, ()
      for an unstacked one.
    rows: (start, stop) when the HF tensor fuses several of ours along its first axis (Phi-3's
      qkv_proj and gate_up_proj): this entry is those rows; None: the whole tensor.
  """

  path: Path
  hf_name: str
  hf_shape: tuple[int, ...]
  to_ours: Callable[[np.ndarray], np.ndarray]
  to_hf: Callable[[np.ndarray], np.ndarray]
  index: tuple[int, ...] = ()
  rows: tuple[int, int] | None = None

  def part(self, stored: np.ndarray) -> np.ndarray:
    """This entry's rows of the stored HF tensor (a view)."""
    return stored if self.rows is None else stored[self.rows[0] : self.rows[1]]


def _identity(x: np.ndarray) -> np.ndarray:
  return x


def _transpose(x: np.ndarray) -> np.ndarray:
  return x.T


def _split_out(*dims: int) -> tuple[Callable, Callable]:
  """HF [out=prod(dims[1:]), in=dims[0]] <-> ours [in, *heads] (q/k/v projections)."""
  d = dims[0]
  return (lambda w: w.T.reshape(dims), lambda a: a.reshape(d, -1).T)


def _split_in(*dims: int) -> tuple[Callable, Callable]:
  """HF [out=dims[-1], in=prod(dims[:-1])] <-> ours [*heads, out] (the output projection)."""
  d = dims[-1]
  return (lambda w: w.T.reshape(dims), lambda a: a.reshape(-1, d).T)


_T = (_transpose, _transpose)  # HF [out, in] <-> ours [in, out].


def _reshape(*dims: int) -> tuple[Callable, Callable]:
  """HF [prod(dims)] <-> ours [*dims] (q/k/v biases)."""
  return (lambda b: b.reshape(dims), lambda a: a.reshape(-1))


def entries(config: TransformerConfig, model_type: str | None = None) -> list[Entry]:
  """Every parameter of a specsamp Transformer with ``config``, in HF order, under the tensor
  names of ``model_type`` (default: the type ``architectures.model_type_of`` gives; 'phi3'
  fuses q/k/v and gate/up into one tensor each)."""
  d, f, v = config.d_model, config.ffn_dim, config.vocab_size
  n, k, h = config.num_heads, config.num_kv_heads, config.resolved_head_dim
  fused = model_type == "phi3"
  out: list[Entry] = [
    Entry(("embedder", "table_VD"), "model.embed_tokens.weight", (v, d), _identity, _identity)
  ]
  # Gemma 2/3's norms after each branch take the pre-MLP norm's HF name; in the
  # other families 'post_attention_layernorm' IS the pre-MLP norm.
  norms = {"attn_norm": "input_layernorm"}
  if config.post_norms:
    norms.update(
      attn_post_norm="post_attention_layernorm",
      mlp_norm="pre_feedforward_layernorm",
      mlp_post_norm="post_feedforward_layernorm",
    )
  else:
    norms["mlp_norm"] = "post_attention_layernorm"
  for layer in range(config.num_layers):
    prefix = f"model.layers.{layer}."

    def add(path, name, shape, transforms, rows=None, expert=None):
      index = (layer,) if expert is None else (layer, expert)
      out.append(Entry(("blocks", *path), prefix + name, shape, *transforms, index, rows))

    q_rows, k_rows = (0, n * h), (n * h, (n + k) * h)
    v_rows = ((n + k) * h, (n + 2 * k) * h)
    if fused:
      qkv = ("self_attn.qkv_proj.weight", ((n + 2 * k) * h, d))
      add(("attn", "q_DNH"), *qkv, _split_out(d, n, h), q_rows)
      add(("attn", "k_DKH"), *qkv, _split_out(d, k, h), k_rows)
      add(("attn", "v_DKH"), *qkv, _split_out(d, k, h), v_rows)
    else:
      add(("attn", "q_DNH"), "self_attn.q_proj.weight", (n * h, d), _split_out(d, n, h))
      add(("attn", "k_DKH"), "self_attn.k_proj.weight", (k * h, d), _split_out(d, k, h))
      add(("attn", "v_DKH"), "self_attn.v_proj.weight", (k * h, d), _split_out(d, k, h))
    if config.qkv_bias:
      add(("attn", "q_NH"), "self_attn.q_proj.bias", (n * h,), _reshape(n, h))
      add(("attn", "k_KH"), "self_attn.k_proj.bias", (k * h,), _reshape(k, h))
      add(("attn", "v_KH"), "self_attn.v_proj.bias", (k * h,), _reshape(k, h))
    add(("attn", "o_NHD"), "self_attn.o_proj.weight", (d, n * h), _split_in(n, h, d))
    if config.qk_norm:
      add(("attn", "q_norm_H"), "self_attn.q_norm.weight", (h,), (_identity, _identity))
      add(("attn", "k_norm_H"), "self_attn.k_norm.weight", (h,), (_identity, _identity))
    if config.num_experts:
      add(("mlp", "router_DE"), "mlp.gate.weight", (config.num_experts, d), _T)
      for e in range(config.num_experts):
        expert = f"mlp.experts.{e}."
        add(("mlp", "gate_EDF"), expert + "gate_proj.weight", (f, d), _T, expert=e)
        add(("mlp", "up_EDF"), expert + "up_proj.weight", (f, d), _T, expert=e)
        add(("mlp", "down_EFD"), expert + "down_proj.weight", (d, f), _T, expert=e)
    elif fused:
      gate_up = ("mlp.gate_up_proj.weight", (2 * f, d))
      add(("mlp", "gate_DF"), *gate_up, _T, (0, f))
      add(("mlp", "up_DF"), *gate_up, _T, (f, 2 * f))
    else:
      if config.gated_mlp:
        add(("mlp", "gate_DF"), "mlp.gate_proj.weight", (f, d), _T)
      add(("mlp", "up_DF"), "mlp.up_proj.weight", (f, d), _T)
    if not config.num_experts:
      add(("mlp", "down_FD"), "mlp.down_proj.weight", (d, f), _T)
    for ours, theirs in norms.items():
      add((ours, "scale_D"), f"{theirs}.weight", (d,), (_identity, _identity))
  out.append(Entry(("final_norm", "scale_D"), "model.norm.weight", (d,), _identity, _identity))
  if not config.tie_embeddings:
    out.append(Entry(("head", "w_DV"), "lm_head.weight", (v, d), _transpose, _transpose))
  return out


def joined(parts: list[tuple[Entry, np.ndarray]]) -> np.ndarray:
  """An HF tensor from its entries' parts in HF layout (rows concatenated when fused)."""
  if len(parts) == 1 and parts[0][0].rows is None:
    return parts[0][1]
  ordered = sorted(parts, key=lambda part: part[0].rows)
  return np.concatenate([array for _, array in ordered], axis=0)


# Tensors some HF checkpoints carry that hold no parameters specsamp needs.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def get(tree: dict, path: Path):
  for key in path:
    tree = tree[key]
  return tree


def put(tree: dict, path: Path, value) -> None:
  for key in path[:-1]:
    tree = tree[key]
  tree[path[-1]] = value
