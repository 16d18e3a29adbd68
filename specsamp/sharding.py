"""Device mesh and the ONE logical -> mesh axis rules table.

Model code never names mesh axes. Every parameter carries *logical* axis names
(its ``out_sharding`` metadata, e.g. ``('embed', 'mlp')``), activations are
constrained with logical names (``constrain(x, ('act_batch', 'act_length',
'act_embed'))``) and the KV cache has logical names too. ``LOGICAL_AXIS_RULES``
below maps each logical name to mesh axes; it is the only place that does (the
shard_map blocks ask it which mesh axis their heads and d_model are split over).

A config can override rules (``mesh.rules = "embed=none,act_batch=data"``, see
``parse_rules``): ``mesh_from_config`` applies them with ``set_rules`` before any
model is built. Rules are read when a program is traced, and jit does not key its
cache on them, so set them once per job, before compiling (``use_rules`` scopes a
change, e.g. in a test). Two dimensions of one array mapped to the same mesh axis
is an error, not silently dropped.

The mapping is shape-aware: a dimension is sharded over a mesh axis only when
the axis size divides it, otherwise that axis is dropped and the dimension is
replicated (e.g. one KV head under 4-way tensor parallelism, or batch 1 over
the data axis). So one table serves every mesh, from 1 CPU to a TPU pod.

Mesh axes:
  data:   pure data parallelism (batch); parameters replicated.
  fsdp:   batch for activations; parameters sharded along d_model (ZeRO-3 style).
  expert: expert parallelism: a mixture of experts' experts (``models/moe.py``); every other
          parameter and every activation is replicated over it.
  tensor: Megatron tensor parallelism: heads, MLP hidden and vocab.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from specsamp.config_fields import is_int

MESH_AXES = ("data", "fsdp", "expert", "tensor")

# logical axis name -> mesh axis, tuple of mesh axes, or None (replicated).
LOGICAL_AXIS_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
  # Parameters.
  ("layers", None),  # The blocks' stacked layer axis (scanned over, never split).
  ("vocab", "tensor"),
  ("embed", "fsdp"),
  ("heads", "tensor"),
  ("kv_heads", "tensor"),
  ("head_dim", None),
  ("mlp", "tensor"),
  ("expert", "expert"),  # The stacked experts of a mixture of experts.
  ("norm", None),
  # Activations.
  ("act_batch", ("data", "fsdp")),
  ("act_length", None),
  ("act_embed", None),
  ("act_heads", "tensor"),
  ("act_head_dim", None),
  ("act_mlp", "tensor"),
  ("act_vocab", "tensor"),
  # KV cache.
  ("cache_layers", None),
  ("cache_batch", ("data", "fsdp")),
  ("cache_sequence", None),
  ("cache_kv_heads", "tensor"),
  ("cache_head_dim", None),
)
Rule = str | tuple[str, ...] | None
_rules: dict[str, Rule] = dict(LOGICAL_AXIS_RULES)  # The active table (set_rules).

LogicalAxes = Sequence[str | None]


def rules() -> dict[str, Rule]:
  """The active rules table: logical name -> mesh axis, tuple of mesh axes, or None."""
  return dict(_rules)


def _check_rules(overrides: Mapping[str, Rule]) -> dict[str, Rule]:
  table = {}
  for name, rule in overrides.items():
    if name not in _rules:
      raise ValueError(
        f"Unknown logical axis {name!r} in sharding rule overrides; known: {sorted(_rules)}."
      )
    axes = (rule,) if isinstance(rule, str) else tuple(rule or ())
    unknown = [axis for axis in axes if axis not in MESH_AXES]
    if unknown:
      raise ValueError(
        f"Sharding rule {name}={rule!r} names unknown mesh axes {unknown}; the "
        f"mesh axes are {MESH_AXES}."
      )
    table[name] = rule if isinstance(rule, str) or rule is None else tuple(rule)
  return table


def set_rules(overrides: Mapping[str, Rule]) -> dict[str, Rule]:
  """Replaces rules of the active table (the defaults updated by ``overrides``); returns the
  table that was active. Call before building models and compiling (see the module doc)."""
  global _rules
  previous = dict(_rules)
  _rules = {**dict(LOGICAL_AXIS_RULES), **_check_rules(overrides)}
  return previous


@contextlib.contextmanager
def use_rules(overrides: Mapping[str, Rule]):
  """``set_rules(overrides)`` for the duration of a ``with`` block."""
  global _rules
  previous = set_rules(overrides)
  try:
    yield
  finally:
    _rules = previous


def parse_rules(text: str) -> dict[str, Rule]:
  """Overrides from a flag-friendly string: ``"embed=none,act_batch=data+fsdp,mlp=tensor"``
  ('none' or '' for replicated, '+' joins mesh axes)."""
  overrides: dict[str, Rule] = {}
  for item in filter(None, (part.strip() for part in (text or "").split(","))):
    name, sep, value = item.partition("=")
    if not sep:
      raise ValueError(
        f"Bad sharding rule {item!r} in {text!r}: use logical=mesh_axis, e.g. "
        "'embed=none' or 'act_batch=data+fsdp'."
      )
    axes = tuple(axis for axis in value.strip().split("+") if axis and axis != "none")
    overrides[name.strip()] = None if not axes else axes[0] if len(axes) == 1 else axes
  return _check_rules(overrides)


def mesh_axes_of(logical_name: str) -> tuple[str, ...]:
  """The mesh axes a logical name maps to under the active rules (possibly none)."""
  rule = _rules[logical_name]
  return (rule,) if isinstance(rule, str) else tuple(rule or ())


def make_mesh(axes: Mapping[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
  """Builds a mesh from axis sizes, e.g. ``{'data': -1, 'fsdp': 1, 'tensor': 2}``.

  One size may be -1: it takes all devices the others leave. Axes are of type
  Auto (jit partitions from the constraints), in the order of ``MESH_AXES``.
  """
  devices = list(jax.devices() if devices is None else devices)
  unknown = sorted(set(axes) - set(MESH_AXES))
  if unknown:
    raise ValueError(f"Unknown mesh axes {unknown}; specsamp's mesh axes are {MESH_AXES}.")
  odd = {name: size for name, size in axes.items() if not is_int(size)}
  if odd:  # int() cut 2.9 to 2 and failed on None with a bare TypeError.
    raise ValueError(f"Mesh axis sizes must be ints (positive, or -1), got {odd}.")
  if len(set(devices)) != len(devices):  # Accepted, then failed reading the first output.
    raise ValueError(f"A mesh lists each device once, got {[d.id for d in devices]}.")
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
      "use -1 on one axis to take all remaining devices."
    )
  shape = tuple(sizes[name] for name in MESH_AXES)
  return Mesh(
    np.asarray(devices).reshape(shape), MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES)
  )


def mesh_from_config(
  mesh_config: Mapping[str, Any], devices: Sequence[jax.Device] | None = None
) -> Mesh:
  """A config's ``mesh`` section -> the mesh, after applying its ``rules`` overrides."""
  values = dict(mesh_config)
  rules = parse_rules(values.pop("rules", "") or "")
  mesh = make_mesh(values, devices)  # First: a mesh refused leaves the rules as they were.
  set_rules(rules)
  return mesh


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


def logical_to_spec(
  logical_axes: LogicalAxes,
  shape: Sequence[int],
  axis_sizes: Mapping[str, int] | None = None,
  exclude: Sequence[str] = (),
) -> PartitionSpec:
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
  claimed: dict[str, str] = {}  # mesh axis -> the logical name whose rule names it
  spec = []
  for name, dim in zip(logical_axes, shape):
    if name is not None and name not in _rules:
      raise ValueError(f"Logical axis {name!r} has no rule in sharding.LOGICAL_AXIS_RULES.")
    candidates = mesh_axes_of(name) if name is not None else ()
    for axis in candidates:
      if axis in claimed:
        raise ValueError(
          f"Logical axes {tuple(logical_axes)} map two dimensions to the mesh axis "
          f"{axis!r} ({claimed[axis]!r} and {name!r}); fix the sharding rules."
        )
      claimed[axis] = name
    chosen, product = [], 1
    for axis in candidates:
      size = sizes.get(axis, 1)
      if axis in exclude or axis not in sizes or size == 1:
        continue
      if dim % (product * size):
        break
      chosen.append(axis)
      product *= size
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


def abstract_arrays(tree: Any, shardings: Any) -> Any:
  """ShapeDtypeStructs of ``tree`` (arrays or structs) placed with ``shardings``."""
  return jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
  )


@dataclasses.dataclass(frozen=True)
class AbstractModel:
  """A model's structure, parameter shapes and their shardings, with nothing allocated.

  Attributes:
    graphdef: the module's structure (``nnx.split``).
    shapes: the parameters as a pure dict of ``jax.ShapeDtypeStruct``.
    shardings: a matching pure dict of ``NamedSharding`` from the rules table.
  """

  graphdef: nnx.GraphDef
  shapes: Any
  shardings: Any

  def arrays(self) -> Any:
    """Shapes with their shardings: what a checkpoint restores into, shard by shard."""
    return abstract_arrays(self.shapes, self.shardings)

  def merge(self, params: Any) -> nnx.Module:
    """The module with ``params`` (a pure dict of arrays) as its parameters."""
    return nnx.merge(self.graphdef, params)


def abstract_model(
  factory: Callable[[nnx.Rngs], nnx.Module], mesh: Mesh, seed: int = 0
) -> AbstractModel:
  """``factory``'s module evaluated for shapes only (``nnx.eval_shape``), its parameters
  placed by the rules table on ``mesh``: the one abstract init that creating, training,
  loading and importing a model all start from."""
  abstract = nnx.eval_shape(lambda: factory(nnx.Rngs(seed)))
  graphdef, params = nnx.split(abstract, nnx.Param)
  return AbstractModel(
    graphdef=graphdef,
    shapes=nnx.to_pure_dict(params),
    shardings=nnx.to_pure_dict(state_shardings(params, mesh)),
  )


def create_sharded(
  factory: Callable[[nnx.Rngs], nnx.Module], mesh: Mesh, seed: int = 0
) -> nnx.Module:
  """Creates an NNX module with every parameter born sharded on ``mesh``.

  Shapes come from ``abstract_model`` (nothing allocated), then ONE jitted init
  with ``out_shardings`` materialises each device's shard only, so a 70B model
  never exists whole on one host.

  Args:
    factory: ``rngs -> module``, e.g. ``lambda rngs: Transformer(config, rngs=rngs)``.
    mesh: the device mesh.
    seed: parameter init seed; the same seed gives the same values on any mesh.
  """
  abstract = abstract_model(factory, mesh, seed)

  def init():
    return nnx.to_pure_dict(nnx.state(factory(nnx.Rngs(seed)), nnx.Param))

  with use_mesh(mesh):
    params = jax.jit(init, out_shardings=abstract.shardings)()
  return abstract.merge(params)


def count_parameters(factory: Callable[[nnx.Rngs], nnx.Module]) -> int:
  """Counts parameters from abstract shapes only (works for 70B on a laptop)."""
  abstract = nnx.eval_shape(lambda: factory(nnx.Rngs(0)))
  leaves = jax.tree.leaves(nnx.state(abstract, nnx.Param))
  return int(sum(math.prod(leaf.shape) for leaf in leaves))
