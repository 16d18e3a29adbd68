"""The GPU benchmark: everything specsamp should show on an accelerator, in one call.

``run`` goes through the sections of ``configs/device_benchmark.py`` in order, each under its
own time budget, and writes ``results.json`` after every section (and every row of the sweep),
so a run cut short keeps all it measured:

  environment   jax, flax, torch and transformers versions; the device
  gate          correctness before any timing (``proofs/device_gate.py``): greedy speculative
                equals greedy autoregressive for a chain, a tree and the feature head, and
                one exact-enumeration G-test case; a failure stops the run (by default)
  bandwidth     the device's copy bandwidth (bytes read + written per second), and each of
                the 8B target's decode products timed alone against it
  warping       top-p over its most likely blocks first against the whole vocabulary, and
                top-k, at the vocabularies of SmolLM2 and Llama 3 (``warping_cost``): whether
                an accelerator should search the blocks too, as a CPU does by default; and a
                token's draw by the flat race and in two stages (``draw_cost``)
  layers        the 8B and 1B decode steps with their layers scanned, unrolled and unstacked:
                the sweep runs a model unrolled only when that is clearly faster (not run by
                default)
  shaped        Llama-3.1-8B / Llama-3.2-1B shapes, random bfloat16 weights, synthetic
                acceptance, K and batch swept (``shaped_pair.sweep``): speedup, prediction
                from the step costs measured here, efficiency, the step against its floor
  shaped_peer   transformers' assisted generation on the same weights (exported), batch 1
                (not run by default: it has not finished inside 75 s on an H200)
  pairs         the default pair and the large pair trained here, each sampled by the sample
                job at T=0, T=1 and T=0.8 / top-p 0.95 (the README's main command)
  pair_peer     transformers' assisted generation on the trained default pair

``format_summary`` is the table printed last, with the issue's goals checked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import nnx

from specsamp import sharding
from specsamp.experiments.benchmarks import draw_cost, shaped_pair, timing, warping_cost
from specsamp.experiments.benchmarks.benchmark import MODES, parse_list
from specsamp.experiments.jobs import pair as pair_lib
from specsamp.experiments.jobs import sample_job
from specsamp.experiments.peers import compare_hf
from specsamp.experiments.proofs import device_gate
from specsamp.models import transformer

SECTIONS = (
  "environment",
  "gate",
  "bandwidth",
  "warping",
  "layers",
  "shaped",
  "shaped_peer",
  "pairs",
  "pair_peer",
)
GOAL_SPEEDUP = 2.0  # 8B/1B, alpha 0.8, K=4, batch 1.
GOAL_EFFICIENCY = 0.85
GOAL_FLOOR = 1.25  # The autoregressive 8B step over its weight-read floor.
GOAL_PEER = 1.5  # specsamp's speculative tokens/s over transformers' assisted generation.
GOAL_PASS = 1.5  # Issue 39: one parallel draft pass proposing K=4, in standalone draft steps.


class SectionTimeout(Exception):
  """A section ran past its budget."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
  """Raises ``SectionTimeout`` in the block after ``seconds`` (0: no limit). A signal, so it
  lands between Python steps: a compiled call in flight finishes first."""
  if seconds <= 0 or threading.current_thread() is not threading.main_thread():
    yield
    return

  def expire(*_):
    raise SectionTimeout(f"past its budget of {seconds:g} s")

  previous = signal.signal(signal.SIGALRM, expire)
  signal.setitimer(signal.ITIMER_REAL, seconds)
  try:
    yield
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


def _version(package: str) -> str | None:
  """An installed package's version, without importing it (torch takes seconds)."""
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return None


def environment(config: ml_collections.ConfigDict, context: dict, log: Callable) -> dict:
  """Versions, the backend and the devices."""
  device = jax.devices()[0]
  stats = device.memory_stats() or {}
  info = {
    "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    "host": platform.node(),
    "python": platform.python_version(),
    **{name: _version(name) for name in ("jax", "jaxlib", "flax", "torch", "transformers")},
    "backend": jax.default_backend(),
    "device_kind": device.device_kind,
    "devices": len(jax.devices()),
    "memory_limit_bytes": stats.get("bytes_limit"),
  }
  log(f"{info['device_kind']} ({info['backend']}), jax {info['jax']}, flax {info['flax']}")
  return info


def gate(config: ml_collections.ConfigDict, context: dict, log: Callable) -> dict:
  g = config.gate
  partial = context["results"]["gate"] = {"passed": None}  # Cases land here as they finish.
  return device_gate.run(
    g.num_samples, g.level, g.max_new_tokens, tuple(parse_list(g.batches)), partial, log=log
  )


def bandwidth(config: ml_collections.ConfigDict, context: dict, log: Callable) -> dict:
  """The copy bandwidth, then each of the 8B target's decode products alone (batch 1, both
  weight layouts, ``shaped_pair.time_decode_matmuls``): whether the products read their weights
  at the copy rate, and how much of the step they explain."""
  copy = timing.measure_copy_bandwidth(int(config.bandwidth_bytes))
  context["copy_bandwidth"] = copy
  log(f"copy bandwidth {copy / 1e9:.1f} GB/s (read + written)")
  result = {"copy_bytes_per_s": copy, "probe_bytes": int(config.bandwidth_bytes)}
  context["results"]["bandwidth"] = result  # Kept if the products are cut by the budget.
  s = config.shaped
  target = shaped_pair.model_config(s.target_hf_config, s.dtype, s.tiny)
  matmuls = shaped_pair.time_decode_matmuls(
    target, 1, s.dtype, copy, stack_bytes=int(config.bandwidth_bytes) // 4
  )
  for name, row in matmuls["products"].items():
    log(
      f"  {name} [{row['d_in']} x {row['d_out']}] x{row['count']}: "
      f"in-major {row['in_major_s'] * 1e6:.1f} us ({row['in_major_of_copy_bandwidth']:.2f} of "
      f"copy), out-major {row['out_major_s'] * 1e6:.1f} us "
      f"({row['out_major_of_copy_bandwidth']:.2f}){'  [model: out-major]' * row['out_major']}"
    )
  log(f"the target's products alone: {matmuls['step_s'] * 1e3:.3f} ms a step")
  result["decode_matmuls"] = matmuls
  return result


def warping(config: ml_collections.ConfigDict, context: dict, log: Callable) -> dict:
  """What warping costs on this device: the nucleus searched in its most likely blocks first
  against the whole vocabulary, and top-k, on Zipf-like logits at each vocabulary and batch
  (``warping_cost.measure``; interleaved medians). Accelerators search the whole vocabulary by
  default until these numbers say otherwise (``warping.nucleus_mask``'s ``blocks_first``)."""
  w = config.warping
  batch_sizes = parse_list(w.batch_sizes, int)
  result: dict[str, Any] = {"temperature": w.temperature, "top_p": w.top_p, "zipf": w.zipf}
  result["top_k"] = w.top_k
  result["records"] = []
  context["results"]["warping"] = result  # Records land here as they finish.
  top_k_ms = f"top_{w.top_k}_ms"
  for vocab in parse_list(w.vocabs, int):
    logits = warping_cost.zipf_logits(max(batch_sizes), vocab, w.zipf)
    for batch in batch_sizes:  # Each record saved as it finishes (the budget may cut the rest).
      (record,) = warping_cost.measure(
        logits, [batch], w.temperature, w.top_p, top_k=w.top_k, repeats=w.repeats
      )
      result["records"].append(record)
      context["save"]()
      blocks, whole = record["nucleus_blocks_first_ms"], record["nucleus_whole_vocabulary_ms"]
      log(
        f"  vocab {vocab:,}, {batch} rows: nucleus {blocks:.3f} ms blocks first, {whole:.3f} ms "
        f"whole ({record['rows_found_in_blocks']} rows found in the blocks; same tokens: "
        f"{record['same_tokens']}), top-{w.top_k} {record[top_k_ms]:.3f} ms"
      )
  # Drawing a token: the flat race against the two stages (``draws.categorical`` races in two
  # stages above 512 tokens on every platform; whether that also pays here, where the flat race
  # is one fused kernel).
  result["draws"] = []
  for vocab in parse_list(w.draw_vocabs, int):
    for batch in parse_list(w.draw_batch_sizes, int):
      (record,) = draw_cost.measure(
        [vocab], [batch], draws_per_call=w.draws_per_call, repeats=w.repeats
      )
      result["draws"].append(record)
      context["save"]()
      log(
        f"  draws, vocab {vocab:,}, {batch} rows: flat {record['flat_us']:.1f} us, two stages "
        f"(blocks of {record['block']}) {record['two_stage_us']:.1f} us"
      )
  return result


def _one_device_mesh() -> jax.sharding.Mesh:
  return sharding.make_mesh({"data": 1}, jax.devices()[:1])


def _shaped_models(config: ml_collections.ConfigDict, context: dict) -> tuple[Any, Any, Any]:
  """The shaped target and draft (random weights), made once and kept in ``context``."""
  if "shaped" not in context:
    s = config.shaped
    mesh = _one_device_mesh()
    start = time.perf_counter()  # Created outside the mesh context, as create_sharded expects.
    target, draft = (
      transformer.create(shaped_pair.model_config(path, s.dtype, s.tiny), mesh, seed=seed)
      for path, seed in ((s.target_hf_config, s.seed), (s.draft_hf_config, s.seed + 1))
    )
    jax.block_until_ready(jax.tree.leaves(nnx.state((target, draft))))
    context["shaped_init_s"] = time.perf_counter() - start
    context["shaped"] = (target, draft, mesh)
  return context["shaped"]


def layers(config: ml_collections.ConfigDict, context: dict, log: Callable) -> dict:
  """Each shaped model's decode step (batch 1) with its layers scanned, unrolled over the stack
  and unstacked; the fastest is what the sweep runs (``shaped_pair.with_layers``,
  ``choose_layer_modes``)."""
  target, draft, mesh = _shaped_models(config, context)
  s = config.shaped
  cache_slots = s.prompt_tokens + s.max_new_tokens
  with sharding.use_mesh(mesh):
    seconds = shaped_pair.time_layer_modes(
      {"target": target, "draft": draft}, 1, cache_slots, log=log
    )
  faster = choose_layer_modes(seconds, float(config.unroll_margin))
  context["layer_modes"] = faster
  return {"seconds": seconds, "chosen": faster, "batch_size": 1, "cache_slots": cache_slots}


def choose_layer_modes(seconds: dict[str, dict[str, float]], margin: float) -> dict[str, str]:
  """The fastest of a model's unrolled modes ('unrolled', 'unstacked') where its step is faster
  than the scanned one by more than ``margin`` (a fraction), else 'scan'. Unrolled layers
  compile far more slowly inside the sampling loops: on an H200 the sweep chose unrolled
  layers for a 0.2% faster 8B step and then compiled past its 200 s budget before its first
  row, where scanned layers finish four rows in 190 s (docs/benchmarks.md, "On a GPU")."""
  chosen = {}
  for name, modes in seconds.items():
    fastest = min((mode for mode in modes if mode != "scan"), key=modes.get)
    chosen[name] = fastest if modes[fastest] < (1 - margin) * modes["scan"] else "scan"
  return chosen


def _fastest_models(config: ml_collections.ConfigDict, context: dict) -> tuple[Any, Any, Any]:
  """The shaped models, each running its layers the way the 'layers' section found faster
  (scanned when it did not run)."""
  target, draft, mesh = _shaped_models(config, context)
  modes = context.get("layer_modes", {})
  target, draft = (
    shaped_pair.with_layers(model, modes.get(name, "scan"))
    for name, model in (("target", target), ("draft", draft))
  )
  return target, draft, mesh


def shaped(config: ml_collections.ConfigDict, context: dict, log: Callable) -> dict:
  """The synthetic-acceptance sweep on published shapes (``shaped_pair``)."""
  s = config.shaped
  if "copy_bandwidth" not in context:
    bandwidth(config, context, log)
  target, draft, mesh = _fastest_models(config, context)
  modes = context.get("layer_modes", {})
  result: dict[str, Any] = {
    "target_hf_config": s.target_hf_config,
    "draft_hf_config": s.draft_hf_config,
    "dtype": s.dtype,
    "tiny": s.tiny,
    "prompt_tokens": s.prompt_tokens,
    "max_new_tokens": s.max_new_tokens,
    "copy_bytes_per_s": context["copy_bandwidth"],
    "init_s": context["shaped_init_s"],
    "layers": {name: modes.get(name, "scan") for name in ("target", "draft")},
    "rows": [],
  }
  context["results"]["shaped"] = result  # Rows land here as they finish.
  with sharding.use_mesh(mesh):
    shaped_pair.sweep(
      target,
      draft,
      batch_sizes=parse_list(s.batch_sizes, int),
      num_draft_tokens=parse_list(s.num_draft_tokens, int),
      alphas=parse_list(s.alphas, float),
      prompt_tokens=s.prompt_tokens,
      max_new_tokens=s.max_new_tokens,
      calls=s.calls,
      copy_bandwidth=context["copy_bandwidth"],
      seed=s.seed,
      record=lambda row: (result["rows"].append(row), context["save"]()),
      log=log,
    )
  return result


def _hf_device() -> str:
  import torch

  return "cuda" if jax.default_backend() == "gpu" and torch.cuda.is_available() else "cpu"


def shaped_peer(config: ml_collections.ConfigDict, context: dict, log: Callable) -> dict:
  """transformers' assisted generation on the shaped pair's own weights, exported."""
  target, draft, mesh = _fastest_models(config, context)
  context.pop("shaped")  # Freed after this section: the pairs need no 8B model.
  prompts, _ = shaped_pair.random_prompts(
    target.vocab_size, config.peer.num_prompts, config.shaped.prompt_tokens, seed=7
  )
  pair = pair_lib.Pair(tokenizer=None, target=target, drafts={}, prompts=prompts, mesh=mesh)
  return compare_hf.run(
    pair,
    draft,
    num_draft_tokens=config.peer.num_draft_tokens,
    max_new_tokens=config.peer.max_new_tokens,
    modes=("greedy",),
    export_dir=_fresh_dir(config, "shaped_hf"),
    hf_device=_hf_device(),
    hf_dtype=config.shaped.dtype,
    log=log,
  )


def _fresh_dir(config: ml_collections.ConfigDict, name: str) -> str:
  """``workdir/name``, emptied (an export refuses a directory that holds a model)."""
  path = os.path.join(config.workdir, name)
  shutil.rmtree(path, ignore_errors=True)
  return path


def _pair_config(config: ml_collections.ConfigDict, variant: str, mode: str | None = None):
  pair_config = ml_collections.ConfigDict(config.pairs[variant].to_dict())
  if mode is not None:
    pair_config.sampling.temperature = MODES[mode]["temperature"]
    pair_config.sampling.top_p = MODES[mode]["top_p"]
  return pair_config, os.path.join(config.workdir, pair_config.name)


def pairs(config: ml_collections.ConfigDict, context: dict, log: Callable) -> dict:
  """Each pair trained here (on its first mode), then the sample job at every mode."""
  result: dict[str, Any] = {}
  context["results"]["pairs"] = result
  for variant in parse_list(config.pairs.variants):
    rows = result.setdefault(variant, {})
    for mode in parse_list(config.pairs.modes):
      pair_config, workdir = _pair_config(config, variant, mode)
      start = time.perf_counter()
      report = sample_job.run(pair_config, workdir, log=log)
      rows[mode] = {
        "wall_s": time.perf_counter() - start,  # The first mode's includes training.
        "speedup": report.speedup,
        "predicted_speedup": report.predicted_speedup,
        "efficiency": report.speedup / report.predicted_speedup,
        "ar_ms_per_token": report.autoregressive.ms_per_token,
        "spec_ms_per_token": report.speculative.ms_per_token,
        "costs": dataclasses.asdict(report.costs),
        "settings": report.settings,
        **{
          name: report.stats[name]
          for name in ("acceptance_rate", "alpha", "tokens_per_target_call")
        },
      }
      context["save"]()
      log(
        f"{variant} pair, {mode}: {report.speedup:.2f}x (predicted "
        f"{report.predicted_speedup:.2f}x), acceptance {report.stats['acceptance_rate']:.3f}, "
        f"{report.stats['tokens_per_target_call']:.2f} tokens/call"
      )
  return result


def pair_peer(config: ml_collections.ConfigDict, context: dict, log: Callable) -> dict:
  """transformers' assisted generation on each trained pair (loaded from the workdir)."""
  result = {}
  for variant in parse_list(config.peer.pair_variants):
    pair_config, workdir = _pair_config(config, variant)
    pair = pair_lib.prepare(pair_config, workdir, log=log)
    pair = dataclasses.replace(pair, prompts=pair.prompts[: max(config.peer.num_prompts, 1) * 2])
    result[variant] = compare_hf.run(
      pair,
      pair.draft,
      num_draft_tokens=config.peer.num_draft_tokens,
      max_new_tokens=pair_config.sampling.max_new_tokens,
      modes=tuple(parse_list(config.peer.pair_modes)),
      export_dir=_fresh_dir(config, f"{pair_config.name}_hf"),
      hf_device=_hf_device(),
      log=log,
    )
  return result


SECTION_FUNCTIONS = {
  "environment": environment,
  "gate": gate,
  "bandwidth": bandwidth,
  "warping": warping,
  "layers": layers,
  "shaped": shaped,
  "shaped_peer": shaped_peer,
  "pairs": pairs,
  "pair_peer": pair_peer,
}


def run(
  config: ml_collections.ConfigDict,
  out_dir: str,
  log: Callable[[str], None] = print,
  append: bool = False,
) -> dict[str, Any]:
  """Runs the sections (module docstring); returns and writes ``out_dir/results.json``.
  ``append``: keep the sections an earlier process wrote there (scripts/device_benchmark.sh
  runs the gate in a process of its own), and refuse to time anything if its gate failed."""
  names = parse_list(config.sections)
  unknown = sorted(set(names) - set(SECTIONS))
  if unknown:
    raise ValueError(f"Unknown sections {unknown}; use some of {SECTIONS}.")
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, "results.json")
  results: dict[str, Any] = {"status": {}}
  if append and os.path.isfile(path):
    with open(path, encoding="utf-8") as f:
      results = json.load(f)
    if "gate" in results and config.stop_on_gate_failure and gate_failed(results["gate"]):
      log("the correctness gate failed (results.json): nothing is timed (stop_on_gate_failure)")
      return results

  def save():
    with open(path, "w", encoding="utf-8") as f:
      json.dump(results, f, indent=1, default=_jsonable)

  context: dict[str, Any] = {"results": results, "save": save}
  for name in [n for n in SECTIONS if n in names]:
    log(f"== {name}")
    start = time.perf_counter()
    try:
      with time_limit(float(config.budgets.get(name, 0))):
        results[name] = SECTION_FUNCTIONS[name](config, context, log)
      status = "ok"
    except SectionTimeout as error:
      status = f"stopped: {error}"
    except Exception as error:  # noqa: BLE001  (a failed section must not lose the others)
      status = f"failed: {type(error).__name__}: {error}"
      log(traceback.format_exc())
    results["status"][name] = {"status": status, "seconds": time.perf_counter() - start}
    log(f"== {name}: {status} ({time.perf_counter() - start:.1f} s)")
    save()
    if name == "gate" and config.stop_on_gate_failure and gate_failed(results["gate"]):
      log("the correctness gate failed: nothing is timed (stop_on_gate_failure)")
      break
  return results


def gate_failed(gate_results: dict[str, Any]) -> bool:
  """Whether a check the gate completed failed (a gate cut short by its budget did not fail:
  the table marks it incomplete)."""
  greedy = gate_results.get("greedy", {})
  g_test = gate_results.get("g_test", {})
  return not all(row["equal"] for row in greedy.values()) or g_test.get("passed") is False


def _jsonable(value: Any) -> Any:
  if isinstance(value, np.generic):
    return value.item()
  if isinstance(value, np.ndarray):
    return value.tolist()
  return str(value)


def _row(cells: list[Any]) -> str:
  return "| " + " | ".join(str(c) for c in cells) + " |"


def _goal(met: bool | None) -> str:
  return "n/a" if met is None else ("met" if met else "NOT met")


def format_summary(results: dict[str, Any]) -> str:
  """The results as Markdown tables, the issue's goals checked last."""
  env = results.get("environment", {})
  lines = [
    f"device: {env.get('device_kind', '?')} ({env.get('backend', '?')}), jax {env.get('jax')}, "
    f"flax {env.get('flax')}, torch {env.get('torch')}, transformers {env.get('transformers')}, "
    f"{env.get('date', '')}",
    "sections: "
    + ", ".join(f"{k} {v['status']} ({v['seconds']:.0f} s)" for k, v in results["status"].items()),
  ]
  g = results.get("gate")
  if g:
    greedy = g.get("greedy", {})
    equal = sum(row["equal"] for row in greedy.values())
    verdict = {True: "PASS", False: "FAIL", None: "INCOMPLETE (cut by its budget)"}[g["passed"]]
    line = f"gate: {verdict}: greedy speculative = autoregressive in {equal}/{len(greedy)} cases"
    if "g_test" in g:
      t = g["g_test"]
      line += (
        f"; G-test ({t['case']}) G={t['G']:.1f} < {t['threshold']:.1f} at n={t['n']:,}: "
        f"{'pass' if t['passed'] else 'FAIL'}"
      )
    lines.append(line)
  if "bandwidth" in results:
    lines.append(f"copy bandwidth: {results['bandwidth']['copy_bytes_per_s'] / 1e12:.2f} TB/s")
    matmuls = results["bandwidth"].get("decode_matmuls")
    if matmuls:
      rates = [
        row[f"{'out' if row['out_major'] else 'in'}_major_of_copy_bandwidth"]
        for row in matmuls["products"].values()
      ]
      lines.append(
        f"the target's decode products alone (batch 1, its layouts): "
        f"{matmuls['step_s'] * 1e3:.3f} ms a step, each at {min(rates):.2f}-{max(rates):.2f} "
        f"of the copy bandwidth"
      )
  warped = results.get("warping", {}).get("records", [])
  if warped:
    w = results["warping"]
    lines += [
      "",
      f"warping, Zipf-like logits (exponent {w['zipf']}), T = {w['temperature']}, top-p "
      f"{w['top_p']}: median ms a call",
      _row(
        ["vocab", "rows", "nucleus, blocks first", "whole vocabulary", "blocks / whole"]
        + ["rows found in the blocks", "same tokens", f"top-{w['top_k']}"]
      ),
      _row(["---"] * 8),
    ]
    top_k_ms = f"top_{w['top_k']}_ms"
    for r in warped:
      blocks, whole = r["nucleus_blocks_first_ms"], r["nucleus_whole_vocabulary_ms"]
      lines.append(
        _row(
          [f"{r['vocab']:,}", r["batch"], f"{blocks:.3f}", f"{whole:.3f}", f"{blocks / whole:.2f}"]
          + [r["rows_found_in_blocks"], r["same_tokens"], f"{r[top_k_ms]:.3f}"]
        )
      )
  drawn = results.get("warping", {}).get("draws", [])
  if drawn:
    lines += [
      "",
      "drawing a token: microseconds per draw (draws inside one compiled loop)",
      _row(["vocab", "rows", "block", "flat race", "two stages", "flat / two stages"]),
      _row(["---"] * 6),
    ]
    for r in drawn:
      lines.append(
        _row(
          [f"{r['vocab']:,}", r["batch"], r["block"], f"{r['flat_us']:.1f}"]
          + [f"{r['two_stage_us']:.1f}", f"{r['flat_over_two_stage']:.2f}"]
        )
      )
  shaped_rows = results.get("shaped", {}).get("rows", [])
  if shaped_rows:
    s = results["shaped"]
    lines += [
      "",
      f"shapes {os.path.basename(os.path.dirname(s['target_hf_config']))} / "
      f"{os.path.basename(os.path.dirname(s['draft_hf_config']))}"
      f"{' (shrunk to tiny sizes)' if s['tiny'] else ''}, {s['dtype']}, random weights, "
      f"synthetic acceptance, {s['prompt_tokens']}-token prompts, {s['max_new_tokens']} new tokens",
      _row(
        ["B", "K", "alpha", "AR ms/tok", "spec ms/tok", "speedup", "predicted", "efficiency"]
        + ["tokens/call", "c", "score/step", "2K pass / draft step", "AR step / floor"]
      ),
      _row(["---"] * 13),
    ]
    for r in shaped_rows:
      lines.append(
        _row(
          [r["batch_size"], r["num_draft_tokens"], r["alpha"], f"{r['ar_ms_per_token']:.3f}"]
          + [f"{r['spec_ms_per_token']:.3f}", f"{r['speedup']:.2f}x"]
          + [f"{r['predicted_speedup']:.2f}x", f"{r['efficiency']:.2f}"]
          + [f"{r['tokens_per_target_call']:.2f}", f"{r['draft_ratio']:.3f}"]
          + [f"{r['score_ratio']:.2f}", f"{r.get('pass_over_draft_step', float('nan')):.2f}"]
          + [f"{r['ar_step_over_floor']:.2f}"]
        )
      )
  for variant, modes in results.get("pairs", {}).items():
    if not modes:  # Cut by its budget before a mode finished (the log says how far it got).
      lines += ["", f"trained pair '{variant}': no mode finished"]
      continue
    lines += [
      "",
      f"trained pair '{variant}' (the sample job, batch 1, K fixed)",
      _row(["mode", "speedup", "predicted", "efficiency", "acceptance", "tokens/call", "wall s"]),
      _row(["---"] * 7),
    ]
    for mode, r in modes.items():
      lines.append(
        _row(
          [mode, f"{r['speedup']:.2f}x", f"{r['predicted_speedup']:.2f}x"]
          + [f"{r['efficiency']:.2f}", f"{r['acceptance_rate']:.3f}"]
          + [f"{r['tokens_per_target_call']:.2f}", f"{r['wall_s']:.0f}"]
        )
      )
  peers = {}
  if "shaped_peer" in results:
    peers["shaped weights"] = results["shaped_peer"]
  for variant, peer in results.get("pair_peer", {}).items():
    peers[f"trained pair '{variant}'"] = peer
  if peers:
    lines += [
      "",
      "transformers' assisted generation on the same weights, batch 1, same K (tokens/s)",
      _row(["weights", "mode", "specsamp spec", "hf assisted", "ratio", "specsamp AR", "hf AR"]),
      _row(["---"] * 7),
    ]
    for what, peer in peers.items():
      k = peer["num_draft_tokens"]
      for mode, entry in peer["modes"].items():
        tps = lambda name: entry[name]["tokens_per_s"]
        lines.append(
          _row(
            [what, mode, f"{tps(f'specsamp speculative (K={k})'):.1f}"]
            + [f"{tps(f'hf assisted (K={k})'):.1f}", f"{entry['ratio_vs_hf_assisted']:.2f}x"]
            + [f"{tps('specsamp autoregressive'):.1f}", f"{tps('hf autoregressive'):.1f}"]
          )
        )
  lines += ["", "goals:"] + [f"  {line}" for line in goal_lines(results)]
  return "\n".join(lines)


def goal_lines(results: dict[str, Any]) -> list[str]:
  """The issue's goals, each with its measured value."""
  rows = results.get("shaped", {}).get("rows", [])
  main = next(
    (r for r in rows if (r["batch_size"], r["num_draft_tokens"], r["alpha"]) == (1, 4, 0.8)), None
  )
  lines = []
  if main is None:
    lines.append("8B/1B alpha 0.8 K=4 batch 1: not measured")
  else:
    lines.append(
      f"8B/1B alpha 0.8 K=4 batch 1: {main['speedup']:.2f}x (>= {GOAL_SPEEDUP}: "
      f"{_goal(main['speedup'] >= GOAL_SPEEDUP)}), efficiency {main['efficiency']:.2f} "
      f"(>= {GOAL_EFFICIENCY}: {_goal(main['efficiency'] >= GOAL_EFFICIENCY)})"
    )
    if "pass_over_draft_step" in main:
      lines.append(
        f"a parallel drafter's pass (K=4, 8 positions) / a 1B draft step: "
        f"{main['pass_over_draft_step']:.2f} (issue 39: <= {GOAL_PASS}: "
        f"{_goal(main['pass_over_draft_step'] <= GOAL_PASS)})"
      )
    lines.append(
      f"autoregressive step / weight-read floor: {main['ar_step_over_floor']:.2f} (<= "
      f"{GOAL_FLOOR}: {_goal(main['ar_step_over_floor'] <= GOAL_FLOOR)}); the loop's "
      f"ms/token / floor {main['ar_loop_over_floor']:.2f}"
    )
  peer = results.get("shaped_peer")
  if peer:
    ratio = peer["modes"]["greedy"]["ratio_vs_hf_assisted"]
    lines.append(
      f"specsamp / transformers assisted, same weights, batch 1: {ratio:.2f}x (>= {GOAL_PEER}: "
      f"{_goal(ratio >= GOAL_PEER)})"
    )
  return lines
