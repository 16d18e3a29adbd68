"""Attention and MLP blocks, run by jit's partitioner or under shard_map (Megatron).

``config.tensor_parallel == 'auto'``: the block's pure function is called
directly and jit partitions it from the parameters' shardings and the
activation constraints of the rules table.

``config.tensor_parallel == 'shard_map'``: the same pure function runs under
``jax.shard_map`` with explicit collectives, Megatron style. Each device holds
N/tp query heads (and K/tp kv heads, or all K when tp > K) and F/tp MLP
columns; the only communication per layer is ONE ``psum`` over the tensor axis after
the attention output projection and ONE after the MLP down projection. The
in/out specs come from the same rules table. Activations, positions and the KV
cache keep their batch sharding over 'data' and 'fsdp', so each device
computes and caches only its own rows; 'fsdp' is left out of the WEIGHT specs
only (parameters enter whole along d_model, jit inserts their all-gathers,
ZeRO-3 style). Which mesh axes these are comes from the rules table: the axis of
'heads' (and 'mlp') is the one the psums reduce over, the axes of 'embed' are
gathered; this file names no mesh axis. Without an active mesh the block runs on
one device exactly as in 'auto' mode.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from specsamp import sharding
from specsamp.models import kv_cache
from specsamp.models.attention import Attention, TreeCall, attention_forward
from specsamp.models.config import TransformerConfig
from specsamp.models.layers import MLP, mlp_forward


def _tensor_axis() -> str:
  """The mesh axis the rules table splits heads over: the axis the psums reduce."""
  axes = sharding.mesh_axes_of("heads")
  if len(axes) != 1 or sharding.mesh_axes_of("mlp") != axes:
    raise ValueError(
      f"tensor_parallel='shard_map' needs the rules to split 'heads' and 'mlp' "
      f"over one and the same mesh axis; they map to {axes} and "
      f"{sharding.mesh_axes_of('mlp')}."
    )
  return axes[0]


def _check_rules(tensor_axis: str, experts: bool) -> None:
  """The layout shard_map's blocks are written for (module docstring), from the rules table:
  rows split alike in the activations and the cache and never over the tensor (or expert)
  axis, kv heads over the tensor axis, lengths and d_model whole. Other overrides are jit's
  to partition ('auto'); under shard_map they would fail inside JAX or, with the experts on
  a batch axis, sum different rows' outputs together."""
  batch = sharding.mesh_axes_of("act_batch")
  problems = []
  if sharding.mesh_axes_of("cache_batch") != batch:
    problems.append(f"'act_batch' {batch} and 'cache_batch' {sharding.mesh_axes_of('cache_batch')}")
  reserved = {tensor_axis: "tensor"} | (
    {axis: "expert" for axis in sharding.mesh_axes_of("expert")} if experts else {}
  )
  for axis, role in reserved.items():
    if axis in batch:
      problems.append(f"the {role} axis {axis!r} also splits the batch ('act_batch' {batch})")
  for name in ("kv_heads", "cache_kv_heads"):
    if sharding.mesh_axes_of(name) != (tensor_axis,):
      problems.append(f"{name!r} maps to {sharding.mesh_axes_of(name)}, not ({tensor_axis!r},)")
  for name in ("act_length", "act_embed"):
    if sharding.mesh_axes_of(name):
      problems.append(f"{name!r} maps to {sharding.mesh_axes_of(name)}, not ()")
  if experts and tensor_axis in sharding.mesh_axes_of("expert"):
    problems.append(f"the experts and the heads share the {tensor_axis!r} axis")
  if problems:
    raise ValueError(
      "tensor_parallel='shard_map' runs the Megatron layout of the default rules; these "
      f"overrides break it: {'; '.join(problems)}. Use tensor_parallel='auto' for them."
    )


def _tensor_parallel_size(config: TransformerConfig) -> int | None:
  """Tensor-parallel width when the block must run under shard_map, else None."""
  if config.tensor_parallel != "shard_map":
    return None
  sizes = sharding.current_axis_sizes()
  if not sizes:
    return None
  axis = _tensor_axis()
  _check_rules(axis, bool(config.num_experts))
  return sizes.get(axis, 1)


def _check_divides(tp: int, what: str, size: int):
  if size % tp:
    raise ValueError(
      f"tensor_parallel='shard_map' splits {what}={size} over the {_tensor_axis()!r} mesh axis of "
      f"size {tp}, which does not divide it; use a tensor axis that divides {what} or "
      "tensor_parallel='auto'."
    )


def _spec(logical_axes: Sequence[str | None], array: jax.Array) -> jax.sharding.PartitionSpec:
  """An activation's or the cache's spec: batch over data and fsdp, heads over tensor."""
  return sharding.logical_to_spec(logical_axes, array.shape)


def _values_and_specs(params: dict[str, nnx.Param]):
  """Weights and their specs without 'fsdp': gathered along d_model before the block."""
  values = {name: param[...] for name, param in params.items()}
  gathered = sharding.mesh_axes_of("embed")  # d_model's axes (fsdp): gathered by jit.
  specs = {
    name: sharding.logical_to_spec(
      sharding.logical_axes_of(param), values[name].shape, exclude=gathered
    )
    for name, param in params.items()
  }
  return values, specs


def attention_block(
  attn: Attention,
  x_BTD: jax.Array,
  positions_BT: jax.Array,
  keys_LBSKH: jax.Array,
  values_LBSKH: jax.Array,
  layer: jax.Array | int,
  window: jax.Array | int | None = None,
  tree: TreeCall | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Runs attention (and its in-place cache update of ``layer``) in the config's
  tensor-parallel mode; ``window`` is this layer's sliding window (a scalar, traced when the
  layers are scanned) or None; ``tree`` a tree call or None."""
  config = attn.config
  tp = _tensor_parallel_size(config)
  weights, weight_specs = _values_and_specs(attn.weights())
  if tp is None:
    return attention_forward(
      x_BTD,
      positions_BT,
      keys_LBSKH,
      values_LBSKH,
      layer,
      weights,
      config=config,
      window=window,
      tree=tree,
    )

  num_heads, num_kv_heads = config.num_heads, config.num_kv_heads
  _check_divides(tp, "num_heads", num_heads)
  kv_sharded = num_kv_heads % tp == 0
  if not kv_sharded and tp % num_kv_heads:
    raise ValueError(
      f"tensor_parallel='shard_map' with num_kv_heads={num_kv_heads} needs a tensor axis "
      f"that divides it or that it divides; got {tp}."
    )

  axis = _tensor_axis()

  def body(x, positions, keys, values, local_weights, layer_index, layer_window, tree_call):
    offset = None
    if not kv_sharded:  # every device holds all K kv heads; pick its query heads' one.
      offset = jax.lax.axis_index(axis) * (num_heads // tp) // (num_heads // num_kv_heads)
    out, keys, values = attention_forward(
      x,
      positions,
      keys,
      values,
      layer_index,
      local_weights,
      config=config,
      window=layer_window,
      kv_head_offset=offset,
      tree=tree_call,
    )
    return jax.lax.psum(out, axis), keys, values

  x_spec = _spec(("act_batch", "act_length", "act_embed"), x_BTD)
  cache_spec = _spec(kv_cache.STACKED_CACHE_AXES, keys_LBSKH)
  scalar = jax.sharding.PartitionSpec()  # The layer index and its window: replicated.
  in_specs = (
    x_spec,
    _spec(("act_batch", "act_length"), positions_BT),
    cache_spec,
    cache_spec,
    weight_specs,
    scalar,
    None if window is None else scalar,
    None  # A tree call: roots split like the positions' rows, one mask for all replicated,
    if tree is None  # a mask per row (a dynamic tree, packed sequences) split with its row.
    else TreeCall(
      _spec(("act_batch",), tree.root_B),
      scalar,
      scalar if tree.mask_TM.ndim == 2 else _spec(("act_batch", None, None), tree.mask_TM),
      packed=tree.packed,
    ),
  )
  return jax.shard_map(body, in_specs=in_specs, out_specs=(x_spec, cache_spec, cache_spec))(
    x_BTD,
    positions_BT,
    keys_LBSKH,
    values_LBSKH,
    weights,
    jnp.asarray(layer, jnp.int32),
    window,
    tree,
  )


def _expert_axis(config: TransformerConfig) -> tuple[str | None, int]:
  """(the mesh axis the experts are split over, its size), or (None, 1)."""
  if not config.num_experts:
    return None, 1
  sizes = sharding.current_axis_sizes()
  axes = [a for a in sharding.mesh_axes_of("expert") if sizes.get(a, 1) > 1]
  if len(axes) > 1:
    raise ValueError(f"The experts may be split over one mesh axis, the rules give {axes}.")
  if not axes or config.num_experts % sizes[axes[0]]:
    return None, 1
  return axes[0], sizes[axes[0]]


def mlp_block(mlp: MLP, x_BTD: jax.Array, layer: jax.Array | int | None = None) -> jax.Array:
  """Runs the MLP in the config's tensor-parallel mode. A mixture of experts split over the
  ``expert`` mesh axis runs its dense path under jit's partitioner ('auto'), and under
  shard_map each device loops over its own shard's activated experts (``models/moe.py``).
  ``layer``: the experts' weights are every layer's, stacked (``transformer.run_blocks``)."""
  config = mlp.config
  tp = _tensor_parallel_size(config)
  weights, weight_specs = _values_and_specs(mlp.weights())
  expert_axis, ep = _expert_axis(config)
  if tp is None:
    return mlp_forward(x_BTD, weights, config, "dense" if expert_axis else None, layer=layer)
  _check_divides(tp, "ffn_dim", config.ffn_dim)

  axis = _tensor_axis()
  # The axes the partial outputs vary over (an axis of size 1 splits nothing).
  reduce_over = tuple(a for a, size in ((expert_axis, ep), (axis, tp)) if a and size > 1)

  def body(x, local_weights, layer=None):
    offset = (
      0 if expert_axis is None else jax.lax.axis_index(expert_axis) * (config.num_experts // ep)
    )
    out = mlp_forward(x, local_weights, config, None, offset, layer)
    return jax.lax.psum(out, reduce_over) if reduce_over else out

  x_spec = _spec(("act_batch", "act_length", "act_embed"), x_BTD)
  args, specs = (x_BTD, weights), (x_spec, weight_specs)
  if layer is not None:  # The scan's layer index (traced): passed in, replicated.
    args, specs = (*args, jnp.asarray(layer, jnp.int32)), (*specs, jax.sharding.PartitionSpec())
  return jax.shard_map(body, in_specs=specs, out_specs=x_spec)(*args)
