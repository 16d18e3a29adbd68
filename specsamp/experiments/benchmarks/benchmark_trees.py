r"""Tree and multi-draft proposals against the single chain: scripts/benchmark_trees.py.

Launch:
  python scripts/benchmark_trees.py --config=configs/benchmark_trees.py
  python scripts/benchmark_trees.py --config=configs/benchmark_trees.py \
      --config.modes=sample --config.calls=2

MEASURED, on the pair of ``config.pair`` (trained or loaded by ``pair.prepare``)
at batch 1, for each sampling mode (greedy, sample T=1, nucleus T=0.8 top-p 0.95):

  autoregressive          once per mode: the baseline
  chain:D                 the single chain of K = D draft tokens, verified
                          token-wise ('token', Chen et al.) and as a block ('block')
  each tree of config.trees   e.g. 'chains:2x4' (2 i.i.d. chains of 4),
                          'tree:2,2,1,1' (branching per depth, siblings without
                          replacement), verified by recursive rejection sampling
                          ('token') and by traversal verification ('traversal')

Greedy verifies by argmax, so it runs one verifier ('token') per proposal. Each
setting's ms/token is the median over ``config.calls`` timed calls after one
untimed warm-up (``timing.time_sampler``), one held-out prompt per call. With it:
tokens/s, the speedup over autoregressive, tokens per target call and its
standard error (``benchmark.tokens_per_call_se``), alpha, nodes proposed per
target call, draft calls per iteration, the measured cost of ONE target call
scoring N+1 tokens (N nodes), K+1 tokens and 1 token and of one draft step
(``timing.time_calls``: plain causal calls; the tree mask does not change the
work), the speedup those costs predict at the measured tokens per call
(``speedup.StepCosts.predicted_from_tokens_per_call``: D draft steps plus one
scoring call), and tokens per call over the chain's with block verification in
the same mode (greedy: over the one chain's).

PREDICTED, for the paper's pair (Chen et al. 2023: Chinchilla 70B target, 4B
draft, batch 1, 16 TPU v4 chips, tensor-parallel) with ``perf_model``'s roofline.
This is a model, not a measurement:

  t(call)      = tau + max(bytes / (eta * HBM bandwidth), FLOPs / (eta * peak)) + collectives
                 per chip, with TPU v4 at 1.2 TB/s HBM and 275 TFLOP/s bf16 per chip
                 (Google's published numbers, ``perf_model.PRESETS['tpu_v4']``), a
                 1024-slot KV cache, and (eta, tau) calibrated so that a target step
                 is the paper's 14.1 ms and a draft step its 1.8 ms
                 (``perf_model.paper_check``)
  iteration    = sum over the D draft calls of t_draft(width) + t_target(N + 1)
                 where the first draft call takes 2 tokens (the root and the token
                 before it) and the call at depth d takes that depth's nodes
                 (``draft_call_widths``); the chain is the tree with one node per depth
  ms/token     = iteration / tokens per target call, and speedup = t_target(1) / that

At batch 1 both models are memory-bound: every call reads all the weights, so
scoring 17 tokens costs about 2% more than scoring 1 and a wide draft call
about as much as a narrow one. The tokens per target call are the ones MEASURED
on the small pair (``config.pair``), not the 70B/4B pair's (whose alpha is
unknown to us): read the predicted rows as "the 70B/4B costs at this pair's
acceptance"; the comparison across shapes is what carries over, not the
absolute speedup.

Results go to ``<output_dir>/results.json`` (one record per setting, keyed
'mode/proposal/verifier'; with ``resume`` a setting already there is skipped,
and every finished setting is saved at once) and Markdown tables to stdout and
``<output_dir>/summary.md``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import ml_collections

from specsamp.experiments.benchmarks import perf_model, speedup, timing
from specsamp.experiments.benchmarks.benchmark import (
  MODES,
  Store,
  check_choices,
  fingerprint,
  pair_config,
  parse_list,
  tokens_per_call_se,
)
from specsamp.experiments.benchmarks.harness import Bench
from specsamp.experiments.jobs import pair as pair_lib
from specsamp.experiments.jobs import prompts as prompts_lib
from specsamp.models.config import TransformerConfig
from specsamp.sampling import speculative
from specsamp.sampling import tree as tree_lib
from specsamp.sampling.speculative import EXACT_VERIFIERS
from specsamp.sampling.tree_step import VERIFIERS as TREE_VERIFIERS

AUTOREGRESSIVE = "autoregressive"
MEASURED_COLUMNS = (
  "proposal",
  "verifier",
  "nodes",
  "ms_per_token",
  "tokens_per_s",
  "ar_ms_per_token",
  "speedup",
  "predicted_speedup",
  "tokens_per_call",
  "tokens_per_call_se",
  "vs_block",
  "alpha",
  "nodes_per_call",
  "draft_calls_per_iteration",
  "score_ms",
  "chain_score_ms",
  "target_step_ms",
  "draft_step_ms",
)
PREDICTED_COLUMNS = (
  "proposal",
  "verifier",
  "nodes",
  "tokens_per_call",
  "score_ms",
  "draft_ms",
  "iteration_ms",
  "ms_per_token",
  "speedup",
)

DRAFT = "draft"  # The pair's one draft, by its name in the harness.


def parse_trees(value: str) -> list[str]:
  """'chains:2x4; tree:2,2,1,1' -> ['chains:2x4', 'tree:2,2,1,1'] (';' separates: a tree's
  own string holds commas)."""
  return [spec.strip() for spec in str(value).split(";") if spec.strip()]


def chain_spec(num_draft_tokens: int) -> str:
  """The single chain's proposal name, e.g. 'chain:4' (``tree.parse`` reads it)."""
  return f"chain:{num_draft_tokens}"


def check_config(config: ml_collections.ConfigDict) -> None:
  """Refuses unknown modes and verifiers, and trees whose depth is not num_draft_tokens."""
  check_choices("modes", config.modes, MODES)
  check_choices("chain_verifiers", config.chain_verifiers, EXACT_VERIFIERS)
  check_choices("tree_verifiers", config.tree_verifiers, TREE_VERIFIERS)
  if config.num_draft_tokens < 1 or config.calls < 1:
    raise ValueError("num_draft_tokens and calls must be >= 1.")
  if not parse_list(config.chain_verifiers) or not parse_list(config.tree_verifiers):
    raise ValueError("chain_verifiers and tree_verifiers need at least one verifier each.")
  for spec in parse_trees(config.trees):
    shape = tree_lib.parse(spec)
    if shape.max_depth != config.num_draft_tokens:
      raise ValueError(
        f"Tree {spec!r} ({shape.describe()}) has depth {shape.max_depth}; every tree's depth "
        f"must be num_draft_tokens={config.num_draft_tokens} (the chain's K)."
      )
  if config.predict_hardware not in perf_model.PRESETS:
    raise ValueError(
      f"predict_hardware {config.predict_hardware!r}: use one of {sorted(perf_model.PRESETS)}."
    )


def settings(config: ml_collections.ConfigDict, mode: str) -> list[tuple[str, str]]:
  """(proposal, verifier) of each speculative setting of ``mode``: the chain, then the trees.
  Greedy verifies by argmax, so it runs each proposal once, as 'token'."""
  greedy = MODES[mode]["temperature"] == 0
  chain_verifiers = ["token"] if greedy else parse_list(config.chain_verifiers)
  tree_verifiers = ["token"] if greedy else parse_list(config.tree_verifiers)
  out = [(chain_spec(config.num_draft_tokens), v) for v in chain_verifiers]
  for spec in parse_trees(config.trees):
    out += [(spec, v) for v in tree_verifiers]
  return out


def setting_key(mode: str, proposal: str, verifier: str) -> str:
  return f"{mode}/{proposal}/{verifier}"


def draft_call_widths(shape: tree_lib.TreeShape) -> list[int]:
  """Tokens of each of the D draft calls one iteration makes (``drafters.ModelDrafter``): the
  root and the token before it, then the nodes of depth d for d = 1..D-1 (depth D's nodes
  have no children to draw)."""
  return [2] + [len(shape.nodes_at_depth(d)) for d in range(1, shape.max_depth)]


def add_ratios(records: dict[str, dict]) -> None:
  """Sets each speculative record's ``vs_block``: its tokens per call over the chain's with
  block verification in the same mode (greedy, or no block record: the chain's 'token')."""
  for record in records.values():
    if record["proposal"] == AUTOREGRESSIVE:
      record["vs_block"] = None
      continue
    chain = chain_spec(record["num_draft_tokens"])
    reference = records.get(setting_key(record["mode"], chain, "block")) or records.get(
      setting_key(record["mode"], chain, "token")
    )
    record["vs_block"] = (
      record["tokens_per_call"] / reference["tokens_per_call"] if reference else None
    )


def run(
  config: ml_collections.ConfigDict, workdir: str | None = None, log: Callable[[str], None] = print
) -> dict[str, Any]:
  """Times every setting not yet in results.json (saving after each), then prints and writes
  the measured and predicted tables.

  Args:
    config: a configs/benchmark_trees.py config.
    workdir: the pair's checkpoint cache; default workdir/<pair name>.
    log: where progress and the tables go.

  Returns:
    The results: {'fingerprint', 'machine', 'records', 'roofline', 'predicted'}.
  """
  check_config(config)
  store = Store(config.output_dir, fingerprint(config), config.resume)
  records = store.data["records"]
  modes = parse_list(config.modes)
  todo = [
    (mode, proposal, verifier)
    for mode in modes
    for proposal, verifier in [(AUTOREGRESSIVE, "-")] + settings(config, mode)
    if setting_key(mode, proposal, verifier) not in records
  ]
  if todo:
    time_settings(config, workdir, log, store, todo)
  add_ratios(records)
  prediction = predict(config, records)
  store.data["predicted"] = prediction
  store.save()
  summary = measured_tables(records, modes) + "\n\n" + predicted_tables(prediction, modes)
  with open(os.path.join(config.output_dir, "summary.md"), "w") as f:
    f.write(summary + "\n")
  log(summary)
  return store.data


def time_settings(
  config: ml_collections.ConfigDict,
  workdir: str | None,
  log: Callable[[str], None],
  store: Store,
  todo: list[tuple[str, str, str]],
) -> None:
  """Times the (mode, proposal, verifier) settings of ``todo``, saving each record at once."""
  records = store.data["records"]
  pair = pair_lib.prepare(pair_config(config), workdir, log=log)
  prompts = prompts_lib.of_pair(
    pair, config.prompt_source, chat=bool(config.get("chat_template", False))
  )
  log(f"timing {prompts_lib.describe(prompts, config.prompt_source)}, one per call")
  batches = prompts_lib.batches(prompts, 1)  # Batch 1: the latency setting.
  depth = config.num_draft_tokens
  max_nodes = max([depth] + [tree_lib.parse(s).num_nodes for s in parse_trees(config.trees)])
  cache_slots = prompts.tokens.shape[1] + config.max_new_tokens + max_nodes + 1
  bench = Bench(pair, cache_slots, seed=config.seed, drafters={DRAFT: pair.draft})
  cost = lambda name, tokens: bench.step_s(name, 1, tokens)  # At batch 1.

  for mode, proposal, verifier in todo:
    warp = MODES[mode]
    common = dict(max_new_tokens=config.max_new_tokens, **warp)
    ar_key = setting_key(mode, AUTOREGRESSIVE, "-")
    record = {"mode": mode, **warp, "proposal": proposal, "verifier": verifier}
    if proposal == AUTOREGRESSIVE:
      timed = timing.time_sampler(
        AUTOREGRESSIVE, bench.sample(None, num_draft_tokens=0, **common), batches, config.calls
      )
      record.update(
        num_draft_tokens=0,
        nodes=0,
        shape="",
        ms_per_token=timed.ms_per_token,
        tokens_per_s=timed.tokens_per_s,
        ar_ms_per_token=timed.ms_per_token,
        speedup=1.0,
        predicted_speedup=1.0,
        tokens_per_call=1.0,
        tokens_per_call_se=0.0,
        alpha=None,
        acceptance_rate=None,
        nodes_per_call=0.0,
        draft_calls_per_iteration=0.0,
        score_ms=None,
        chain_score_ms=None,
        target_step_ms=cost("target", 1) * 1e3,
        draft_step_ms=None,
        calls=config.calls,
        compile_s=timed.compile_s,
      )
      records[ar_key] = record
      store.save()
      log(f"{mode:>7} {AUTOREGRESSIVE:>16}: {timed.ms_per_token:6.2f} ms/token")
      continue
    if ar_key not in records:
      raise ValueError(f"No autoregressive record for mode {mode!r} to compare with.")
    ar_ms = records[ar_key]["ms_per_token"]
    shape = tree_lib.parse(proposal)
    tree = None if proposal == chain_spec(depth) else proposal
    timed = timing.time_sampler(
      proposal,
      bench.sample(DRAFT, num_draft_tokens=depth, verifier=verifier, tree=tree, **common),
      batches,
      config.calls,
    )
    stats = speculative.summarize(timed.outputs)
    step_costs = speedup.StepCosts(
      target_step_s=cost("target", 1),
      draft_step_s=cost(DRAFT, 1),
      target_score_s=cost("target", shape.num_nodes + 1),
      num_draft_tokens=depth,
      score_tokens=shape.num_nodes + 1,
    )
    prefills = len(timed.outputs)  # One target and one draft prefill call per timed call.
    iterations = max(stats["row_iterations"], 1)  # Batch 1: one row per iteration.
    record.update(
      num_draft_tokens=depth,
      nodes=shape.num_nodes,
      shape=shape.describe(),
      ms_per_token=timed.ms_per_token,
      tokens_per_s=timed.tokens_per_s,
      ar_ms_per_token=ar_ms,
      speedup=ar_ms / timed.ms_per_token,
      predicted_speedup=step_costs.predicted_from_tokens_per_call(stats["tokens_per_target_call"]),
      tokens_per_call=stats["tokens_per_target_call"],
      tokens_per_call_se=tokens_per_call_se(stats["accepted_histogram"]),
      alpha=stats["alpha"],
      acceptance_rate=stats["acceptance_rate"],
      nodes_per_call=stats["mean_draft_length"],
      draft_calls_per_iteration=(stats["draft_calls"] - prefills) / iterations,
      target_calls=stats["target_calls"],
      row_iterations=stats["row_iterations"],
      accepted_histogram=stats["accepted_histogram"],
      acceptance_at_position=stats["acceptance_at_position"],
      score_ms=step_costs.target_score_s * 1e3,
      chain_score_ms=cost("target", depth + 1) * 1e3,
      target_step_ms=step_costs.target_step_s * 1e3,
      draft_step_ms=step_costs.draft_step_s * 1e3,
      calls=config.calls,
      compile_s=timed.compile_s,
    )
    records[setting_key(mode, proposal, verifier)] = record
    add_ratios(records)
    store.save()
    log(
      f"{mode:>7} {proposal:>16}/{verifier:<9}: {timed.ms_per_token:6.2f} ms/token "
      f"(AR {ar_ms:6.2f}), speedup {record['speedup']:4.2f}x, "
      f"{record['tokens_per_call']:.2f} tokens/call, alpha {record['alpha']:.3f}, "
      f"{record['nodes_per_call']:.1f} nodes/call, scoring {shape.num_nodes + 1} tokens "
      f"{record['score_ms']:.2f} ms vs 1 token {record['target_step_ms']:.2f} ms"
    )


def predict(config: ml_collections.ConfigDict, records: dict[str, dict]) -> dict[str, Any]:
  """The predicted section (module docstring): the paper's target and draft on its 16 chips of
  ``config.predict_hardware``, at each measured record's tokens per call.

  Returns:
    {'setting': what was assumed, 'calls_ms': model call times, 'records': per setting}.
  """
  hardware = perf_model.PRESETS[config.predict_hardware]
  target = TransformerConfig.from_config(config.predict_target)
  draft = TransformerConfig.from_config(config.predict_draft)
  fit = perf_model.paper_check(target, draft, hardware)["fit"]
  efficiency = perf_model.Efficiency(eta=fit["eta"], tau_s=fit["tau_ms"] / 1e3)
  mesh = perf_model.MeshShape(data=1, tensor=perf_model.PAPER["chips"])
  cache_length = perf_model.PAPER["cache_length"]

  def call_ms(model: TransformerConfig, tokens: int) -> float:
    call = perf_model.call_cost(model, hardware, mesh, 1, tokens, cache_length)
    return call.seconds(efficiency) * 1e3

  step_ms = call_ms(target, 1)
  calls = {("target", 1), ("target", config.num_draft_tokens + 1), ("draft", 1)}
  out: dict[str, Any] = {
    "setting": {
      "hardware": hardware.name,
      "memory_bandwidth": hardware.memory_bandwidth,
      "peak_flops": hardware.peak_flops,
      "chips": mesh.chips,
      "batch_size": 1,
      "cache_length": cache_length,
      "eta": efficiency.eta,
      "tau_ms": efficiency.tau_s * 1e3,
      "paper_target_ms": perf_model.PAPER["target_ms"],
      "paper_draft_ms": perf_model.PAPER["draft_ms"],
      "paper_speedups": perf_model.PAPER["speedups"],
    },
    "calls_ms": {},
    "records": {},
  }
  for key, record in records.items():
    if record["proposal"] == AUTOREGRESSIVE:
      row = {"nodes": 0, "score_ms": step_ms, "draft_ms": 0.0, "iteration_ms": step_ms}
    else:
      shape = tree_lib.parse(record["proposal"])
      score_tokens = shape.num_nodes + 1
      draft_ms = sum(call_ms(draft, width) for width in draft_call_widths(shape))
      row = {
        "nodes": shape.num_nodes,
        "score_ms": call_ms(target, score_tokens),
        "draft_ms": draft_ms,
        "iteration_ms": draft_ms + call_ms(target, score_tokens),
      }
      calls |= {("target", score_tokens)} | {("draft", w) for w in draft_call_widths(shape)}
    row["tokens_per_call"] = record["tokens_per_call"]
    row["ms_per_token"] = row["iteration_ms"] / record["tokens_per_call"]
    row["speedup"] = step_ms / row["ms_per_token"]
    out["records"][key] = {**{k: record[k] for k in ("mode", "proposal", "verifier")}, **row}
  models = {"target": target, "draft": draft}
  for name, tokens in sorted(calls, key=lambda call: (call[0] != "target", call[1])):
    out["calls_ms"][f"{name} x {tokens}"] = call_ms(models[name], tokens)
  return out


def _ordered(rows: list[dict]) -> list[dict]:
  """Autoregressive first, then the chain, then the trees, each verifier together."""
  return sorted(
    rows,
    key=lambda r: (
      r["proposal"] != AUTOREGRESSIVE,
      not r["proposal"].startswith("chain:"),
      r.get("nodes", 0),
      r["proposal"],
      r["verifier"],
    ),
  )


def measured_tables(records: dict[str, dict], modes: list[str] | None = None) -> str:
  """One Markdown table per mode of the measured records."""
  out = []
  for mode in modes or list(MODES):
    rows = _ordered([r for r in records.values() if r["mode"] == mode])
    if not rows:
      continue
    warp = MODES[mode]
    out += [
      f"**{mode}** (T={warp['temperature']}, top-p {warp['top_p']}), batch 1, MEASURED on this "
      "machine. nodes: N proposed per target call (the chain: K); score_ms: one target call "
      "on N+1 tokens; chain_score_ms: on K+1; target_step_ms: on 1; vs_block: tokens/call "
      "over the chain's with block verification (greedy: the one chain's); "
      "predicted_speedup: from these costs at the measured tokens/call.",
      "",
      perf_model.format_table(rows, MEASURED_COLUMNS),
      "",
    ]
  return "\n".join(out).rstrip()


def predicted_tables(prediction: dict[str, Any], modes: list[str] | None = None) -> str:
  """The predicted section as Markdown: the assumptions, then one table per mode."""
  s = prediction["setting"]
  calls = ", ".join(f"{name} {ms:.2f} ms" for name, ms in prediction["calls_ms"].items())
  out = [
    f"## Predicted on {s['chips']} {s['hardware']} chips for the paper's 70B/4B pair "
    "(a model, not a measurement)",
    "",
    f"Roofline of perf_model.py: {s['memory_bandwidth'] / 1e12:.2g} TB/s HBM and "
    f"{s['peak_flops'] / 1e12:.0f} TFLOP/s per chip, tensor-parallel over {s['chips']} chips, "
    f"batch {s['batch_size']}, {s['cache_length']}-slot KV cache; efficiency "
    f"eta={s['eta']:.2f} and overhead tau={s['tau_ms']:.2f} ms per call calibrated to the "
    f"paper's {s['paper_target_ms']} ms (70B) and {s['paper_draft_ms']} ms (4B) per step. "
    f"Calls: {calls}. An iteration = the D draft calls (2 tokens, then each depth's nodes) + "
    "one target call on N+1 tokens; tokens/call are MEASURED on this benchmark's pair, not "
    "the 70B/4B pair's. For scale, the paper MEASURED with the chain at K=4: "
    + ", ".join(f"{x:.2f}x ({task})" for task, x in s["paper_speedups"].items())
    + ".",
    "",
  ]
  for mode in modes or list(MODES):
    rows = _ordered([r for r in prediction["records"].values() if r["mode"] == mode])
    if rows:
      out += [f"**{mode}**, predicted:", "", perf_model.format_table(rows, PREDICTED_COLUMNS), ""]
  return "\n".join(out).rstrip()
