"""Device mesh and the ONE logical -> mesh axis rules table.

Model code never names mesh axes. Every parameter carries *logical* axis names
(its ``out_sharding`` metadata, e.g. ``('embed', 'mlp')``), activations are
constrained with logical names (``constrain(x, ('act_batch', 'act_length',
'act_embed'))``) and the KV cache has logical names too. ``LOGICAL_AXIS_RULES``
below maps each logical name to mesh axes; it is the only place that does.

The mapping is shape-aware: a dimension is sharded over a mesh axis only when
the axis size divides it, otherwise that axis is dropped and the dimension is
replicated (e.g. one KV head under 4-way tensor parallelism, or batch 1 over
the data axis). So one table serves every mesh, from 1 CPU to a TPU pod.

Mesh axes:
  data:   pure data parallelism (batch); parameters replicated.
  fsdp:   batch for activations; parameters sharded along d_model (ZeRO-3 style).
  tensor: Megatron tensor parallelism: heads, MLP hidden and vocab.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

# logical axis name -> mesh axis, tuple of mesh axes, or None (replicated).
LOGICAL_AXIS_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    # Parameters.
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("norm", None),
    # Activations.
    ("act_batch", ("data", "fsdp")),
    ("act_length", None),
    ("act_embed", None),
    ("act_heads", "tensor"),
    ("act_kv_heads", "tensor"),
    ("act_head_dim", None),
    ("act_mlp", "tensor"),
    ("act_vocab", "tensor"),
    # KV cache.
    ("cache_batch", ("data", "fsdp")),
    ("cache_sequence", None),
    ("cache_kv_heads", "tensor"),
    ("cache_head_dim", None),
)
_RULES = dict(LOGICAL_AXIS_RULES)

LogicalAxes = Sequence[str | None]


def make_mesh(axes: Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
  """Builds a mesh from axis sizes, e.g. ``{'data': -1, 'fsdp': 1, 'tensor': 2}``.

  One size may be -1: it takes all devices the others leave. Axes are of type
  Auto (jit partitions from the constraints), in the order of ``MESH_AXES``.
  """
  devices = list(jax.devices() if devices is None else devices)
  unknown = sorted(set(axes) - set(MESH_AXES))
  if unknown:
    raise ValueError(f"Unknown mesh axes {unknown}; specsamp's mesh axes are {MESH_AXES}.")
  sizes = {name: int(axes.get(name, 1)) for name in MESH_AXES}
  free = [name for name, size in sizes.items() if size == -1]
  if len(free) > 1:
    raise ValueError(f"At most one mesh axis may be -1, got {free}.")
  if any(size == 0 or size < -1 for size in sizes.values()):
    raise ValueError(f"Mesh axis sizes must be positive or -1, got {sizes}.")
  known = math.prod(size for size in sizes.values() if size != -1)
  if free:
    if len(devices) % known:
      raise ValueError(f"Mesh axes {sizes} do not divide the {len(devices)} devices.")
    sizes[free[0]] = len(devices) // known
  total = math.prod(sizes.values())
  if total != len(devices):
    raise ValueError(
        f"Mesh axes {sizes} need {total} devices, but {len(devices)} are available; "
        "use -1 on one axis to take all remaining devices.")
  shape = tuple(sizes[name] for name in MESH_AXES)
  return Mesh(np.asarray(devices).reshape(shape), MESH_AXES,
              axis_types=(AxisType.Auto,) * len(MESH_AXES))


def use_mesh(mesh: Mesh) -> contextlib.AbstractContextManager:
  """Makes ``mesh`` the ambient mesh: jit, constraints and shard_map use it."""
  return jax.set_mesh(mesh)


def current_axis_sizes() -> dict[str, int]:
  """Sizes of the ambient mesh's automatically partitioned axes.

  Empty when no mesh is active, and inside ``shard_map`` (whose axes are
  manual), so that constraints become no-ops there.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return {}
  manual = set(mesh.manual_axes)
  return {name: size for name, size in mesh.shape.items() if name not in manual}


def logical_to_spec(logical_axes: LogicalAxes, shape: Sequence[int],
                    axis_sizes: Mapping[str, int] | None = None,
                    exclude: Sequence[str] = ()) -> PartitionSpec:
  """Maps logical axis names to a PartitionSpec for an array of ``shape``.

  Args:
    logical_axes: one logical name (or None) per dimension.
    shape: the array's shape, for the divisibility check.
    axis_sizes: mesh axis sizes; the ambient mesh's when None.
    exclude: mesh axes not to use (shard_map leaves 'fsdp' to jit's gathers).

  Returns:
    A PartitionSpec that shards each dimension over the mesh axes its rule
    names, keeping the longest prefix of them whose product divides the size.
  """
  if len(logical_axes) != len(shape):
    raise ValueError(f"Logical axes {tuple(logical_axes)} do not match shape {tuple(shape)}.")
  sizes = current_axis_sizes() if axis_sizes is None else dict(axis_sizes)
  used: set[str] = set()
  spec = []
  for name, dim in zip(logical_axes, shape):
    if name is not None and name not in _RULES:
      raise ValueError(f"Logical axis {name!r} has no rule in sharding.LOGICAL_AXIS_RULES.")
    rule = _RULES.get(name) if name is not None else None
    candidates = (rule,) if isinstance(rule, str) else (rule or ())
    chosen, product = [], 1
    for axis in candidates:
      size = sizes.get(axis, 1)
      if axis in exclude or axis in used or axis not in sizes or size == 1:
        continue
      if dim % (product * size):
        break
      chosen.append(axis)
      product *= size
    used.update(chosen)
    spec.append(None if not chosen else chosen[0] if len(chosen) == 1 else tuple(chosen))
  return PartitionSpec(*spec)


def constrain(x: jax.Array, logical_axes: LogicalAxes) -> jax.Array:
  """Sharding constraint from logical names; a no-op when no mesh is active."""
  sizes = current_axis_sizes()
  if not sizes:
    return x
  return jax.lax.with_sharding_constraint(x, logical_to_spec(logical_axes, x.shape, sizes))


def replicated(tree: Any) -> Any:
  """Every array of ``tree`` replicated on the ambient mesh (a no-op without one).

  The samplers return tokens and statistics this way: on a multi-host mesh an array
  sharded over 'data' is not fully addressable, and a host could not read it.
  """
  if not current_axis_sizes():
    return tree
  return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, PartitionSpec()), tree)


def logical_axes_of(variable: nnx.Variable) -> tuple[str | None, ...]:
  """The logical axis names a parameter was created with."""
  axes = variable.get_metadata().get("out_sharding")
  if axes is None:
    raise ValueError(f"Parameter of shape {variable.shape} has no logical axis names.")
  return tuple(axes)


def state_shardings(state: nnx.State, mesh: Mesh, exclude: Sequence[str] = ()) -> Any:
  """NamedShardings for every Variable in an (abstract) NNX state."""
  sizes = dict(mesh.shape)

  def sharding(variable):
    if not isinstance(variable, nnx.Variable):
      return NamedSharding(mesh, PartitionSpec())
    spec = logical_to_spec(logical_axes_of(variable), variable.shape, sizes, exclude)
    return variable.replace(NamedSharding(mesh, spec))

  return jax.tree.map(sharding, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def create_sharded(factory: Callable[[nnx.Rngs], nnx.Module], mesh: Mesh, seed: int = 0) -> nnx.Module:
  """Creates an NNX module with every parameter born sharded on ``mesh``.

  Shapes come from ``nnx.eval_shape`` (nothing allocated), then ONE jitted init
  with ``out_shardings`` materialises each device's shard only, so a 70B model
  never exists whole on one host.

  Args:
    factory: ``rngs -> module``, e.g. ``lambda rngs: Transformer(config, rngs=rngs)``.
    mesh: the device mesh.
    seed: parameter init seed; the same seed gives the same values on any mesh.
  """
  abstract = nnx.eval_shape(lambda: factory(nnx.Rngs(seed)))
  graphdef, abstract_state = nnx.split(abstract)
  shardings = state_shardings(abstract_state, mesh)

  def init():
    return nnx.state(factory(nnx.Rngs(seed)))

  with use_mesh(mesh):
    state = jax.jit(init, out_shardings=shardings)()
  return nnx.merge(graphdef, state)


def count_parameters(factory: Callable[[nnx.Rngs], nnx.Module]) -> int:
  """Counts parameters from abstract shapes only (works for 70B on a laptop)."""
  abstract = nnx.eval_shape(lambda: factory(nnx.Rngs(0)))
  leaves = jax.tree.leaves(nnx.state(abstract, nnx.Param))
  return int(sum(math.prod(leaf.shape) for leaf in leaves))
