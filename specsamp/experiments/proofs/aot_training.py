r"""Drafter training at the size of a slice, compiled ahead of time for TPUs on any machine.

Two programs a user runs to train an EAGLE-3-style head for their own model
(docs/training_on_answers.md), compiled here for a TPU slice with libtpu and no TPU
(``aot.slice_devices``), from the target's HF ``config.json``:

- **the head's training step** (``feature_train.FeatureTrainer``): the frozen target's forward
  pass for its features and logits, ``ttt_steps`` unrolled head steps, the KL to the target,
  the AdamW update; the target's parameters sharded by ``train_mesh`` (FSDP: each chip holds
  1/n of them and gathers a layer at a time);
- **the regeneration loop** (``autoregressive.AutoregressiveLoop``, greedy): the target
  answering a batch of prompts, tensor-parallel (``regen_mesh``), as decoding wants: no chip
  gathers another's weights. scripts/regenerate.py decodes with the same model calls but in
  ``compacting.generate``'s separately jitted start and advance steps (rows refilled as they
  end), and half its answers at T = 0.8 / top-p 0.95 (which sorts the vocabulary's logits each
  step): this program's memory and decode rate are the greedy decode's, its prefill not
  counted (about 15% of the roofline on v5e-8).

For each: compile time and memory per chip (against the chip's HBM), and a predicted rate:
training tokens/s from the FLOPs a step must do (2 x the target's parameters but its input
table per token for its forward pass, the output head included, tied or not; 6 x the head's
per token and unrolled step, and attention's
2 x 2 x layers x seq_len x width per token for the target) at the chip's peak, and
regeneration tokens/s from the HBM bytes of one decode step per chip at a full cache, counted
from its optimized HLO (``hlo_bytes``: every weight read, the cache read and written,
intermediates), at HBM bandwidth; the analytic count (its weight shard and cache shard) beside
it. Both are rooflines, upper bounds; the
report prints them at 100% and at a stated utilisation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specsamp import sharding
from specsamp.experiments.proofs import aot
from specsamp.hf import architectures
from specsamp.models import feature_head, transformer
from specsamp.models.config import TransformerConfig
from specsamp.sampling.warping import SamplingConfig
from specsamp.training import feature_train

UTILISATION = 0.4
"""The fraction of the roofline the report's second rate assumes (MFU / bandwidth use a
well-tuned JAX training or decoding step reaches on TPUs; an assumption, stated)."""


@dataclasses.dataclass(frozen=True)
class Plan:
  """What to compile: the slice, the meshes and the sizes."""

  topology: str
  train_mesh: dict[str, int]
  regen_mesh: dict[str, int]
  batch_size: int = 8  # Training sequences per step (global).
  seq_len: int = 2048
  ttt_steps: int = 7  # EAGLE-3's.
  draft_vocab_size: int = 32_000  # EAGLE-3's draft vocabulary for Llama-3.1-8B.
  regen_batch: int = 64
  regen_prompt_tokens: int = 512
  regen_new_tokens: int = 512
  param_dtype: str = "bfloat16"
  programs: tuple[str, ...] = ("training", "regeneration")  # Which to compile.

  def __post_init__(self):
    unknown = set(self.programs) - {"training", "regeneration"}
    if not self.programs or unknown:
      raise ValueError(f"programs must be some of training, regeneration; got {self.programs}.")


def _target_config(hf_config: str, param_dtype: str) -> TransformerConfig:
  return architectures.from_hf(
    architectures.read_config(hf_config), param_dtype=param_dtype, dtype=param_dtype
  )


def _parameters(factory: Callable[[Any], Any]) -> int:
  return sharding.count_parameters(factory)


def training_flops_per_token(
  target: TransformerConfig, head_params: int, seq_len: int, ttt_steps: int
) -> float:
  """FLOPs per training token of a head's step (module docstring)."""
  total = _parameters(lambda rngs: transformer.Transformer(target, rngs=rngs))
  # The input table is a lookup, no FLOPs; the output head is a matmul over all V rows (the
  # step reads the target's logits). Tied, the one table is both, so nothing is taken off:
  # subtracting it there left out 2 V D per token (24% of Llama-3.2-1B's; 2026-11-30).
  lookup = 0 if target.tie_embeddings else target.vocab_size * target.d_model
  forward = 2.0 * (total - lookup) + 4.0 * target.num_layers * seq_len * target.d_model
  return forward + 6.0 * head_params * ttt_steps


def decode_bytes_per_chip(
  target: TransformerConfig, mesh: jax.sharding.Mesh, batch: int, cache_length: int
) -> float:
  """Bytes one decode step reads per chip at a full cache: its shard of every weight and of
  the cache's keys and values."""
  model = aot.abstract_model(target, mesh)
  cache = aot.abstract_cache(model, mesh, batch, cache_length)
  return float(aot.bytes_per_chip(model) + aot.bytes_per_chip((cache.keys, cache.values)))


def run(hf_config: str, plan: Plan, log: Callable[[str], None] = print) -> dict[str, Any]:
  """Compiles both programs for ``plan.topology`` (module docstring); returns the report."""
  devices = aot.slice_devices(plan.topology)
  hardware = aot.SLICES[plan.topology].hardware
  chips = len(devices)
  target_cfg = _target_config(hf_config, plan.param_dtype)
  report: dict[str, Any] = {
    "hf_config": hf_config,
    "topology": plan.topology,
    "chips": chips,
    "device_kind": devices[0].device_kind,
    "hbm_gib": hardware.memory_bytes / 2**30,
    "usable_hbm_gib": hardware.usable / 2**30,
    "plan": dataclasses.asdict(plan),
    "programs": [],
  }
  log(
    f"{plan.topology}: {chips} chips ({devices[0].device_kind}, "
    f"{hardware.usable / 2**30:.2f} GiB of HBM usable each); target {target_cfg.num_layers} x "
    f"{target_cfg.d_model}, vocabulary {target_cfg.vocab_size:,}, {plan.param_dtype}"
  )

  if "training" in plan.programs:
    report["programs"].append(_training_step(target_cfg, plan, devices, hardware))
    log(_line(report["programs"][-1], "training tokens/s"))
  if "regeneration" in plan.programs:
    report["programs"].append(_regeneration_loop(target_cfg, plan, devices, hardware))
    log(_line(report["programs"][-1], "answer tokens/s"))
  return report


def _training_step(target_cfg: TransformerConfig, plan: Plan, devices, hardware) -> dict:
  """The head's training step, compiled; its row of the report."""
  chips = len(devices)
  mesh = aot.make_mesh(devices, plan.train_mesh)
  target = aot.abstract_model(target_cfg, mesh)
  head_cfg = feature_head.FeatureHeadConfig(draft_vocab_size=plan.draft_vocab_size)
  train_cfg = feature_train.FeatureTrainConfig(
    steps=10_000,
    batch_size=plan.batch_size,
    seq_len=plan.seq_len,
    learning_rate=1e-4,
    warmup_steps=100,
    distill_mode="token",
    ttt_steps=plan.ttt_steps,
  )
  draft_map = np.arange(plan.draft_vocab_size) if plan.draft_vocab_size else None
  trainer = feature_train.FeatureTrainer(head_cfg, target, train_cfg, mesh, draft_map)
  batch = jax.ShapeDtypeStruct(
    (plan.batch_size, plan.seq_len + 1), jnp.int32, sharding=trainer._batch_sharding
  )
  # The step on regenerated answers: tokens and their answer weights (``answers.batches``),
  # the target run in the step (a slice's hosts store nothing: ``target_store``).
  weights = jax.ShapeDtypeStruct(batch.shape, jnp.float32, sharding=trainer._batch_sharding)
  with sharding.use_mesh(mesh):
    lowered = trainer._step.lower(
      trainer.abstract_state, batch, weights, nnx.split(target)[1], None
    )
  program = aot.compile_or_refuse(
    "head training step", lowered, f"{plan.topology} with mesh {dict(mesh.shape)}"
  )
  head_params = _parameters(
    lambda rngs: feature_head.FeatureHead(trainer.head_config, target_cfg, rngs=rngs)
  )
  flops = training_flops_per_token(target_cfg, head_params, plan.seq_len, plan.ttt_steps)
  roofline = chips * hardware.peak_flops / flops
  return _row(
    program,
    hardware,
    mesh,
    tokens_per_s=roofline,
    head_parameters=head_params,
    flops_per_token=flops,
  )


def _regeneration_loop(target_cfg: TransformerConfig, plan: Plan, devices, hardware) -> dict:
  """The regeneration loop, compiled, and a decode step's HBM bytes; its row of the report."""
  mesh = aot.make_mesh(devices, plan.regen_mesh)
  target = aot.abstract_model(target_cfg, mesh)
  cache_length = plan.regen_prompt_tokens + plan.regen_new_tokens
  lowered = aot.lower_autoregressive(
    target,
    mesh,
    batch=plan.regen_batch,
    prompt_length=plan.regen_prompt_tokens,
    max_new_tokens=plan.regen_new_tokens,
    sampling=SamplingConfig(0.0),
    cache_length=cache_length,
  )
  program = aot.compile_or_refuse(
    "regeneration loop", lowered, f"{plan.topology} with mesh {dict(mesh.shape)}"
  )
  # The HBM bytes of one decode step at a full cache, counted from its optimized HLO
  # (``hlo_bytes``: each weight's reads, the cache, intermediates), beside the analytic count.
  _, counted = aot.count_call_bytes(
    target_cfg, target, mesh, 1, cache_length, batch=plan.regen_batch
  )
  step_bytes = counted.read_bytes + counted.written_bytes
  rate = plan.regen_batch * hardware.memory_bandwidth / step_bytes
  analytic = decode_bytes_per_chip(target_cfg, mesh, plan.regen_batch, cache_length)
  return _row(
    program,
    hardware,
    mesh,
    tokens_per_s=rate,
    decode_step_hlo_gib=step_bytes / 2**30,
    decode_step_analytic_gib=analytic / 2**30,
  )


def _row(program: aot.Program, hardware: Any, mesh, *, tokens_per_s: float, **extra) -> dict:
  return {
    "program": program.name,
    "mesh": dict(mesh.shape),
    "compile_s": program.compile_s,
    "total_gib": program.total_bytes / 2**30,
    "argument_gib": program.argument_bytes / 2**30,
    "temp_gib": program.temp_bytes / 2**30,
    "fits": program.total_bytes <= hardware.usable,
    "hlo_text_bytes": len(program.hlo),
    "tokens_per_s_roofline": tokens_per_s,
    "tokens_per_s_at_utilisation": tokens_per_s * UTILISATION,
    **extra,
  }


def _line(row: dict, unit: str) -> str:
  mesh = ",".join(f"{k}={v}" for k, v in row["mesh"].items() if v > 1)
  return (
    f"  {row['program']} (mesh {mesh}): compiled in {row['compile_s']:.1f} s, "
    f"{row['total_gib']:.2f} GiB per chip ({'fits' if row['fits'] else 'does NOT fit'}); "
    f"{unit}: {row['tokens_per_s_roofline']:,.0f} at the roofline, "
    f"{row['tokens_per_s_at_utilisation']:,.0f} at {UTILISATION:.0%}"
  )
