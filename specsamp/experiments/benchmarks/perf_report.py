"""The performance model held against measurements: the paper's numbers and this machine's.

``cpu_report(results)`` takes a benchmark results.json and
  1. calibrates the roofline's two efficiencies (eta, tau) on every measured
     single call (decode steps and scoring calls of several models and batch
     sizes) and reports the error on each;
  2. reports autoregressive decode against the memory-bandwidth floor;
  3. for each sampling mode, takes the measured alpha of the trained draft,
     recommends K from the calibrated model, and compares it with the K that
     measured fastest in the sweep.
``format_paper_check`` and ``format_cpu_report`` render Markdown for docs/.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from specsamp.experiments.benchmarks import perf_model
from specsamp.models.config import TransformerConfig


def _observations(results: dict, hardware: perf_model.Hardware) -> list[perf_model.Observation]:
  observations = []
  for key, entry in sorted(results["roofline"].items()):
    config = TransformerConfig.from_config(entry["config"])
    call = perf_model.call_cost(
      config,
      hardware,
      perf_model.MeshShape(),
      entry["batch_size"],
      entry["num_tokens"],
      entry["cache_length"],
    )
    observations.append(perf_model.Observation(key, call, entry["measured_ms"] / 1e3))
  return observations


def cpu_report(results: dict) -> dict:
  # The machine as measured when the roofline calls were timed (a shared CPU drifts).
  entries = list(results["roofline"].values())
  machine = (
    {
      k: statistics.median(e.get(k, results["machine"][k]) for e in entries)
      for k in ("memory_bandwidth", "matmul_flops")
    }
    if entries
    else results["machine"]
  )
  hardware = perf_model.cpu_hardware(machine["memory_bandwidth"], machine["matmul_flops"])
  observations = _observations(results, hardware)
  if len(observations) < 2:
    raise ValueError(
      "The results hold fewer than two roofline calls; run the benchmark with "
      "config.roofline_models set."
    )
  fit = perf_model.calibrate(observations)
  floor = [
    {
      "model": e["model"],
      "measured_ms": e["measured_ms"],
      "floor_ms": e["floor_ms"],
      "fraction_of_floor": e["fraction_of_floor"],
      "bound": e["bound"],
      # The weights alone ("bytes" adds the KV cache read); records from before lack them.
      "weights_mb": e.get("weight_bytes", e["bytes"]) / 1e6,
    }
    for e in results["roofline"].values()
    if e["batch_size"] == 1 and e["num_tokens"] == 1
  ]
  recommendations = []
  configs = {
    e["model"]: TransformerConfig.from_config(e["config"]) for e in results["roofline"].values()
  }
  records = list(results["records"].values())
  groups = defaultdict(list)
  for r in records:
    fixed = isinstance(r["num_draft_tokens"], int)  # Not the automatic length's records.
    if fixed and r["drafter"] != "synthetic" and r["verifier"] == "token" and r["batch_size"] == 1:
      groups[(r["mode"], r["drafter"])].append(r)
  if "target" in configs and "draft" in configs:
    cache = next(iter(results["roofline"].values()))["cache_length"]
    for (mode, drafter), group in sorted(groups.items()):
      group.sort(key=lambda r: r["num_draft_tokens"])
      # alpha averaged over the sweep's K values, each weighted by its K (about its verified
      # draft tokens per iteration; the pooled count differs by at most 0.005 on the shipped runs).
      alpha = sum(r["alpha"] * r["num_draft_tokens"] for r in group) / sum(
        r["num_draft_tokens"] for r in group
      )
      by_k = perf_model.speedup_by_k(
        configs["target"],
        configs["draft"],
        alpha,
        hardware,
        perf_model.MeshShape(),
        fit.efficiency,
        batch_size=1,
        cache_length=cache,
        max_num_draft_tokens=max(r["num_draft_tokens"] for r in group),
      )
      recommended = max(by_k, key=lambda c: c.predicted_speedup)
      measured_best = max(group, key=lambda r: r["speedup"])
      at_recommended = next(
        (r for r in group if r["num_draft_tokens"] == recommended.num_draft_tokens), None
      )
      recommendations.append(
        {
          "mode": mode,
          "drafter": drafter,
          "alpha": alpha,
          "recommended_k": recommended.num_draft_tokens,
          "model_speedup": recommended.predicted_speedup,
          "measured_best_k": measured_best["num_draft_tokens"],
          "measured_best_speedup": measured_best["speedup"],
          "measured_at_recommended": at_recommended["speedup"] if at_recommended else float("nan"),
        }
      )
  return {
    "hardware": {
      "memory_bandwidth_gbs": hardware.memory_bandwidth / 1e9,
      "matmul_gflops": hardware.peak_flops / 1e9,
    },
    "fit": {
      "eta": fit.efficiency.eta,
      "tau_ms": fit.efficiency.tau_s * 1e3,
      "table": fit.table(),
      "median_abs_error": statistics.median(abs(e) for e in fit.relative_errors),
    },
    "floor": floor,
    "recommendations": recommendations,
  }


def format_paper_check(check: dict) -> str:
  fit, eta_only = check["fit"], check["eta_only_fit"]
  lines = [
    f"Roofline on {check['mesh']['tensor']} x {check['hardware']} (tensor parallel), batch 1:",
    "",
    perf_model.format_table(
      [{"call": name, **values} for name, values in check["calls"].items()],
      [
        "call",
        "bound",
        "weight_gb_per_chip",
        "kv_gb_per_chip",
        "memory_floor_ms",
        "compute_ms",
        "collectives_ms",
      ],
    ),
    "",
    f"Calibrated: eta = {fit['eta']:.3f}, tau = {fit['tau_ms']:.3f} ms (two parameters, "
    "two measurements: an exact fit).",
    "",
    perf_model.format_table(fit["table"], ["call", "measured_ms", "predicted_ms", "error"]),
    "",
    f"eta alone (tau = 0): eta = {eta_only['eta']:.3f}",
    "",
    perf_model.format_table(eta_only["table"], ["call", "measured_ms", "predicted_ms", "error"]),
    "",
    f"Scoring K+1 = 5 tokens costs {check['score_ratio']:.3f} x a decode step.",
    "",
    "Acceptance implied by the paper's speculative ms/token (K = 4, measured step times):",
    "",
    perf_model.format_table(
      [{"task": task, **values} for task, values in check["implied"].items()],
      ["task", "speculative_ms", "alpha", "tokens_per_call", "accepted_over_k_plus_1", "best_k"],
    ),
  ]
  return "\n".join(lines)


def format_cpu_report(report: dict) -> str:
  fit = report["fit"]
  return "\n".join(
    [
      f"Measured: {report['hardware']['memory_bandwidth_gbs']:.1f} GB/s, "
      f"{report['hardware']['matmul_gflops']:.0f} GFLOP/s.",
      "",
      f"Calibrated on {len(fit['table'])} calls: eta = {fit['eta']:.3f}, tau = "
      f"{fit['tau_ms']:.3f} ms; median |error| {fit['median_abs_error']:.1%}.",
      "",
      perf_model.format_table(
        fit["table"], ["call", "bound", "measured_ms", "predicted_ms", "error"]
      ),
      "",
      "Autoregressive decode (batch 1) against the memory-bandwidth floor:",
      "",
      perf_model.format_table(
        report["floor"],
        ["model", "weights_mb", "bound", "floor_ms", "measured_ms", "fraction_of_floor"],
      ),
      "",
      "Recommended K (calibrated model, measured alpha) against the sweep's fastest K (batch 1):",
      "",
      perf_model.format_table(
        report["recommendations"],
        [
          "mode",
          "drafter",
          "alpha",
          "recommended_k",
          "model_speedup",
          "measured_at_recommended",
          "measured_best_k",
          "measured_best_speedup",
        ],
      ),
    ]
  )


def format_recommendation(
  choices: list[perf_model.Choice], title: str, alpha: float, efficiency: perf_model.Efficiency
) -> str:
  """The predicted speedup for each K on some hardware, and the K to use."""
  best = max(choices, key=lambda c: c.predicted_speedup)
  rows = [
    {
      "K": c.num_draft_tokens,
      "speedup": c.predicted_speedup,
      "target_ms": c.target_step_s * 1e3,
      "draft_ms": c.draft_step_s * 1e3,
      "score_ms": c.score_s * 1e3,
    }
    for c in choices
  ]
  return (
    f"## {title}, alpha {alpha} (eta {efficiency.eta:.3f}, tau "
    f"{efficiency.tau_s * 1e3:.3f} ms)\n\n"
    + perf_model.format_table(rows, ["K", "speedup", "target_ms", "draft_ms", "score_ms"])
    + f"\n\nRecommended K = {best.num_draft_tokens}: {best.predicted_speedup:.2f}x "
    "predicted."
  )
