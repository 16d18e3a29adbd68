"""The benchmark sweep: autoregressive vs speculative over K, modes, batch sizes, verifiers and
drafters.

For each setting (mode, batch size, drafter, verifier, K) the speculative
loop runs ``calls`` times after one compile-and-warm-up call, each call on the
next batch of held-out prompts with its own seed; the autoregressive loop runs
the same calls, interleaved with them. Every call ends in ``block_until_ready``; ms/token is the
median over calls of call time / tokens per row. Alongside: the acceptance
statistics pooled over the calls, the measured step costs
(``harness.Bench.step_costs``), the speedup the formula predicts from them, and
the efficiency = measured / predicted.

Drafters: a trained draft per distillation mode ('token', 'none', ...), and
'synthetic', the first trained draft's work with acceptance forced to a fixed
rate (``verifier='synthetic'``), which isolates the loop's systems cost. K = 'auto' is the
automatic draft length (``harness.Bench.choose_draft_length``, the sample job's default): the
K it chose is recorded (0: autoregressive sampling), so the tables show whether it is ever
slower than autoregressive.

A roofline section times single calls of each model in
``config.roofline_models`` (trained or not: only shapes matter) against the
memory-bandwidth floor measured on this machine, for the performance model.

Results go to ``<output_dir>/results.json`` (all records, merged across runs
with ``resume``: a setting already there is skipped, and every finished setting
is saved at once, so an interrupted sweep loses nothing) and ``results.csv``.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import math
import os
import platform
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np

from specsamp.experiments.benchmarks import perf_model, timing
from specsamp.experiments.benchmarks.harness import TARGET, Bench, format_choice
from specsamp.experiments.jobs import pair as pair_lib
from specsamp.experiments.jobs import prompts as prompts_lib
from specsamp.models import transformer
from specsamp.models.config import TransformerConfig
from specsamp.sampling import speculative
from specsamp.sampling import statistics as sampling_statistics
from specsamp.training import train

# The paper's settings: greedy (XSum), T=0.8 with top-p 0.95 (HumanEval), and plain T=1.
MODES = {
  "greedy": {"temperature": 0.0, "top_p": 1.0},
  "nucleus": {"temperature": 0.8, "top_p": 0.95},
  "sample": {"temperature": 1.0, "top_p": 1.0},
  "t07": {"temperature": 0.7, "top_p": 1.0},
}
SYNTHETIC = "synthetic"
AUTO = "auto"  # The automatic draft length (harness.Bench.choose_draft_length).
AUTO_LARGEST = 8  # The largest K 'auto' considers when the list names no K.
CSV_COLUMNS = (
  "mode",
  "temperature",
  "top_p",
  "batch_size",
  "drafter",
  "verifier",
  "num_draft_tokens",
  "chosen_draft_tokens",
  "synthetic_acceptance",
  "ms_per_token",
  "tokens_per_s",
  "ar_ms_per_token",
  "ar_tokens_per_s",
  "speedup",
  "acceptance_rate",
  "alpha",
  "tokens_per_call",
  "tokens_per_call_se",
  "acceptance_at_position",
  "target_step_ms",
  "draft_step_ms",
  "score_ms",
  "predicted_speedup",
  "efficiency",
  "calls",
  "compile_s",
)


def parse_list(value: Any, kind: Callable = str) -> list:
  """'1,2,4' (or a tuple or a single value) -> [1, 2, 4]."""
  if isinstance(value, (list, tuple)):
    return [kind(v) for v in value]
  return [kind(v.strip()) for v in str(value).split(",") if v.strip()]


def setting_key(record: dict) -> str:
  return "/".join(
    str(record[k]) for k in ("mode", "batch_size", "drafter", "verifier", "num_draft_tokens")
  )


def check_choices(what: str, value: Any, known) -> None:
  """Refuses entries of the list ``value`` that are not in ``known``."""
  unknown = sorted(set(parse_list(value)) - set(known))
  if unknown:
    raise ValueError(f"Unknown {what} {unknown}; use some of {sorted(known)}.")


def draft_lengths(config: ml_collections.ConfigDict) -> list[int | str]:
  """``num_draft_tokens``: K values >= 1 and 'auto' (the automatic draft length, choosing K in
  0..the largest K listed, or 0..AUTO_LARGEST when none is)."""
  lengths = []
  for value in parse_list(config.num_draft_tokens):
    if value == AUTO:
      lengths.append(AUTO)
      continue
    try:
      k = int(value)
    except ValueError:
      k = 0
    if k < 1:
      raise ValueError(f"num_draft_tokens must be Ks >= 1 or {AUTO!r}, got {value!r}.")
    lengths.append(k)
  return lengths


def check_config(config: ml_collections.ConfigDict) -> None:
  check_choices("modes", config.modes, MODES)
  check_choices("drafters", config.drafters, (*train.DISTILL_MODES, SYNTHETIC))
  draft_lengths(config)
  # A prompt file's prompts are counted here, before the machine is measured and the pair is
  # prepared (trained, in a fresh workdir): a missing file or a batch that does not divide
  # them failed only then (2026-11-30's review).
  count = config.num_prompts
  if config.prompt_source != "held_out":
    from specsamp.experiments.jobs import prompts as prompts_lib

    count = len(prompts_lib.texts_of(config.prompt_source))
  for b in parse_list(config.batch_sizes, int):
    if b < 1 or count % b:
      raise ValueError(
        f"Every batch size must divide the {count} prompts of "
        f"prompt_source={config.prompt_source!r}; got {b}."
      )
  if not set(parse_list(config.verifiers)) <= {"token", "block"}:
    raise ValueError(f"verifiers must be 'token' and/or 'block', got {config.verifiers!r}.")
  if not 0 <= config.synthetic_acceptance <= 1:
    raise ValueError(f"synthetic_acceptance must be in [0, 1], got {config.synthetic_acceptance}.")
  if config.calls < 1:
    raise ValueError(f"calls must be >= 1, got {config.calls}.")


def tokens_per_call_se(histogram: list[int]) -> float:
  """Standard error of the mean tokens per target call, from the accepted-count histogram."""
  counts = np.asarray(histogram, np.float64)
  total = counts.sum()
  if total < 2:
    return float("nan")
  values = np.arange(len(counts))
  mean = (counts * values).sum() / total
  variance = (counts * (values - mean) ** 2).sum() / (total - 1)
  return float(math.sqrt(variance / total))


def iteration_ms(timed: timing.Timed) -> float:
  """Median over calls of a call's wall time over its loop iterations (target calls less the
  prefill: the slowest row's), the prefill's time included."""
  per_iteration = [
    s / max(int(o.target_calls) - 1, 1) for s, o in zip(timed.seconds, timed.outputs)
  ]
  return 1e3 * float(np.median(per_iteration))


class Store:
  """results.json: the config fingerprint, the machine, and one record per setting."""

  def __init__(self, output_dir: str, fingerprint: str, resume: bool):
    self.path = os.path.join(output_dir, "results.json")
    os.makedirs(output_dir, exist_ok=True)
    self.data = {"fingerprint": fingerprint, "machine": {}, "records": {}, "roofline": {}}
    if os.path.exists(self.path) and resume:
      with open(self.path) as f:
        saved = json.load(f)
      if saved.get("fingerprint") != fingerprint:
        raise ValueError(
          f"{self.path} holds results of another pair or prompt setup; use "
          "another --config.output_dir, or --config.resume=False to replace it."
        )
      self.data = saved

  def save(self) -> None:
    temporary = self.path + ".tmp"
    with open(temporary, "w") as f:
      json.dump(self.data, f, indent=1)
    os.replace(temporary, self.path)  # Never a half-written file.

  def write_csv(self) -> str:
    path = os.path.join(os.path.dirname(self.path), "results.csv")
    with open(path, "w", newline="") as f:
      writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
      writer.writeheader()
      for record in self.data["records"].values():
        row = dict(record)
        row["acceptance_at_position"] = " ".join(
          f"{a:.4f}" for a in record["acceptance_at_position"]
        )
        writer.writerow(row)
    return path


# Settings that change a record's numbers but not its key (``fingerprint``).
FINGERPRINT_UNLESS_DEFAULT = {"synthetic_acceptance": 0.8, "chat_template": False}


def fingerprint(
  config: ml_collections.ConfigDict,
  extra_fields: tuple[str, ...] = (),
  unless_default: dict[str, Any] | None = None,
) -> str:
  """What makes records comparable: the pair, the prompts and the generation length (and
  ``extra_fields`` of the config); each field of ``unless_default`` too where the config sets
  it to another value than that (a resumed sweep reused the records of another synthetic
  acceptance, chain verifier or prompt set as its own; results stored before keep their
  fingerprints)."""
  identity = {
    "pair": config.pair.to_dict(),
    "num_prompts": config.num_prompts,
    "prompt_tokens": config.prompt_tokens,
    "max_new_tokens": config.max_new_tokens,
    **{name: config[name] for name in extra_fields},
    **{
      name: config.get(name, default)
      for name, default in (unless_default or {}).items()
      if config.get(name, default) != default
    },
  }
  if config.prompt_source != "held_out":  # Held-out records keep their earlier fingerprints.
    identity["prompt_source"] = config.prompt_source
  return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def measure_machine() -> dict:
  bandwidth = timing.measure_memory_bandwidth()
  flops = timing.measure_matmul_flops()
  return {
    "backend": jax.default_backend(),
    "devices": len(jax.devices()),
    "device_kind": jax.devices()[0].device_kind,
    "processor": platform.processor(),
    "cpu_count": os.cpu_count(),
    "memory_bandwidth": bandwidth,
    "matmul_flops": flops,
  }


def roofline(
  config: ml_collections.ConfigDict, machine: dict, log: Callable[[str], None], done: dict
) -> dict:
  """Single-call times of each model in ``config.roofline_models`` (random weights), against the
  memory-bandwidth floor and the roofline model; entries already in ``done`` are skipped."""
  hardware = (
    perf_model.cpu_hardware(machine["memory_bandwidth"], machine["matmul_flops"])
    if machine["backend"] == "cpu"
    else None
  )
  results = {}
  cache_length = config.prompt_tokens + config.max_new_tokens + 9
  unstack = pair_lib.unstacks_layers(config.pair)  # The layers as the pair's models hold them.
  for name, model_config in config.roofline_models.items():
    model_cfg = TransformerConfig.from_config(model_config)
    model = None
    for batch in parse_list(config.roofline_batch_sizes, int):
      for tokens in parse_list(config.roofline_tokens, int):
        if f"{name}/{batch}/{tokens}" in done:
          continue
        if model is None:
          model = transformer.create(model_cfg, seed=0)
          model = transformer.unstack_layers(model) if unstack else model
        seconds = timing.time_calls(model, batch, tokens, cache_length)
        record = {
          "model": name,
          "layer_layout": "unstacked" if unstack else "stacked",
          "batch_size": batch,
          "num_tokens": tokens,
          "cache_length": cache_length,
          "measured_ms": seconds * 1e3,
          "config": dataclasses.asdict(model_cfg),
          "memory_bandwidth": machine["memory_bandwidth"],
          "matmul_flops": machine["matmul_flops"],
        }
        if hardware is not None:
          call = perf_model.call_cost(
            model_cfg, hardware, perf_model.MeshShape(), batch, tokens, cache_length
          )
          record.update(
            bytes=call.weight_bytes + call.kv_bytes,
            weight_bytes=call.weight_bytes,
            flops=call.flops,
            floor_ms=call.memory_s * 1e3,
            compute_ms=call.compute_s * 1e3,
            bound=call.bound,
            fraction_of_floor=call.memory_s / seconds,
          )
        results[f"{name}/{batch}/{tokens}"] = record
        log(
          f"roofline {name} batch {batch} x {tokens} tokens: {seconds * 1e3:.3f} ms"
          + (
            f" (memory floor {record['floor_ms']:.3f} ms: {record['fraction_of_floor']:.0%})"
            if hardware
            else ""
          )
        )
  return results


def pair_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The pair to time, sampling the benchmark's number and length of prompts."""
  pair = ml_collections.ConfigDict(config.pair.to_dict())
  pair.sampling.num_prompts = config.num_prompts
  pair.sampling.prompt_tokens = config.prompt_tokens
  pair.sampling.prompt_source = config.prompt_source
  return pair


def run(
  config: ml_collections.ConfigDict, workdir: str | None = None, log: Callable[[str], None] = print
) -> dict:
  """Runs the sweep (resuming), writes results.json and results.csv; returns the results."""
  check_config(config)
  store = Store(
    config.output_dir,
    fingerprint(config, unless_default=FINGERPRINT_UNLESS_DEFAULT),
    config.resume,
  )
  log("measuring this machine (memory bandwidth, matmul FLOP/s)")
  machine = measure_machine()
  # Each run measures the machine again (a shared CPU varies); all measurements are kept.
  store.data["machine"] = {
    **machine,
    "history": store.data["machine"].get("history", [])
    + [{k: machine[k] for k in ("memory_bandwidth", "matmul_flops")}],
  }
  log(
    f"  {machine['memory_bandwidth'] / 1e9:.1f} GB/s, {machine['matmul_flops'] / 1e9:.0f} GFLOP/s"
    f" ({machine['backend']}, {machine['devices']} devices)"
  )
  if config.roofline_models:
    store.data["roofline"].update(roofline(config, machine, log, store.data["roofline"]))
    store.save()

  pair_section = pair_config(config)
  drafters = parse_list(config.drafters)
  if pair_section.draft.get("checkpoint"):  # A loaded draft (e.g. imported) replaces trained ones.
    drafters = ["checkpoint"] + [d for d in drafters if d == SYNTHETIC]
  # The trained drafts to time; 'synthetic' alone drafts with the config's default draft.
  model_drafters = [d for d in drafters if d != SYNTHETIC] or [
    pair_section.draft.train.distill.mode
  ]
  pair = pair_lib.prepare(pair_section, workdir, draft_modes=model_drafters, log=log)
  prompts = prompts_lib.of_pair(
    pair, config.prompt_source, chat=bool(config.get("chat_template", False))
  )
  log(f"timing {prompts_lib.describe(prompts, config.prompt_source)}")
  max_new = config.max_new_tokens
  lengths = draft_lengths(config)
  largest = max([k for k in lengths if k != AUTO] or [AUTO_LARGEST])
  bench = Bench(pair, prompts.tokens.shape[1] + max_new + largest + 1, seed=config.seed)

  for mode in parse_list(config.modes):
    warp = MODES[mode]
    for batch_size in parse_list(config.batch_sizes, int):
      batches = prompts_lib.batches(prompts, batch_size)
      common = dict(max_new_tokens=max_new, temperature=warp["temperature"], top_p=warp["top_p"])
      for drafter in drafters:
        verifiers = (
          [SYNTHETIC]
          if drafter == SYNTHETIC
          else (["token"] if warp["temperature"] == 0 else parse_list(config.verifiers))
        )
        draft_name = model_drafters[0] if drafter == SYNTHETIC else drafter
        for verifier in verifiers:
          for length in lengths:
            if length == AUTO and drafter == SYNTHETIC:
              continue  # A forced acceptance rate has nothing to choose from.
            record = {
              "mode": mode,
              **warp,
              "batch_size": batch_size,
              "drafter": drafter,
              "verifier": verifier,
              "num_draft_tokens": length,
            }
            if setting_key(record) in store.data["records"]:
              continue
            choice, num_draft_tokens = None, length
            if length == AUTO:
              choice = bench.choose_draft_length(
                draft_name, batches, largest, verifier=verifier, **common
              )
              num_draft_tokens = choice["num_draft_tokens"]
              log(f"{mode:>7} b={batch_size:<2} {drafter:>9}: {format_choice(choice)}")
            extra = {}
            if verifier == SYNTHETIC:
              extra = {"synthetic_acceptance": config.synthetic_acceptance}
            # Each setting's own autoregressive calls, interleaved with its speculative ones:
            # their ratio is fair on a shared machine.
            timed = timing.time_interleaved(
              {
                "autoregressive": bench.sample(None, num_draft_tokens=0, **common),
                "speculative": bench.sample(
                  draft_name,
                  num_draft_tokens=num_draft_tokens,
                  verifier=verifier,
                  **common,
                  **extra,
                ),
              },
              batches,
              config.calls,
            )
            ar, timed = timed["autoregressive"], timed["speculative"]
            stats = speculative.summarize(timed.outputs)
            measured = ar.ms_per_token / timed.ms_per_token
            if num_draft_tokens:
              step_costs = bench.step_costs(draft_name, batch_size, num_draft_tokens)
              # The measured ms/token is the slowest row's: so is the prediction.
              predicted = step_costs.predicted_batch_speedup(
                sampling_statistics.row_alphas(timed.outputs), max_new
              )
              costs_ms = dict(
                target_step_ms=step_costs.target_step_s * 1e3,
                draft_step_ms=step_costs.draft_step_s * 1e3,
                score_ms=step_costs.target_score_s * 1e3,
              )
            else:  # The automatic length chose autoregressive sampling.
              predicted = 1.0
              costs_ms = dict(
                target_step_ms=bench.step_s(TARGET, batch_size, 1) * 1e3,
                draft_step_ms=None,
                score_ms=None,
              )
            record.update(
              chosen_draft_tokens=num_draft_tokens,
              auto_choice=choice,
              # Scaled to the probes since 2026-12-01; the model before the scaling beside it
              # (absent in records made before: their auto_predicted is the unscaled model).
              auto_predicted=choice["predicted"][num_draft_tokens] if choice else None,
              auto_modelled=choice["modelled"].get(num_draft_tokens) if choice else None,
              synthetic_acceptance=extra.get("synthetic_acceptance", ""),
              ms_per_token=timed.ms_per_token,
              tokens_per_s=timed.tokens_per_s,
              ar_ms_per_token=ar.ms_per_token,
              ar_tokens_per_s=ar.tokens_per_s,
              speedup=measured,
              acceptance_rate=stats["acceptance_rate"],
              alpha=stats["alpha"],
              tokens_per_call=stats["tokens_per_target_call"],
              tokens_per_call_se=tokens_per_call_se(stats["accepted_histogram"]),
              acceptance_at_position=stats["acceptance_at_position"],
              accepted_histogram=stats["accepted_histogram"],
              iteration_ms=iteration_ms(timed),
              **costs_ms,
              predicted_speedup=predicted,
              efficiency=measured / predicted,
              calls=config.calls,
              compile_s=timed.compile_s,
            )
            store.data["records"][setting_key(record)] = record
            store.save()
            chosen = f" (auto: K={num_draft_tokens})" if choice else ""
            log(
              f"{mode:>7} b={batch_size:<2} {drafter:>9}/{verifier:<9} K={length}{chosen}: "
              f"{timed.ms_per_token:6.2f} ms/token (AR {ar.ms_per_token:6.2f}), speedup "
              f"{measured:4.2f}x, predicted {predicted:4.2f}x, efficiency "
              f"{measured / predicted:4.2f}; alpha {stats['alpha']:.3f}, "
              f"{stats['tokens_per_target_call']:.2f} tokens/call"
            )
  store.write_csv()
  return store.data


def auto_table(records: list[dict]) -> list[dict]:
  """Per setting with a K='auto' record: the K it chose, its speedup over autoregressive
  (interleaved), and the best fixed K's."""
  rows = []
  for r in sorted(
    (r for r in records if r["num_draft_tokens"] == AUTO),
    key=lambda r: (r["mode"], r["batch_size"], r["drafter"], r["verifier"]),
  ):
    same = [
      x
      for x in records
      if x["num_draft_tokens"] != AUTO
      and (x["mode"], x["batch_size"], x["drafter"], x["verifier"])
      == (r["mode"], r["batch_size"], r["drafter"], r["verifier"])
    ]
    best = max(same, key=lambda x: x["speedup"], default=None)
    rows.append(
      {
        "mode": r["mode"],
        "batch": r["batch_size"],
        "drafter": r["drafter"],
        "verifier": r["verifier"],
        "auto_k": r["chosen_draft_tokens"],
        "auto_predicted": r["auto_predicted"],
        "auto_modelled": r.get("auto_modelled"),
        "auto_speedup": r["speedup"],
        "best_fixed_k": best["num_draft_tokens"] if best else None,
        "best_fixed_speedup": best["speedup"] if best else None,
      }
    )
  return rows


def _pooled_tokens_per_call(group: list[dict]) -> tuple[float, float]:
  histogram = np.sum([np.asarray(r["accepted_histogram"]) for r in group], axis=0)
  mean = float((histogram * np.arange(len(histogram))).sum() / max(histogram.sum(), 1)) + 1
  return mean, tokens_per_call_se(histogram.tolist())


def summary_tables(results: dict) -> str:
  """Markdown tables of a results.json: per-K detail at batch 1, the best K per setting,
  block vs token-wise verification, and the synthetic drafter."""
  format_table = perf_model.format_table
  everything = list(results["records"].values())
  records = [r for r in everything if r["num_draft_tokens"] != AUTO]
  out = []
  detail = [
    r
    for r in records
    if r["batch_size"] == min(x["batch_size"] for x in records)
    and r["drafter"] != SYNTHETIC
    and r["verifier"] == "token"
  ]
  for mode in [m for m in MODES if any(r["mode"] == m for r in detail)]:
    for drafter in sorted({r["drafter"] for r in detail}):
      rows = sorted(
        (r for r in detail if r["mode"] == mode and r["drafter"] == drafter),
        key=lambda r: r["num_draft_tokens"],
      )
      if rows:
        out += [
          f"**{mode}** (T={rows[0]['temperature']}, top-p {rows[0]['top_p']}), draft "
          f"'{drafter}', token-wise, batch {rows[0]['batch_size']}:",
          "",
          format_table(
            rows,
            [
              "num_draft_tokens",
              "ms_per_token",
              "ar_ms_per_token",
              "speedup",
              "predicted_speedup",
              "efficiency",
              "alpha",
              "tokens_per_call",
              "draft_step_ms",
              "score_ms",
            ],
          ),
          "",
        ]
  best = []
  groups: dict[tuple, list] = {}
  for r in records:
    groups.setdefault((r["mode"], r["batch_size"], r["drafter"], r["verifier"]), []).append(r)
  for (mode, batch, drafter, verifier), group in sorted(groups.items()):
    top = max(group, key=lambda r: r["speedup"])
    best.append(
      {
        "mode": mode,
        "batch": batch,
        "drafter": drafter,
        "verifier": verifier,
        "best_k": top["num_draft_tokens"],
        "speedup": top["speedup"],
        "predicted": top["predicted_speedup"],
        "efficiency": top["efficiency"],
        "ms_per_token": top["ms_per_token"],
        "ar_ms_per_token": top["ar_ms_per_token"],
        "tokens_per_s": top["tokens_per_s"],
        "ar_tokens_per_s": top["ar_tokens_per_s"],
      }
    )
  out += ["Best K per setting:", "", format_table(best, list(best[0])), ""] if best else []
  automatic = auto_table(everything)
  if automatic:
    out += [
      "The automatic draft length (K='auto': chosen from probe calls at the largest K and "
      "the measured costs; K=0 samples autoregressively) against the best fixed K:",
      "",
      format_table(automatic, list(automatic[0])),
      "",
    ]
  comparison = []
  sampled = [r for r in records if r["verifier"] in ("token", "block") and r["temperature"] > 0]
  for mode, drafter, num_draft_tokens in sorted(
    {(r["mode"], r["drafter"], r["num_draft_tokens"]) for r in sampled}
  ):
    pools = {
      v: [
        r
        for r in sampled
        if (r["mode"], r["drafter"], r["num_draft_tokens"], r["verifier"])
        == (mode, drafter, num_draft_tokens, v)
      ]
      for v in ("token", "block")
    }
    if pools["token"] and pools["block"]:
      (token, token_se), (block, block_se) = (
        _pooled_tokens_per_call(pools[v]) for v in ("token", "block")
      )
      comparison.append(
        {
          "mode": mode,
          "drafter": drafter,
          "K": num_draft_tokens,
          "token_wise": token,
          "token_se": token_se,
          "block": block,
          "block_se": block_se,
          "gain": block / token - 1,
        }
      )
  if comparison:
    out += [
      "Tokens per target call, block vs token-wise verification (pooled over batch sizes; "
      "se = standard error):",
      "",
      format_table(comparison, list(comparison[0])),
      "",
    ]
  synthetic = [
    dict(r)
    for r in sorted(
      (r for r in records if r["drafter"] == SYNTHETIC),
      key=lambda r: (r["mode"], r["batch_size"], r["num_draft_tokens"]),
    )
  ]
  for r in synthetic:
    # Where the time goes: one iteration as measured, against the model calls it makes.
    if "iteration_ms" not in r:  # Older records: ms/token x tokens/call is it at batch 1.
      r["iteration_ms"] = r["ms_per_token"] * r["tokens_per_call"] if r["batch_size"] == 1 else None
    r["model_calls_ms"] = r["num_draft_tokens"] * r["draft_step_ms"] + r["score_ms"]
    r["ar_overhead_ms"] = r["ar_ms_per_token"] - r["target_step_ms"]
  if synthetic:
    out += [
      f"Synthetic drafter (acceptance forced to {synthetic[0]['synthetic_acceptance']}): "
      "the loop's own efficiency. iteration_ms = a call's time over its loop iterations "
      "(the slowest row's, prefill included); model_calls_ms = "
      "K draft steps + scoring, as timed alone; ar_overhead_ms = autoregressive ms/token "
      "- a target step:",
      "",
      format_table(
        synthetic,
        [
          "mode",
          "batch_size",
          "num_draft_tokens",
          "alpha",
          "tokens_per_call",
          "speedup",
          "predicted_speedup",
          "efficiency",
          "iteration_ms",
          "model_calls_ms",
          "ar_overhead_ms",
        ],
      ),
      "",
    ]
  return "\n".join(out)
