"""Transformer building blocks: parameters with logical axes, RMSNorm, embedder, MLP, RoPE.

Each block keeps its math in a pure function of arrays (``mlp_forward``,
``apply_rope``) so the same code runs under jit's automatic partitioning and
inside ``shard_map`` (see ``tensor_parallel.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from specsamp import sharding
from specsamp.models import moe
from specsamp.models.config import TransformerConfig


def make_param(
  rngs: nnx.Rngs,
  init: nnx.Initializer,
  shape: Sequence[int],
  logical_axes: Sequence[str | None],
  dtype: jnp.dtype,
) -> nnx.Param:
  """A parameter carrying its logical axis names (never mesh axes).

  ``eager_sharding=False``: the names are logical and only become mesh axes
  through ``sharding.LOGICAL_AXIS_RULES``, never by Flax directly.
  """
  return nnx.Param(
    init(rngs.params(), tuple(shape), dtype), out_sharding=tuple(logical_axes), eager_sharding=False
  )


def softcap(x: jax.Array, cap: float | None) -> jax.Array:
  """cap * tanh(x / cap) (Gemma 2); identity when cap is None."""
  return x if cap is None else cap * jnp.tanh(x / cap)


class RMSNorm(nnx.Module):
  """x / rms(x) * w, or * (1 + w) with w starting at 0 (Gemma)."""

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
    init = nnx.initializers.zeros if config.norm_plus_one else nnx.initializers.ones
    self.scale_D = make_param(rngs, init, (config.d_model,), ("norm",), config.weight_dtype)
    self.eps = config.norm_eps
    self.plus_one = config.norm_plus_one

  def __call__(self, x_BTD: jax.Array) -> jax.Array:
    return rms_norm(x_BTD, self.scale_D[...], self.eps, self.plus_one)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float, plus_one: bool) -> jax.Array:
  """x / rms(x) * scale (or * (1 + scale)) over the last axis, computed in float32."""
  x32 = x.astype(jnp.float32)
  normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  scale = scale.astype(jnp.float32)
  return (normed * (1.0 + scale if plus_one else scale)).astype(x.dtype)


class Embedder(nnx.Module):
  """Token embedding; with tied embeddings it is also the output head."""

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
    self.config = config
    self.table_VD = make_param(
      rngs,
      nnx.initializers.normal(stddev=1.0),
      (config.vocab_size, config.d_model),
      ("vocab", "embed"),
      config.weight_dtype,
    )

  def encode(self, tokens_BT: jax.Array) -> jax.Array:
    x_BTD = jnp.take(self.table_VD[...], tokens_BT, axis=0).astype(self.config.activation_dtype)
    if self.config.scale_embeddings:
      x_BTD = x_BTD * jnp.asarray(self.config.d_model**0.5, x_BTD.dtype)
    return sharding.constrain(x_BTD, ("act_batch", "act_length", "act_embed"))

  def decode(self, x_BTD: jax.Array, vocab_ids: jax.Array | None = None) -> jax.Array:
    """Logits over the vocabulary, or over the ids ``vocab_ids`` only (in their order)."""
    table = self.table_VD[...] if vocab_ids is None else self.table_VD[...][vocab_ids]
    return jnp.einsum("BTD,VD->BTV", x_BTD, table.astype(x_BTD.dtype))


class OutputHead(nnx.Module):
  """Untied output projection D -> V."""

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
    self.w_DV = make_param(
      rngs,
      nnx.initializers.lecun_normal(),
      (config.d_model, config.vocab_size),
      ("embed", "vocab"),
      config.weight_dtype,
    )

  def __call__(self, x_BTD: jax.Array, vocab_ids: jax.Array | None = None) -> jax.Array:
    """Logits over the vocabulary, or over the ids ``vocab_ids`` only (in their order)."""
    w_DV = self.w_DV[...] if vocab_ids is None else self.w_DV[...][:, vocab_ids]
    return jnp.einsum("BTD,DV->BTV", x_BTD, w_DV.astype(x_BTD.dtype))


def activation_fn(config: TransformerConfig):
  """The MLP's nonlinearity (of the gate branch when gated)."""
  if config.mlp_activation in ("gelu", "geglu"):
    return functools.partial(jax.nn.gelu, approximate=config.gelu_approximate)
  return {
    "relu": jax.nn.relu,
    "relu2": lambda x: jnp.square(jax.nn.relu(x)),
    "swiglu": jax.nn.silu,
  }[config.mlp_activation]


def mlp_forward(
  x_BTD: jax.Array,
  weights: dict[str, jax.Array],
  config: TransformerConfig,
  compute: str | None = None,
  expert_offset: jax.Array | int = 0,
  layer: jax.Array | int | None = None,
) -> jax.Array:
  """MLP on arrays: down(act(gate(x)) * up(x)) when gated, down(act(up(x))) otherwise; the
  routed mixture of experts when ``weights`` hold a router (``moe.moe_forward``: ``compute``
  overrides ``config.moe_compute``; ``expert_offset`` is the first expert of a shard; ``layer``
  indexes experts left stacked over the layers).

  Under tensor parallelism each device holds an F-slice of the weights; the
  result is then a partial sum that the caller reduces once.
  """
  dtype = x_BTD.dtype
  act = activation_fn(config)
  if "router_DE" in weights:
    return moe.moe_forward(x_BTD, weights, config, act, compute, expert_offset, layer)
  up_BTF = jnp.einsum("BTD,DF->BTF", x_BTD, weights["up_DF"].astype(dtype))
  if "gate_DF" in weights:
    gate_BTF = jnp.einsum("BTD,DF->BTF", x_BTD, weights["gate_DF"].astype(dtype))
    hidden_BTF = act(gate_BTF) * up_BTF
  else:
    hidden_BTF = act(up_BTF)
  hidden_BTF = sharding.constrain(hidden_BTF, ("act_batch", "act_length", "act_mlp"))
  return jnp.einsum("BTF,FD->BTD", hidden_BTF, weights["down_FD"].astype(dtype))


class MLP(nnx.Module):
  """Feed-forward block: plain (GELU/ReLU, Chinchilla) or gated (SwiGLU, GeGLU); with
  ``config.num_experts`` a routed mixture of gated experts (``models/moe.py``): a router
  ``router_DE`` and the experts' stacked ``gate_EDF``, ``up_EDF``, ``down_EFD``."""

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
    self.config = config
    init = nnx.initializers.lecun_normal()
    dims, dtype = (config.d_model, config.ffn_dim), config.weight_dtype
    if config.num_experts:
      d, f, e = config.d_model, config.ffn_dim, config.num_experts
      expert_init = nnx.initializers.lecun_normal(in_axis=1, out_axis=2, batch_axis=(0,))
      self.router_DE = make_param(rngs, init, (d, e), ("embed", None), dtype)
      for name, shape, axes in (
        ("gate_EDF", (e, d, f), ("expert", "embed", "mlp")),
        ("up_EDF", (e, d, f), ("expert", "embed", "mlp")),
        ("down_EFD", (e, f, d), ("expert", "mlp", "embed")),
      ):
        setattr(self, name, make_param(rngs, expert_init, shape, axes, dtype))
      return
    if config.gated_mlp:
      self.gate_DF = make_param(rngs, init, dims, ("embed", "mlp"), dtype)
    self.up_DF = make_param(rngs, init, dims, ("embed", "mlp"), dtype)
    self.down_FD = make_param(rngs, init, dims[::-1], ("mlp", "embed"), dtype)

  def weights(self) -> dict[str, nnx.Param]:
    if self.config.num_experts:
      names = ("router_DE", "gate_EDF", "up_EDF", "down_EFD")
    else:
      names = (("gate_DF",) if self.config.gated_mlp else ()) + ("up_DF", "down_FD")
    return {name: getattr(self, name) for name in names}


def rope_frequencies(config: TransformerConfig, local: bool = False) -> jax.Array:
  """The H/2 inverse frequencies of RoPE, with the config's scaling applied (float32);
  ``local``: those of a sliding-window layer under ``config.rope_local_theta`` (unscaled)."""
  head_dim = config.resolved_head_dim
  exponents = jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim
  if local and config.rope_local_theta is not None:
    return 1.0 / (config.rope_local_theta**exponents)
  inv_freq = 1.0 / (config.rope_theta**exponents)
  factor = config.rope_scaling_factor
  if config.rope_scaling == "linear":
    inv_freq = inv_freq / factor
  elif config.rope_scaling == "llama3":
    # Wavelengths beyond original/low are slowed by the factor, those below
    # original/high kept, and the band between interpolated smoothly.
    wavelength = 2 * jnp.pi / inv_freq
    original = config.rope_original_max_position
    low, high = config.rope_low_freq_factor, config.rope_high_freq_factor
    smooth = (original / wavelength - low) / (high - low)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    inv_freq = jnp.where(
      wavelength > original / low,
      inv_freq / factor,
      jnp.where(wavelength < original / high, inv_freq, blended),
    )
  return inv_freq


def apply_rope(x_BTNH: jax.Array, positions_BT: jax.Array, inv_freq: jax.Array) -> jax.Array:
  """Rotary position embedding, half-split layout (as Llama/Gemma checkpoints use)."""
  angles_BTH = positions_BT.astype(jnp.float32)[..., None] * inv_freq
  sin, cos = jnp.sin(angles_BTH)[:, :, None, :], jnp.cos(angles_BTH)[:, :, None, :]
  x1, x2 = jnp.split(x_BTNH.astype(jnp.float32), 2, axis=-1)
  rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return rotated.astype(x_BTNH.dtype)
