r"""An analytic roofline of a decode step, calibrated, and what it predicts for speculation.

One call of a transformer processing T tokens for each of B rows, with a KV
cache of S slots, on a mesh of ``data x tensor`` chips (Megatron tensor
parallelism over heads, MLP and vocabulary; the batch over ``data``):

  bytes/chip  = weights / tensor                 (every weight read once per call;
                                                 the embedding table is gathered, not read)
              + B/data * S * L * 2 * K * H * act_bytes / tensor          (KV cache)
  FLOPs/chip  = (2 * matmul_params * B * T + 4 * L * B * T * S * N * H) / (data * tensor)
  collectives = L * 2 all-reduces of [B/data, T, D] (attention out, MLP out) and one
                all-gather of the [B/data, T, V] logits, each = latency
                + ring bytes / interconnect bandwidth;  none when tensor == 1
  t(call)     = tau + max(bytes / (eta * bandwidth), FLOPs / (eta * peak)) + collectives

Two efficiency parameters, calibrated to measurements (``calibrate``):
  eta  the fraction of the roofline reached (achieved over peak bandwidth, and
       over peak FLOP/s when compute-bound), in (0, 1];
  tau  a fixed cost per call: dispatch, sampling, small unfused ops.
Everything else is hardware data (``PRESETS``) or the config's shapes.

Assumptions (documented in docs/benchmarks.md as well): S is the cache the
call reads (specsamp reads all its slots, so S = cache length); activations
and caches in the config's ``dtype``; the collective latency is a preset
constant, not fitted; compute and memory overlap perfectly (the max), and
collectives do not overlap with either.

With the step times, the speedup formula of ``speedup.py`` gives what
speculation should reach, ``implied_acceptance`` inverts it (the alpha a
measured speculative ms/token implies), and ``recommend`` picks K and the
draft for a measured alpha.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from specsamp.experiments.benchmarks.speedup import expected_tokens_per_call, predicted_speedup
from specsamp.models.config import TransformerConfig


@dataclasses.dataclass(frozen=True)
class Hardware:
  """One chip's roofline, and the interconnect between chips."""

  name: str
  memory_bandwidth: float  # Bytes/s of HBM (or DRAM) per chip.
  peak_flops: float  # FLOP/s per chip at bfloat16 (CPU: float32, measured).
  interconnect_bandwidth: float  # Bytes/s per chip, one direction, for collectives.
  collective_latency_s: float  # Fixed cost of one small all-reduce (an assumption).
  memory_bytes: float  # HBM per chip.
  # What a program may use of it, as the chip's compiler reports it ("exceeds available HBM
  # (15.75G)" on a v5e): the firmware keeps the rest. None: all of memory_bytes.
  usable_bytes: float | None = None

  @property
  def usable(self) -> float:
    return self.memory_bytes if self.usable_bytes is None else self.usable_bytes


PRESETS = {
  # Chen et al. used 16 of these. 1.2 TB/s and 275 TFLOP/s are Google's published numbers;
  # ICI ~300 GB/s per chip (6 links); decode collectives are tiny, so latency dominates.
  # Usable HBM: libtpu's own limit in its refusals ("exceeds available HBM (30.75G)"), the
  # limit a compiled program is held to (it does not refuse every program past it).
  "tpu_v4": Hardware("TPU v4", 1.2e12, 275e12, 300e9, 10e-6, 32 * 2**30, 30.75 * 2**30),
  "tpu_v5e": Hardware("TPU v5e", 819e9, 197e12, 200e9, 10e-6, 16 * 2**30, 15.75 * 2**30),
  # H100 SXM: HBM3 3.35 TB/s, 989 TFLOP/s dense bf16, NVLink 4 at 450 GB/s per direction.
  "h100": Hardware("H100 SXM", 3.35e12, 989e12, 450e9, 15e-6, 80e9),
  "h200": Hardware("H200", 4.8e12, 989e12, 450e9, 15e-6, 141e9),
}


def cpu_hardware(
  memory_bandwidth: float, peak_flops: float, name: str = "CPU (measured)"
) -> Hardware:
  """This machine as the benchmark measured it (``timing.measure_*``); one device, no links."""
  return Hardware(name, memory_bandwidth, peak_flops, float("inf"), 0.0, float("inf"))


@dataclasses.dataclass(frozen=True)
class Efficiency:
  """The two calibrated parameters (see the module docstring)."""

  eta: float = 1.0
  tau_s: float = 0.0

  def __post_init__(self):
    if not 0 < self.eta <= 1.5:  # Above 1 only when a calibration says the peak is understated.
      raise ValueError(f"eta must be in (0, 1.5], got {self.eta}.")
    if self.tau_s < 0:
      raise ValueError(f"tau_s must be >= 0, got {self.tau_s}.")


@dataclasses.dataclass(frozen=True)
class MeshShape:
  """How many chips a call spans (data x expert x tensor), for the analytic model; not a jax
  Mesh. The expert axis splits a mixture of experts' experts and replicates the rest."""

  data: int = 1
  tensor: int = 1
  expert: int = 1

  def __post_init__(self):
    for axis in ("data", "tensor", "expert"):
      if getattr(self, axis) < 1:
        raise ValueError(f"A mesh axis needs at least one chip: {axis}={getattr(self, axis)}.")

  @property
  def chips(self) -> int:
    return self.data * self.tensor * self.expert


def expected_experts(config: TransformerConfig, tokens: int) -> float:
  """The distinct experts per layer ``tokens`` routed tokens select, E (1 - (1 - k/E)^N),
  taking routing as uniform and independent (real routers correlate neighbouring tokens,
  which lowers it); 0 for a dense model."""
  e, k = config.num_experts, config.experts_per_token
  return e * (1.0 - (1.0 - k / e) ** tokens) if e else 0.0


def busiest_chip_experts(config: TransformerConfig, tokens: int, expert_chips: int) -> float:
  """The distinct experts per layer that the busiest of ``expert_chips`` chips holds among
  those ``tokens`` routed tokens select, in expectation: a step waits for that chip, where the
  mean (``expected_experts / expert_chips``) undercounts it (8 of 128 experts on 8 chips, one
  token: 2.5 against 1.0). Routing uniform and independent, as ``expected_experts``; experts
  split evenly over the chips in order (the rules table). One chip: ``expected_experts``."""
  e, k = config.num_experts, config.experts_per_token
  if not e:
    return 0.0
  if expert_chips < 1 or e % expert_chips:
    raise ValueError(f"{e} experts do not split evenly over {expert_chips} chips.")
  if expert_chips == 1:
    return expected_experts(config, tokens)
  if e * (1.0 - k / e) ** tokens < 1e-9:  # Every expert selected, but once in 10^9 calls.
    return float(e // expert_chips)
  return _busiest_chip_experts(e, k, tokens, expert_chips)


@functools.cache
def _busiest_chip_experts(e: int, k: int, tokens: int, chips: int, draws: int = 8_000) -> float:
  """Monte Carlo with a fixed seed (the same number every run): each draw routes ``tokens``
  tokens to k distinct experts each and counts the selected experts on each chip; the mean of
  the largest count (standard error about 0.01 expert: the largest count's spread is under one
  expert). Stops routing once every draw has selected every expert."""
  rng = np.random.default_rng(0)
  chosen = np.zeros((draws, e), bool)
  rows = np.arange(draws)[:, None]
  for _ in range(tokens):
    chosen[rows, np.argpartition(rng.random((draws, e)), k - 1, axis=1)[:, :k]] = True
    if chosen.all():
      break
  return float(chosen.reshape(draws, chips, e // chips).sum(-1).max(-1).mean())


@dataclasses.dataclass(frozen=True)
class Call:
  """What one model call costs, per chip, before efficiency."""

  weight_bytes: float
  kv_bytes: float
  flops: float
  collectives_s: float
  memory_s: float  # Bytes over peak bandwidth.
  compute_s: float  # FLOPs over peak.

  @property
  def bound(self) -> str:
    return "memory" if self.memory_s >= self.compute_s else "compute"

  @property
  def roofline_s(self) -> float:
    return max(self.memory_s, self.compute_s)

  def seconds(self, efficiency: Efficiency) -> float:
    return efficiency.tau_s + self.roofline_s / efficiency.eta + self.collectives_s


def parameter_counts(config: TransformerConfig) -> dict[str, int]:
  """Parameters by role: per-layer matmuls (with a mixture of experts: attention and the
  router), one expert's matmuls per layer (0 for a dense model), norms and biases, the
  embedding table, the output head."""
  d, f, h = config.d_model, config.ffn_dim, config.resolved_head_dim
  n, k, v = config.num_heads, config.num_kv_heads, config.vocab_size
  attention = d * n * h * 2 + d * k * h * 2
  mlp = d * f * (3 if config.gated_mlp else 2)
  expert = 0
  if config.num_experts:  # The router is read whole; the experts only as selected.
    mlp, expert = d * config.num_experts, mlp
  small = (4 if config.post_norms else 2) * d + (n * h + 2 * k * h if config.qkv_bias else 0)
  small += 2 * h if config.qk_norm else 0
  return {
    "matmul_per_layer": attention + mlp,
    "expert_per_layer": expert,
    "small_per_layer": small,
    "embedding": v * d,
    "head": 0 if config.tie_embeddings else d * v,
    "final_norm": d,
  }


def call_cost(
  config: TransformerConfig,
  hardware: Hardware,
  mesh: MeshShape,
  batch_size: int,
  num_tokens: int,
  cache_length: int,
) -> Call:
  """The roofline terms of one call on T = ``num_tokens`` tokens per row."""
  if batch_size < 1 or num_tokens < 1 or cache_length < 1:
    raise ValueError("batch_size, num_tokens and cache_length must be >= 1.")
  counts = parameter_counts(config)
  layers, tokens = config.num_layers, batch_size * num_tokens
  weight_itemsize = np.dtype(config.param_dtype).itemsize
  act_itemsize = np.dtype(config.dtype).itemsize
  head_params = counts["head"] or counts["embedding"]  # Tied: the table is the head.
  read_params = (
    layers * (counts["matmul_per_layer"] + counts["small_per_layer"])
    + head_params
    + counts["final_norm"]
  )
  # A mixture of experts reads the distinct experts the call's tokens select (moe.py's sparse
  # path), spread over the expert axis; each of them multiplies every token of the call. The
  # call waits for the chip holding the most of them (``busiest_chip_experts``).
  busiest = busiest_chip_experts(config, tokens, mesh.expert)
  expert_params = layers * busiest * counts["expert_per_layer"]  # On the busiest chip.
  weight_bytes = (
    read_params * weight_itemsize + tokens * config.d_model * weight_itemsize
  ) / mesh.tensor + expert_params * weight_itemsize / mesh.tensor
  # kv heads that do not divide the tensor axis are replicated over it (the rules table
  # splits no dimension unevenly): every chip holds and reads all of the k/v projections and
  # the whole cache of its rows. The cache is never split over the expert axis (attention is
  # replicated there). Both measured by the HLO byte count (docs/benchmarks.md).
  kv_split = mesh.tensor if config.num_kv_heads % mesh.tensor == 0 else 1
  kv_projection_bytes = layers * 2 * config.d_model * config.num_kv_heads
  kv_projection_bytes *= config.resolved_head_dim * weight_itemsize
  weight_bytes += kv_projection_bytes / kv_split - kv_projection_bytes / mesh.tensor
  kv_bytes = (
    batch_size
    * cache_length
    * layers
    * 2
    * config.num_kv_heads
    * config.resolved_head_dim
    * act_itemsize
  ) / (mesh.data * kv_split)
  matmul_flops = 2 * (layers * counts["matmul_per_layer"] + head_params) * tokens
  attention_flops = 4 * layers * tokens * cache_length * config.num_heads * config.resolved_head_dim
  # The busiest chip's experts multiply its rows' tokens (the expert axis replicates them).
  expert_flops = 2 * expert_params * tokens / (mesh.tensor * mesh.data)
  flops = (matmul_flops + attention_flops) / mesh.chips + expert_flops
  collectives = 0.0
  if mesh.tensor > 1:
    ring = (mesh.tensor - 1) / mesh.tensor
    rows = tokens / mesh.data
    all_reduce = (
      hardware.collective_latency_s
      + 2 * ring * rows * config.d_model * act_itemsize / hardware.interconnect_bandwidth
    )
    all_gather = (
      hardware.collective_latency_s
      + ring * rows * config.vocab_size * 4 / hardware.interconnect_bandwidth
    )
    collectives = layers * 2 * all_reduce + all_gather
  return Call(
    weight_bytes=weight_bytes,
    kv_bytes=kv_bytes,
    flops=flops,
    collectives_s=collectives,
    memory_s=(weight_bytes + kv_bytes) / hardware.memory_bandwidth,
    compute_s=flops / hardware.peak_flops,
  )


def feature_head_equivalent(
  target: TransformerConfig, num_fused_layers: int = 3, draft_vocab_size: int = 0
) -> TransformerConfig:
  """A one-layer config that a draft step of a feature head (``models/feature_head.py``) on
  ``target`` costs the same as in this model: the same weight bytes and matmul FLOPs per token.

  The head reads, per step, its decoder layer (q, k and v read the 2D-wide [embedding | fused
  feature], o and the MLP as the target's), the fusion map fc (C D x D, C = fused layers) and
  an output head (the target's, shared, or its own over ``draft_vocab_size`` tokens). The
  extra q/k/v inputs and fc are folded into the MLP's width, which call_cost charges alike;
  one layer's collectives and the output head's all-gather remain as they are."""
  d, n, k, h = target.d_model, target.num_heads, target.num_kv_heads, target.resolved_head_dim
  extra = d * n * h + 2 * d * k * h + num_fused_layers * d * d
  per_width = d * (3 if target.gated_mlp else 2)
  return target.replace(
    num_layers=1,
    ffn_dim=target.ffn_dim + -(-extra // per_width),
    vocab_size=draft_vocab_size or target.vocab_size,
    tie_embeddings=False,
  )


@dataclasses.dataclass(frozen=True)
class Observation:
  """A measured call, for calibration."""

  name: str
  call: Call
  measured_s: float


@dataclasses.dataclass(frozen=True)
class Calibration:
  efficiency: Efficiency
  observations: tuple[Observation, ...]

  @property
  def predictions_s(self) -> list[float]:
    return [o.call.seconds(self.efficiency) for o in self.observations]

  @property
  def relative_errors(self) -> list[float]:
    return [p / o.measured_s - 1 for p, o in zip(self.predictions_s, self.observations)]

  def table(self) -> list[dict]:
    return [
      {
        "call": o.name,
        "bound": o.call.bound,
        "measured_ms": o.measured_s * 1e3,
        "predicted_ms": p * 1e3,
        "error": e,
      }
      for o, p, e in zip(self.observations, self.predictions_s, self.relative_errors)
    ]


def calibrate(observations: Sequence[Observation], fit_tau: bool = True) -> Calibration:
  """Least squares on relative error: t_i = tau + roofline_i / eta + collectives_i.

  Linear in (1/eta, tau); with two observations and ``fit_tau`` the fit is
  exact, so report its errors as a consistency check, not a validation.
  """
  if len(observations) < (2 if fit_tau else 1):
    raise ValueError(f"Need at least {2 if fit_tau else 1} observations, got {len(observations)}.")
  measured = np.array([o.measured_s for o in observations])
  roofline = np.array([o.call.roofline_s for o in observations])
  collectives = np.array([o.call.collectives_s for o in observations])
  columns = [roofline] + ([np.ones_like(roofline)] if fit_tau else [])
  design = np.stack(columns, axis=1) / measured[:, None]
  target = (measured - collectives) / measured
  solution, *_ = np.linalg.lstsq(design, target, rcond=None)
  inverse_eta = float(solution[0])
  tau = float(solution[1]) if fit_tau else 0.0
  if inverse_eta <= 0 or tau < 0:  # Refit with the offending parameter pinned.
    if tau < 0:
      return calibrate(observations, fit_tau=False)
    raise ValueError("Calibration failed: the measurements fall as the roofline grows.")
  return Calibration(Efficiency(eta=min(1 / inverse_eta, 1.5), tau_s=tau), tuple(observations))


def implied_acceptance(
  ms_per_token: float, num_draft_tokens: int, draft_step_ms: float, score_ms: float
) -> float:
  """The alpha at which K draft steps plus one scoring call give ``ms_per_token``:
  solves (K t_draft + t_score) / E[tokens per call](alpha) = ms_per_token by bisection."""
  iteration_ms = num_draft_tokens * draft_step_ms + score_ms
  tokens = iteration_ms / ms_per_token
  if not 1 <= tokens <= num_draft_tokens + 1:
    raise ValueError(
      f"{ms_per_token} ms/token needs {tokens:.2f} tokens per call, outside "
      f"[1, K+1={num_draft_tokens + 1}]."
    )
  low, high = 0.0, 1.0
  for _ in range(60):
    middle = (low + high) / 2
    if expected_tokens_per_call(middle, num_draft_tokens) < tokens:
      low = middle
    else:
      high = middle
  return (low + high) / 2


@dataclasses.dataclass(frozen=True)
class Choice:
  draft: str
  num_draft_tokens: int
  alpha: float
  predicted_speedup: float
  target_step_s: float
  draft_step_s: float
  score_s: float


def speedup_by_k(
  target: TransformerConfig,
  draft: TransformerConfig,
  alpha: float,
  hardware: Hardware,
  mesh: MeshShape,
  efficiency: Efficiency,
  *,
  batch_size: int,
  cache_length: int,
  max_num_draft_tokens: int = 16,
  draft_mesh: MeshShape | None = None,
  draft_efficiency: Efficiency | None = None,
  name: str = "draft",
) -> list[Choice]:
  """Predicted speedup for K = 1..max_num_draft_tokens, all times from the calibrated roofline."""

  def seconds(config, m, eff, tokens):
    return call_cost(config, hardware, m, batch_size, tokens, cache_length).seconds(eff)

  target_step = seconds(target, mesh, efficiency, 1)
  draft_step = seconds(draft, draft_mesh or mesh, draft_efficiency or efficiency, 1)
  choices = []
  for num_draft_tokens in range(1, max_num_draft_tokens + 1):
    score = seconds(target, mesh, efficiency, num_draft_tokens + 1)
    choices.append(
      Choice(
        name,
        num_draft_tokens,
        alpha,
        predicted_speedup(alpha, num_draft_tokens, target_step, draft_step, score),
        target_step,
        draft_step,
        score,
      )
    )
  return choices


def recommend(
  target: TransformerConfig,
  drafts: Mapping[str, tuple[TransformerConfig, float]],
  hardware: Hardware,
  mesh: MeshShape,
  efficiency: Efficiency,
  *,
  batch_size: int,
  cache_length: int,
  max_num_draft_tokens: int = 16,
) -> Choice:
  """The (draft, K) with the highest predicted speedup; ``drafts`` maps a name to its config
  and its measured alpha (acceptance depends on the draft, so each brings its own)."""
  best: Choice | None = None
  for name, (config, alpha) in drafts.items():
    for choice in speedup_by_k(
      target,
      config,
      alpha,
      hardware,
      mesh,
      efficiency,
      batch_size=batch_size,
      cache_length=cache_length,
      max_num_draft_tokens=max_num_draft_tokens,
      name=name,
    ):
      if best is None or choice.predicted_speedup > best.predicted_speedup:
        best = choice
  if best is None:
    raise ValueError("No drafts to choose from.")
  return best


# ---------------------------------------------------------------------------------------------
# The paper's setting (Chen et al. 2023, section 4 and Table 1): 16 TPU v4, batch 1, K = 4.

PAPER = {
  "num_draft_tokens": 4,
  "chips": 16,
  "target_ms": 14.1,  # Chinchilla 70B, autoregressive, ms/token.
  "draft_ms": 1.8,  # The 4B draft (8 layers, d_model 6144), ms/token.
  # Speculative ms/token (Table 1) and the speedups the paper prints.
  "speculative_ms": {"HumanEval nucleus": 5.73, "XSum greedy": 7.00, "XSum nucleus": 7.52},
  "speedups": {"HumanEval nucleus": 2.46, "XSum greedy": 2.01, "XSum nucleus": 1.92},
  # Assumed, not stated in the paper: prompt plus 128 new tokens in a 1024-slot cache.
  "cache_length": 1024,
}


def paper_check(
  target: TransformerConfig, draft: TransformerConfig, hardware: Hardware = PRESETS["tpu_v4"]
) -> dict:
  """Calibrates (eta, tau) to the paper's two step times, reports the errors (and those of an
  eta-only fit), the model's scoring cost of K+1 tokens, and the alpha each speculative
  ms/token implies."""
  mesh = MeshShape(data=1, tensor=PAPER["chips"])
  cache, num_draft_tokens = PAPER["cache_length"], PAPER["num_draft_tokens"]
  calls = {
    name: call_cost(config, hardware, mesh, 1, 1, cache)
    for name, config in (("target 70B", target), ("draft 4B", draft))
  }
  observations = [
    Observation("target 70B", calls["target 70B"], PAPER["target_ms"] / 1e3),
    Observation("draft 4B", calls["draft 4B"], PAPER["draft_ms"] / 1e3),
  ]
  fit = calibrate(observations)
  eta_only = calibrate(observations, fit_tau=False)
  # Scoring K+1 tokens over a decode step, from the model, for K = 1..8.
  score_ratios = {
    kk: call_cost(target, hardware, mesh, 1, kk + 1, cache).seconds(fit.efficiency)
    / fit.predictions_s[0]
    for kk in range(1, 9)
  }
  score_ratio = score_ratios[num_draft_tokens]
  implied = {}
  for task, ms in PAPER["speculative_ms"].items():
    # Measured step times; the scoring call at the model's ratio to a step.
    alpha = implied_acceptance(
      ms, num_draft_tokens, PAPER["draft_ms"], PAPER["target_ms"] * score_ratio
    )
    best = max(
      score_ratios,
      key=lambda kk: predicted_speedup(
        alpha, kk, PAPER["target_ms"], PAPER["draft_ms"], PAPER["target_ms"] * score_ratios[kk]
      ),
    )
    implied[task] = {
      "speculative_ms": ms,
      "alpha": alpha,
      "tokens_per_call": expected_tokens_per_call(alpha, num_draft_tokens),
      # The paper's Figure 1 plots accepted tokens / (K + 1); the bonus token
      # is not an accepted draft token, hence the - 1.
      "accepted_over_k_plus_1": (expected_tokens_per_call(alpha, num_draft_tokens) - 1)
      / (num_draft_tokens + 1),
      "best_k": best,
    }
  return {
    "hardware": hardware.name,
    "mesh": dataclasses.asdict(mesh),
    "calls": {
      name: {
        "bound": c.bound,
        "weight_gb_per_chip": c.weight_bytes / 1e9,
        "kv_gb_per_chip": c.kv_bytes / 1e9,
        "memory_floor_ms": c.memory_s * 1e3,
        "compute_ms": c.compute_s * 1e3,
        "collectives_ms": c.collectives_s * 1e3,
      }
      for name, c in calls.items()
    },
    "fit": {"eta": fit.efficiency.eta, "tau_ms": fit.efficiency.tau_s * 1e3, "table": fit.table()},
    "eta_only_fit": {"eta": eta_only.efficiency.eta, "table": eta_only.table()},
    "score_ratio": score_ratio,
    "implied": implied,
  }


def format_table(rows: Iterable[dict], columns: Sequence[str]) -> str:
  """A Markdown table of ``rows`` (floats to 3 significant digits; a missing, None or NaN
  value is '-')."""

  def cell(value):
    if value is None or (isinstance(value, float) and math.isnan(value)):
      return "-"
    if isinstance(value, float):
      return f"{value:.3g}"
    return str(value)

  lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(cell(row.get(c)) for c in columns) + " |" for row in rows]
  return "\n".join(lines)
