"""Ahead-of-time compilation for a TPU slice on any machine: ``scripts/aot_compile.py``.

libtpu (``pip install -e ".[tpu]"``) can describe a TPU topology without TPU hardware
(``jax.experimental.topologies.get_topology_desc``), and jit can lower and compile for its
devices, as MaxText's train_compile.py does. Nothing is allocated: parameters, caches and
prompts are abstract shapes with their shardings. What comes back is what the TPU compiler
decided: compile time, per-chip memory, the collectives in the program, the HBM bytes of
single calls counted from the optimized HLO (``hlo_bytes``), and XLA's cost analysis (FLOPs,
bytes accessed) beside them.

The programs compiled are the ones users run: ``AutoregressiveLoop`` and ``SpeculativeLoop``
(prefill, draft, score, verify, in one ``while_loop``), and single model calls (a target
decode step, a draft step, the target scoring K + 1 tokens) for per-step costs.

Devices are chips: v4 and v5p are described in megacore mode (one device per chip, both
TensorCores), as Cloud TPU runs them.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import time
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from specsamp import sharding
from specsamp.experiments import cli
from specsamp.experiments.benchmarks import perf_model
from specsamp.experiments.proofs import hlo_bytes, hlo_ops
from specsamp.hf import architectures
from specsamp.models import kv_cache, transformer
from specsamp.models.config import TransformerConfig
from specsamp.sampling import autoregressive, drafters, model_protocol, speculative
from specsamp.sampling.warping import SamplingConfig


@dataclasses.dataclass(frozen=True)
class Slice:
  """A TPU slice: libtpu's topology name, its chip configuration, and the chip's roofline."""

  topology: str
  chip_config: str
  hardware: perf_model.Hardware


# The chip's 96 GiB (95 was below the 95.74 GiB libtpu lets a program use: 2026-11-30).
V5P = perf_model.Hardware("TPU v5p", 2.765e12, 459e12, 600e9, 10e-6, 96 * 2**30, 95.74 * 2**30)

# Cloud TPU names (cores for v4/v5p, as Google counts them; chips for v5e).
SLICES = {
  "v4-8": Slice("v4:2x2x1", "megacore", perf_model.PRESETS["tpu_v4"]),
  "v4-16": Slice("v4:2x2x2", "megacore", perf_model.PRESETS["tpu_v4"]),
  "v4-32": Slice("v4:2x2x4", "megacore", perf_model.PRESETS["tpu_v4"]),
  "v5e-4": Slice("v5e:2x2", "default", perf_model.PRESETS["tpu_v5e"]),
  "v5e-8": Slice("v5e:2x4", "default", perf_model.PRESETS["tpu_v5e"]),
  "v5e-16": Slice("v5e:4x4", "default", perf_model.PRESETS["tpu_v5e"]),
  "v5p-8": Slice("v5p:2x2x1", "megacore", V5P),
}


def quiet_libtpu() -> None:
  """The environment libtpu reads at initialisation, set for a machine without a TPU (only
  where the user has not set it): without it libtpu probes for hardware and warns."""
  cli.set_libtpu_defaults()
  # Compiling opens no TPU, so several processes may load libtpu at once (its lockfile
  # otherwise refuses every process but the first).
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def slice_devices(name: str) -> list[Any]:
  """The compile-only devices of a slice (``SLICES``); needs libtpu."""
  if name not in SLICES:
    raise ValueError(f"--topology={name!r}: must be one of {sorted(SLICES)}.")
  try:
    from jax.experimental import topologies

    spec = SLICES[name]
    return list(
      topologies.get_topology_desc(
        platform="tpu", topology_name=spec.topology, chip_config_name=spec.chip_config
      ).devices
    )
  except (ImportError, RuntimeError) as error:
    raise ValueError(
      f'Compiling for {name} needs libtpu: pip install -e ".[tpu]" ({error}).'
    ) from error


def make_mesh(devices: list[Any], axes: dict[str, int]) -> jax.sharding.Mesh:
  """A mesh of ``sharding.MESH_AXES`` over ``devices``; -1 takes the rest. ``sharding.make_mesh``
  checks the sizes (a 0 divided by zero, two -1 gave numpy's reshape message, and a mesh the
  slice did not fill was reported with sizes the user never wrote: 2026-11-30's review)."""
  return sharding.make_mesh(axes, devices)


def model_config(model: Any, hf_config: str | None = None) -> TransformerConfig:
  """A pair config section's model, or the shapes of an HF ``config.json`` (a published
  model's, e.g. configs/hf/llama-3.1-70b/config.json) in that section's dtypes and
  tensor-parallel mode."""
  ours = TransformerConfig.from_config(model)
  if not hf_config:
    return ours
  return architectures.from_hf(
    architectures.read_config(hf_config),
    param_dtype=ours.param_dtype,
    dtype=ours.dtype,
    tensor_parallel=ours.tensor_parallel,
  )


def abstract_model(config: TransformerConfig, mesh: jax.sharding.Mesh) -> Any:
  """The model with ShapeDtypeStructs (placed by the rules table) for parameters."""
  abstract = sharding.abstract_model(lambda rngs: transformer.Transformer(config, rngs=rngs), mesh)
  return abstract.merge(abstract.arrays())


def _replicated(mesh, shape, dtype) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(
    shape, dtype, sharding=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  )


def abstract_cache(model: Any, mesh, batch: int, length: int) -> Any:
  """The model's KV cache as ShapeDtypeStructs sharded by the rules table."""
  shapes = jax.eval_shape(lambda: model.init_cache(batch, length))
  sizes = dict(mesh.shape)

  def place(leaf, axes):
    spec = sharding.logical_to_spec(axes, leaf.shape, sizes)
    return jax.ShapeDtypeStruct(
      leaf.shape, leaf.dtype, sharding=jax.sharding.NamedSharding(mesh, spec)
    )

  return shapes.replace(
    keys=place(shapes.keys, kv_cache.STACKED_CACHE_AXES),
    values=place(shapes.values, kv_cache.STACKED_CACHE_AXES),
    lengths=_replicated(mesh, shapes.lengths.shape, shapes.lengths.dtype),
  )


@dataclasses.dataclass
class Program:
  """What the TPU compiler made of one program (memory per device, i.e. per chip)."""

  name: str
  compile_s: float
  argument_bytes: int
  temp_bytes: int
  output_bytes: int
  alias_bytes: int
  flops: float
  bytes_accessed: float
  collectives: dict[str, int]  # Per execution, while-loop bodies counted per trip.
  hlo: str = dataclasses.field(repr=False, default="")

  @property
  def total_bytes(self) -> int:
    """Peak per chip: arguments + temporaries + outputs not aliased to arguments."""
    return self.argument_bytes + self.temp_bytes + self.output_bytes - self.alias_bytes


_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")


def count_collectives(hlo: str, trips: Callable[[str], int] | None = None) -> dict[str, int]:
  """Collective ops of a compiled HLO module, each while body's counted ``trips(body)``
  times (default: once); async pairs (``-start``/``-done``) count once."""
  computations: dict[str, str] = {}
  for match in re.finditer(r"^(?:ENTRY )?%?([\w.\-]+) .*?\{\n(.*?)^\}", hlo, re.M | re.S):
    computations[match.group(1)] = match.group(2)
  entry = re.search(r"^ENTRY %?([\w.\-]+)", hlo, re.M)

  def count(name: str, seen: tuple[str, ...]) -> dict[str, int]:
    body = computations.get(name, "")
    totals = {op: len(re.findall(rf" {op}(?:-start)?\(", body)) for op in _COLLECTIVES}
    for callee_kind, callee in re.findall(r"(body|condition|calls|to_apply)=%?([\w.\-]+)", body):
      if callee in seen or callee_kind == "to_apply":
        continue
      times = (trips or (lambda _: 1))(callee) if callee_kind == "body" else 1
      for op, n in count(callee, (*seen, callee)).items():
        totals[op] += n * times
    return totals

  return count(entry.group(1), ()) if entry else {}


def compiler_refusal(error: Exception) -> str | None:
  """The TPU compiler's one-line reason when it refused a program for HBM, else None."""
  if not isinstance(error, jax.errors.JaxRuntimeError) or "RESOURCE_EXHAUSTED" not in str(error):
    return None
  return str(error).split("RESOURCE_EXHAUSTED:")[-1].strip().splitlines()[0]


def compile_or_refuse(name: str, lowered: Any, where: str, **kwargs) -> Program:
  """``compile_program``, with the compiler's HBM refusal as a ValueError in one line (the
  scripts print it) instead of a traceback."""
  try:
    return compile_program(name, lowered, **kwargs)
  except jax.errors.JaxRuntimeError as error:
    message = compiler_refusal(error)
    if message is None:
      raise
    raise ValueError(
      f"The {name} does not fit {where}: {message}. Shard the model over more chips (a wider "
      "tensor, expert or fsdp axis), use a larger slice, or lower the batch or cache."
    ) from None


def compile_program(name: str, lowered: Any, trips: Callable[[str], int] | None = None) -> Program:
  """Compiles a lowered program and reads its memory, cost analysis and collectives."""
  # With a persistent compilation cache (JAX_COMPILATION_CACHE_DIR), a cached executable for
  # a topology without a client cannot be read back: JAX warns and compiles, which is what we
  # time anyway, so the warning says nothing.
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "Error reading persistent compilation cache entry")
    start = time.perf_counter()
    compiled = lowered.compile()
    seconds = time.perf_counter() - start
  memory = compiled.memory_analysis()
  flops, bytes_accessed = hlo_ops.xla_cost(compiled)
  hlo = compiled.as_text()
  return Program(
    name=name,
    compile_s=seconds,
    argument_bytes=int(memory.argument_size_in_bytes),
    temp_bytes=int(memory.temp_size_in_bytes),
    output_bytes=int(memory.output_size_in_bytes),
    alias_bytes=int(memory.alias_size_in_bytes),
    flops=flops,
    bytes_accessed=bytes_accessed,
    collectives=count_collectives(hlo, trips),
    hlo=hlo,
  )


def lower_call(model: Any, mesh, batch: int, tokens: int, cache_length: int) -> Any:
  """One cached model call of ``tokens`` per row (a decode step, or scoring K + 1). The cache
  is donated, as inside the loops, where it is updated in place."""
  cache = abstract_cache(model, mesh, batch, cache_length)
  tokens_BT = _replicated(mesh, (batch, tokens), jnp.int32)
  positions_BT = _replicated(mesh, (batch, tokens), jnp.int32)
  with sharding.use_mesh(mesh):
    call = jax.jit(lambda m, t, p, c: m(t, p, c), donate_argnums=3)
    return call.lower(model, tokens_BT, positions_BT, cache)


def lower_speculative(
  target: Any,
  draft: Any,
  mesh,
  *,
  batch: int,
  prompt_length: int,
  max_new_tokens: int,
  num_draft_tokens: int,
  verifier: str,
  sampling: SamplingConfig,
  cache_length: int,
) -> Any:
  """The speculative loop users run (``speculative.SpeculativeLoop``), lowered."""
  loop, target_dynamic, drafter_dynamic = speculative.SpeculativeLoop.for_models(
    target,
    drafters.as_drafter(draft),
    max_new_tokens=max_new_tokens,
    num_draft_tokens=num_draft_tokens,
    sampling=sampling,
    verifier=verifier,
    schedule="fixed",
    eos_id=None,
    pad_id=0,
    cache_length=cache_length,
  )
  with sharding.use_mesh(mesh):
    return speculative.SpeculativeLoop.__call__.lower(
      loop,
      target_dynamic,
      drafter_dynamic,
      *_prompt_arguments(mesh, batch, prompt_length),
      _replicated(mesh, (), jnp.float32),
    )


def lower_autoregressive(
  target: Any,
  mesh,
  *,
  batch: int,
  prompt_length: int,
  max_new_tokens: int,
  sampling: SamplingConfig,
  cache_length: int,
) -> Any:
  """The autoregressive loop users run (``autoregressive.AutoregressiveLoop``), lowered."""
  loop, dynamic = autoregressive.AutoregressiveLoop.for_model(
    target,
    max_new_tokens=max_new_tokens,
    sampling=sampling,
    eos_id=None,
    pad_id=0,
    cache_length=cache_length,
  )
  with sharding.use_mesh(mesh):
    return autoregressive.AutoregressiveLoop.__call__.lower(
      loop, dynamic, *_prompt_arguments(mesh, batch, prompt_length)
    )


def _prompt_arguments(mesh, batch: int, prompt_length: int) -> tuple[Any, Any, Any]:
  """Abstract prompts [B, T], prompt lengths [B] and a random key, replicated: the loops'
  per-call inputs."""
  key = jax.eval_shape(lambda: jax.random.key(0))
  return (
    _replicated(mesh, (batch, prompt_length), jnp.int32),
    _replicated(mesh, (batch,), jnp.int32),
    _replicated(mesh, key.shape, key.dtype),
  )


def _step_costs(config: TransformerConfig, mesh, batch: int, tokens: int, cache_length: int):
  """(flops, bytes accessed) per chip of one cached call of ``tokens`` per row through the
  whole depth, by XLA's cost analysis (a secondary column: ``hlo_bytes`` says why its bytes
  are no HBM count). It counts a while body once, so it is read from unrolled programs of
  one and two layer periods (Gemma 2 alternates windows: a period of 2) and extrapolated
  linearly to the full depth."""
  period = config.sliding_window_pattern if config.sliding_window else 1
  costs = []
  for depth in (period, 2 * period):
    shallow = config.replace(num_layers=depth, scan_layers=False)
    program = compile_program(
      "step", lower_call(abstract_model(shallow, mesh), mesh, batch, tokens, cache_length)
    )
    costs.append((program.flops, program.bytes_accessed))
  periods = config.num_layers / period
  return tuple(one + (periods - 1) * (two - one) for one, two in zip(*costs))


def bytes_per_chip(tree: Any) -> int:
  """Bytes one device holds of a tree of sharded arrays (or ShapeDtypeStructs)."""
  return sum(
    math.prod(leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
    for leaf in jax.tree.leaves(tree)
  )


def smallest_layer_matrix(model: Any, num_layers: int) -> int:
  """Bytes per chip of the smallest weight matrix of one layer: the stacked block
  parameters of at least two dimensions per layer, one device's shard, over the layers."""
  sizes = [
    math.prod(leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize // num_layers
    for leaf in jax.tree.leaves(model)
    if leaf.ndim >= 3 and leaf.shape[0] == num_layers
  ]
  return min(sizes) if sizes else 1 << 20


def count_call_bytes(
  config: TransformerConfig,
  model: Any,
  mesh,
  tokens: int,
  cache_length: int,
  experts_per_chip: float = 0.0,
  batch: int = 1,
) -> tuple[Program, hlo_bytes.ByteCount]:
  """The HBM bytes per chip of one cached call of ``tokens`` (``batch`` rows) at a full cache, from
  the compiled program users run (layers scanned): each blocked attention read covers every
  block of the cache, and an MoE layer's expert loop the ``experts_per_chip`` experts the
  call selects on each chip (the first is peeled off the loop). Intermediates written to
  HBM that are as large as the layer's smallest weight matrix are listed as materialised."""
  program = compile_program("call", lower_call(model, mesh, batch, tokens, cache_length))
  counted = hlo_bytes.count(
    program.hlo,
    _dynamic_trips(config, cache_length, experts_per_chip),
    min_bytes=smallest_layer_matrix(model, config.num_layers),
  )
  return program, counted


def _dynamic_trips(
  config: TransformerConfig, cache_length: int, experts_per_chip: float, num_draft_tokens: int = 1
) -> Callable[[hlo_bytes.Instruction], float]:
  """Trips of a data-dependent ``while`` for ``hlo_bytes.count``, from its scope: a blocked
  attention read covers every block of a full cache, an MoE layer's expert loop the experts
  selected per chip (the first is peeled off the loop), the draft loop K - 1 (the first
  draft call precedes it); anything else once."""
  blocks = 1.0
  if 0 < config.attention_block_size < cache_length:
    blocks = float(-(-cache_length // config.attention_block_size))

  def trips(instruction: hlo_bytes.Instruction) -> float:
    scopes = instruction.op_name.split("/")
    if "attention" in scopes[-3:]:  # .../attention/while, .../attention/shard_map/while
      return blocks
    if "mlp" in scopes:
      return max(experts_per_chip - 1.0, 0.0)
    if hlo_ops.phase_of(instruction.attributes) == "draft":
      return num_draft_tokens - 1.0
    return 1.0

  return trips


def loop_materialised(
  program: Program,
  config: TransformerConfig,
  num_draft_tokens: int,
  cache_length: int,
  min_bytes: int,
  experts_per_chip: float = 0.0,
) -> list[dict[str, Any]]:
  """The weight-sized buffers a compiled sampling loop writes to HBM, not in place: its
  prefill and one iteration (the outer loop counted once, the draft loop K - 1 times, the
  blocked attention over a full cache, an MoE layer's expert loop over the experts selected
  per chip), largest traffic first."""
  trips = _dynamic_trips(config, cache_length, experts_per_chip, num_draft_tokens)
  return _materialised(hlo_bytes.count(program.hlo, trips, min_bytes=min_bytes))


def _materialised(counted: hlo_bytes.ByteCount) -> list[dict[str, Any]]:
  """A count's materialised buffers as report rows."""
  return [
    {
      "opcode": m.opcode,
      "shape": m.shape,
      "mb": m.bytes / 1e6,
      "times": m.times,
      "op_name": m.op_name,
    }
    for m in counted.materialised
  ]


def call_bytes_row(counted: hlo_bytes.ByteCount) -> dict[str, Any]:
  """The byte count's report fields: weights ('m.' arguments) held and read, and their
  ratio over the weights read at all (an untied embedding table, of which a lookup gathers
  rows, is listed apart), the cache read and written, intermediates, and what is
  materialised."""
  weights = {k: v for k, v in counted.arguments.items() if k.startswith("m.")}
  read = {k: counted.reads.get(k, 0.0) for k in weights}
  gathered = sorted(k for k in weights if read[k] < 0.01 * weights[k])
  streamed = [k for k in weights if k not in gathered]
  held_streamed = sum(weights[k] for k in streamed)
  return {
    "weights_gb": sum(weights.values()) / 1e9,
    "weights_read_gb": sum(read.values()) / 1e9,
    "weights_read_ratio": sum(read[k] for k in streamed) / max(held_streamed, 1),
    "gathered": gathered,
    "per_weight_ratio": {k: read[k] / weights[k] for k in streamed if weights[k]},
    "cache_read_gb": counted.read_of("c.") / 1e9,
    "cache_written_gb": sum(v for k, v in counted.writes.items() if k.startswith("c.")) / 1e9,
    "intermediate_gb": (
      counted.reads.get("(intermediate)", 0.0) + counted.writes.get("(intermediate)", 0.0)
    )
    / 1e9,
    "hbm_gb": (counted.read_bytes + counted.written_bytes) / 1e9,
    "materialised": _materialised(counted),
  }


def run(config: Any, topology: str | None = None, log: Callable[[str], None] = print) -> dict:
  """Compiles the pair config's loops and step calls for ``topology`` (default
  ``config.aot.topology``); returns the report (``format_report`` prints it)."""
  topology = topology or config.aot.topology
  # Checked before anything compiles: a misspelled verifier was a KeyError traceback after the
  # autoregressive loop's compile, and a batch size that is not an int failed there too.
  for verifier in config.aot.verifiers.split(","):
    if verifier not in speculative.EXACT_VERIFIERS:
      raise ValueError(
        f"--config.aot.verifiers={config.aot.verifiers!r}: each must be one of "
        f"{speculative.EXACT_VERIFIERS}."
      )
  sizes = config.aot.batch_sizes.split(",")
  if not all(size.strip().isdigit() and int(size) >= 1 for size in sizes):
    raise ValueError(
      f"--config.aot.batch_sizes={config.aot.batch_sizes!r}: must be comma-separated ints >= 1."
    )
  devices = slice_devices(topology)
  spec = SLICES[topology]
  mesh = make_mesh(devices, {k: config.mesh.get(k, 1) for k in sharding.MESH_AXES})
  chips = len(devices)
  hbm = spec.hardware.usable  # What libtpu lets a program use of the chip's HBM.
  target_cfg = model_config(config.target.model, config.aot.get("target_hf_config"))
  draft_cfg = model_config(config.draft.model, config.aot.get("draft_hf_config"))
  real_vocab = int(config.aot.get("real_vocab_size") or 0)
  s, num_draft_tokens = config.sampling, config.speculative.num_draft_tokens
  sampling = SamplingConfig(s.temperature, s.top_k, s.top_p)
  cache_length = config.aot.cache_length
  prompt_length = cache_length - s.max_new_tokens - num_draft_tokens - 1
  if prompt_length < 1:
    raise ValueError(
      f"--config.aot.cache_length={cache_length}: must exceed max_new_tokens + K + 1 = "
      f"{s.max_new_tokens + num_draft_tokens + 1}."
    )
  log(
    f"{topology}: {chips} chips ({devices[0].device_kind}, {hbm / 2**30:.2f} GiB of HBM usable "
    "each), "
    f"mesh {dict(mesh.shape)}; target {target_cfg.num_layers} x {target_cfg.d_model}, draft "
    f"{draft_cfg.num_layers} x {draft_cfg.d_model}, {target_cfg.param_dtype}"
  )
  report: dict[str, Any] = {
    "topology": topology,
    "chips": chips,
    "device_kind": devices[0].device_kind,
    "hbm_bytes": spec.hardware.memory_bytes,
    "usable_hbm_bytes": hbm,
    "mesh": dict(mesh.shape),
    "cache_length": cache_length,
    "num_draft_tokens": num_draft_tokens,
    "programs": [],
  }
  with sharding.use_rules(sharding.parse_rules(config.mesh.get("rules", ""))):
    target = abstract_model(target_cfg, mesh)
    draft = abstract_model(draft_cfg, mesh)
    if real_vocab and draft_cfg.vocab_size != target_cfg.vocab_size:
      # Embeddings padded differently over the same real tokens (Qwen2.5 0.5B / 72B).
      draft = model_protocol.PaddedVocabulary(
        draft, target_cfg.vocab_size, real_vocab_size=real_vocab
      )
      report["padded_draft_vocabulary"] = [draft_cfg.vocab_size, target_cfg.vocab_size]
      log(f"  draft vocabulary {draft_cfg.vocab_size} padded to {target_cfg.vocab_size}")
    model_protocol.check_same_vocabulary(target, draft)

    def record(program: Program, batch: int, **extra) -> Program:
      row = {
        "program": program.name,
        "batch": batch,
        "compile_s": program.compile_s,
        "argument_gib": program.argument_bytes / 2**30,
        "temp_gib": program.temp_bytes / 2**30,
        "output_gib": program.output_bytes / 2**30,
        "total_gib": program.total_bytes / 2**30,
        "fits": program.total_bytes <= hbm,
        **extra,
      }
      report["programs"].append(row)
      log(
        f"  {program.name:<28} batch {batch:>3}: compiled in {program.compile_s:6.1f} s; per "
        f"chip {row['argument_gib']:.2f} GiB arguments + {row['temp_gib']:.2f} temporaries + "
        f"{row['output_gib']:.3f} output = {row['total_gib']:.2f} GiB "
        f"({'fits' if row['fits'] else 'DOES NOT FIT'} {hbm / 2**30:.2f} GiB)"
      )
      return program

    common = dict(prompt_length=prompt_length, max_new_tokens=s.max_new_tokens)
    record(
      compile_or_refuse(
        "autoregressive loop",
        lower_autoregressive(
          target, mesh, batch=1, sampling=sampling, cache_length=cache_length, **common
        ),
        f"{topology} with mesh {dict(mesh.shape)}",
      ),
      1,
    )

    def speculative_program(verifier: str, batch: int, name: str) -> Program | None:
      """The compiled program, or None when the TPU compiler refuses it for HBM."""
      lowered = lower_speculative(
        target,
        draft,
        mesh,
        batch=batch,
        num_draft_tokens=num_draft_tokens,
        verifier=verifier,
        sampling=sampling,
        cache_length=cache_length,
        **common,
      )
      start = time.perf_counter()
      try:
        return record(compile_program(name, lowered), batch)
      except jax.errors.JaxRuntimeError as error:
        message = compiler_refusal(error)
        if message is None:
          raise
        report["programs"].append(
          {
            "program": name,
            "batch": batch,
            "compile_s": time.perf_counter() - start,
            "fits": False,
            "compiler": message,
          }
        )
        log(f"  {name:<28} batch {batch:>3}: DOES NOT FIT: {message}")
        return None

    verifiers = config.aot.verifiers.split(",")
    speculative_programs = {
      (verifier, batch): speculative_program(verifier, batch, f"speculative loop ({verifier})")
      for verifier in verifiers
      for batch in (int(b) for b in config.aot.batch_sizes.split(","))
    }
    speculative_programs = {
      key: program for key, program in speculative_programs.items() if key[0] == verifiers[0]
    }
    counted = next((p for p in speculative_programs.values() if p is not None), None)
    if counted is not None:  # Launched operations per iteration, by phase (hlo_ops).
      report["ops_per_iteration"] = hlo_ops.count_loop_ops(counted.hlo, num_draft_tokens)
      log(f"  launched ops per speculative iteration: {report['ops_per_iteration']}")
      experts = 0.0
      if target_cfg.num_experts:
        experts = perf_model.busiest_chip_experts(target_cfg, 1, mesh.shape["expert"])
      report["loop_materialised"] = loop_materialised(
        counted,
        target_cfg,
        num_draft_tokens,
        cache_length,
        smallest_layer_matrix(target, target_cfg.num_layers),
        experts,
      )
      for m in report["loop_materialised"]:
        log(
          f"    materialised in the loop: {m['opcode']} {m['shape']} {m['mb']:.1f} MB x "
          f"{m['times']:g} ({m['op_name'] or 'no scope'})"
        )
    if config.aot.get("fit_batch"):
      report["largest_batch"], report["largest_batch_exact"] = _largest_batch(
        speculative_programs,
        hbm,
        lambda batch: speculative_program(verifiers[0], batch, "speculative loop (largest)"),
      )
      log(f"  largest batch that fits: {_largest_batch_words(report)}")

    # Per-step costs: collectives from the scanned decode step (its layer loop runs L times),
    # FLOPs and bytes from unrolled programs, against HBM bandwidth and the performance model.
    step = compile_program(
      "target decode step",
      lower_call(target, mesh, 1, 1, cache_length),
      trips=lambda body: target_cfg.num_layers,
    )
    report["collectives_per_target_step"] = {k: v for k, v in step.collectives.items() if v}
    log(f"  collectives per target decode step: {report['collectives_per_target_step']}")
    # The model's mesh: tensor parallel over 'tensor', experts over 'expert', the rest
    # replicated ('data').
    tensor, expert = mesh.shape["tensor"], mesh.shape["expert"]
    mesh_shape = perf_model.MeshShape(data=chips // (tensor * expert), tensor=tensor, expert=expert)
    steps = []
    for name, model_cfg, model, tokens, paper_ms in (
      ("target step", target_cfg, target, 1, perf_model.PAPER["target_ms"]),
      ("draft step", draft_cfg, draft, 1, perf_model.PAPER["draft_ms"]),
      (
        f"target scoring {num_draft_tokens + 1}",
        target_cfg,
        target,
        num_draft_tokens + 1,
        None,
      ),
      # A parallel draft of the draft's shape proposes K drafts from one call of width 2K
      # (parallel_drafter.window); lowered here with logits at every position, which the
      # drafter itself reads at the last K only: an upper bound on its cost.
      (f"draft parallel {2 * num_draft_tokens}", draft_cfg, draft, 2 * num_draft_tokens, None),
    ):
      if isinstance(model, model_protocol.PaddedVocabulary):
        model = model.model
      experts = 0.0
      if model_cfg.num_experts:  # The experts a call's tokens select on the busiest chip.
        experts = perf_model.busiest_chip_experts(model_cfg, tokens, expert)
      _, counted = count_call_bytes(model_cfg, model, mesh, tokens, cache_length, experts)
      row = call_bytes_row(counted)
      flops, bytes_accessed = _step_costs(model_cfg, mesh, 1, tokens, cache_length)
      call = perf_model.call_cost(model_cfg, spec.hardware, mesh_shape, 1, tokens, cache_length)
      steps.append(
        {
          "call": name,
          **row,
          "hbm_ms": row["hbm_gb"] * 1e9 / spec.hardware.memory_bandwidth * 1e3,
          "model_gb_per_chip": (call.weight_bytes + call.kv_bytes) / 1e9,
          "model_floor_ms": call.memory_s * 1e3,
          "paper_ms": paper_ms,
          "xla_gb_accessed": bytes_accessed / 1e9,
          "gflops_per_chip": flops / 1e9,
        }
      )
      log(
        f"  {name:<18}: HBM {row['hbm_gb']:.3f} GB per chip -> {steps[-1]['hbm_ms']:.2f} ms; "
        f"weights read {row['weights_read_gb']:.3f} of {row['weights_gb']:.3f} GB "
        f"({row['weights_read_ratio']:.3f}x of those streamed; gathered: "
        f"{', '.join(row['gathered']) or 'none'}), cache {row['cache_read_gb']:.3f} GB, "
        f"intermediates {row['intermediate_gb']:.3f} GB, materialised "
        f"{len(row['materialised'])}; performance model "
        f"{steps[-1]['model_gb_per_chip']:.3f} GB, {steps[-1]['model_floor_ms']:.2f} ms; XLA's "
        f"cost analysis {bytes_accessed / 1e9:.3f} GB, {flops / 1e9:.2f} GFLOP"
        + (f"; paper {paper_ms} ms" if paper_ms else "")
      )
      for m in row["materialised"]:
        log(f"    materialised: {m['opcode']} {m['shape']} {m['mb']:.1f} MB x {m['times']:g}")
    report["steps"] = steps
    # What one parallel pass costs in draft steps on this slice, by the roofline of the HLO
    # byte count and XLA's FLOPs (issue 39's goal: <= 1.5 at K = 4).
    roofline = {
      row["call"]: max(row["hbm_ms"], row["gflops_per_chip"] * 1e9 / spec.hardware.peak_flops * 1e3)
      for row in steps
    }
    report["parallel_pass_draft_steps"] = (
      roofline[f"draft parallel {2 * num_draft_tokens}"] / roofline["draft step"]
    )
    log(
      f"  a parallel draft pass of K={num_draft_tokens} (width {2 * num_draft_tokens}): "
      f"{report['parallel_pass_draft_steps']:.3f} draft steps by the roofline (HBM bytes "
      "from the HLO, FLOPs from XLA)"
    )
  return report


def _largest_batch(
  programs: dict, hbm: int, compile_at: Callable[[int], Program | None], max_compiles: int = 4
) -> tuple[int, bool]:
  """The largest batch whose speculative program fits ``hbm`` per chip, verified by
  compiling it, and whether it is the largest: True when the next batch was compiled and did
  not fit, False when the ``max_compiles`` compiles ran out first (then it is a lower bound).
  While no larger batch has failed, each guess is linear in the batch through the two largest
  fitting sizes (never past 8x the largest); then bisection between the largest size that fit
  and the smallest larger one that did not. Until 2026-11-30 the line stayed through the two
  smallest, so once a guess fitted the search crept up by one per compile (batch 14 of a true
  38 reported), and a smaller batch refused below a larger one that fitted ended the search
  with no compile."""
  used = {b: p.total_bytes for (_, b), p in programs.items() if p is not None}
  fits = {b: p is not None and p.total_bytes <= hbm for (_, b), p in programs.items()}
  for _ in range(max_compiles):
    low = max((b for b, ok in fits.items() if ok), default=0)
    high = min((b for b, ok in fits.items() if not ok and b > low), default=None)
    if high is not None and high - low <= 1:
      break
    fitting = sorted(b for b, ok in fits.items() if ok)
    guess = 2 * max(low, 1)
    if high is not None:
      guess = (low + high) // 2
    elif len(fitting) >= 2:
      b1, b2 = fitting[-2:]
      per_row = (used[b2] - used[b1]) / (b2 - b1)
      if per_row > 0:
        # Linear in the batch, but never more than 8x past what fitted: the compiler's
        # temporaries are not linear (Qwen2.5-72B's batch 2 took less than its batch 1).
        guess = min(int(b2 + (hbm - used[b2]) // per_row), 8 * max(low, 1))
    if guess in fits or guess <= low:
      guess = low + 1
    program = compile_at(guess)
    fits[guess] = program is not None and program.total_bytes <= hbm
    if program is not None:
      used[guess] = program.total_bytes
  largest = max((b for b, ok in fits.items() if ok), default=0)
  return largest, fits.get(largest + 1) is False


def _largest_batch_words(report: dict) -> str:
  """``largest_batch`` in words: the batch, and "at least" when the search stopped short."""
  if report.get("largest_batch_exact", True):
    return str(report["largest_batch"])
  return f"at least {report['largest_batch']} (the search's compiles ran out before the next)"


def format_report(report: dict) -> str:
  """The report as Markdown tables."""
  columns = [
    "program",
    "batch",
    "compile_s",
    "argument_gib",
    "temp_gib",
    "output_gib",
    "total_gib",
    "fits",
    "compiler",
  ]
  programs = perf_model.format_table(
    [{c: row.get(c, "") for c in columns} for row in report["programs"]], columns
  )
  steps = perf_model.format_table(
    [{**row, "materialised": len(row["materialised"])} for row in report["steps"]],
    [
      "call",
      "hbm_gb",
      "hbm_ms",
      "weights_gb",
      "weights_read_gb",
      "weights_read_ratio",
      "cache_read_gb",
      "intermediate_gb",
      "materialised",
      "model_gb_per_chip",
      "model_floor_ms",
      "xla_gb_accessed",
      "gflops_per_chip",
      "paper_ms",
    ],
  )
  return (
    f"{report['topology']} ({report['chips']} x {report['device_kind']}, mesh {report['mesh']}), "
    f"cache {report['cache_length']} slots, K = {report['num_draft_tokens']}\n\n{programs}\n\n"
    f"collectives per target decode step: {report['collectives_per_target_step']}"
    + (
      f"; largest batch that fits: {_largest_batch_words(report)}"
      if "largest_batch" in report
      else ""
    )
    + f"\n\n{steps}\n\na parallel draft pass of K = {report['num_draft_tokens']} (width "
    f"{2 * report['num_draft_tokens']}) costs {report['parallel_pass_draft_steps']:.3f} draft "
    "steps by the roofline"
  )
