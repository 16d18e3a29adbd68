"""Drafters and draft-length schedules compared: scripts/benchmark_drafters.py.

On the pair of ``config.pair`` (trained or loaded), for each task, sampling
mode, drafter, schedule and K: ms/token and tokens/s of speculative sampling
against autoregressive sampling of the same prompts, the speedup, tokens per
target call, mean draft length, acceptance and draft calls per target call.

Tasks:
  continue   held-out code windows (the main job's prompts): the draft must
             predict new text.
  grounded   input-grounded: each prompt is a held-out window W followed by
             W's beginning again, so the continuation repeats code that is in
             the prompt (copying or lightly editing code, as in code editing and
             retrieval-grounded answers); where prompt lookup shines.

Drafters (names in ``config.drafters``):
  model            the pair's trained draft (token-distilled by default)
  model_confident  the same with HF's confidence stop (``confidence_threshold``)
  lookup           prompt lookup, n-grams ``lookup_max_ngram``..1
  selfL            self-speculative: the target's first L layers, e.g. self2
  feature          the feature head (EAGLE style) on the target's features, trained once
  feature_greedy   the same head proposing its most likely tokens, verified with one-hot q
                   (how vLLM and SGLang run EAGLE); ``proposals.py``
  feature_lookup   prompt lookup (n-grams ``lookup_max_ngram``..2) where a row's context
                   repeats, the feature head elsewhere (``lookup_feature_drafter.py``); chains
  feature_confident, feature_lookup_confident  the same two with the head's confidence stop
                   (``confidence_threshold``): a row's chain ends after a token the head gave
                   less than it
  model_greedy     the trained draft proposing its most likely tokens, with one-hot q
  parallel         the pair's parallel draft (PARD style): K drafts from one call, real q
  parallel_greedy  the same proposing each position's most likely token, one-hot q
  parallel_seq     the parallel draft with a sequential head (q_k sees the drafts before k)
  parallel_head    the feature head drafting K tokens from one call (placeholders), trained once
  parallel_head_greedy  the same, most likely tokens with one-hot q

Proposals (``config.trees``, ';'-separated): 'chain' (one chain of each K of
``num_draft_tokens``) and tree shapes (``tree.py``, e.g. 'tree:2,2,1,1',
'chains:2x4/distinct' or 'dynamic:4x6'), whose K is their depth, verified by recursive
rejection sampling. 'sequoia:NxD' is shaped in the run (``tree.sequoia``) from the acceptance
per sibling rank that the same drafter and mode measured on the proposal before it with the
most ranks (list a wide tree first); the record keeps the shape and the acceptance it used.
A dynamic tree 'dynamic:WxD@fit' ranks at the drafter's own rank temperature, fitted in the
run on held-out validation windows (``calibration.fit_drafter``); the record keeps it.

Scoring (``config.scorings``, chains only): 'full' (K + 1 positions every iteration) and
'narrow' (the narrowest of 1..K + 1 that holds every row's proposal, ``chain_step.score_narrow``);
a narrow record's key ends in '/narrow', and every record keeps its mean scoring width.

Timing as in ``benchmark.py``: compile and warm-up excluded, median over
``calls`` calls, each record's autoregressive calls interleaved with its own speculative ones
(the speedup is their ratio). Results go to ``output_dir``/results.json (resumable per
setting) and a Markdown table.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from typing import Any

import ml_collections
import numpy as np

from specsamp.experiments.benchmarks.benchmark import (
  MODES,
  Store,
  check_choices,
  fingerprint,
  pair_config,
  parse_list,
)
from specsamp.experiments.benchmarks.harness import Bench
from specsamp.experiments.benchmarks.timing import time_interleaved
from specsamp.experiments.jobs import drafter_specs
from specsamp.experiments.jobs import pair as pair_lib
from specsamp.experiments.jobs import prompts as prompts_lib
from specsamp.sampling import calibration, drafters, lookup_feature_drafter, proposals, speculative
from specsamp.sampling import tree as tree_lib

TASKS = ("continue", "grounded")


# Settings that change a record's numbers but not its key: in the results' fingerprint where a
# config sets them to another value (``benchmark.fingerprint``).
FINGERPRINT_UNLESS_DEFAULT = {
  "chain_verifier": "token",
  "lookup_max_ngram": 3,
  "confidence_threshold": 0.4,
  "max_prompts": 0,
  "chat_template": False,
}


def grounded_prompts(prompts: prompts_lib.Prompts, repeat_tokens: int) -> prompts_lib.Prompts:
  """Each prompt W of length L as W[:L - r] + W[:r] (r = ``repeat_tokens``): the code, then
  its beginning again, to be continued by copying. Lengths are kept."""
  shortest = int(prompts.lengths.min())
  if not 0 < repeat_tokens < shortest // 2:
    raise ValueError(
      f"repeat_tokens must be in (0, {shortest // 2}) for prompts of {shortest} tokens or more, "
      f"got {repeat_tokens}."
    )
  tokens = prompts.tokens.copy()
  for row, length in enumerate(prompts.lengths):
    window = prompts.tokens[row, :length]
    repeated = [window[: length - repeat_tokens], window[:repeat_tokens]]
    tokens[row, :length] = np.concatenate(repeated)
  return prompts_lib.Prompts(tokens, prompts.lengths.copy())


def make_drafter(name: str, pair, config: ml_collections.ConfigDict) -> drafters.Drafter:
  """This benchmark's names, built as the sample job builds its drafters
  (``drafter_specs.make``); only the confidence stop is this benchmark's own."""
  spec = None
  if name in ("model", "model_greedy"):
    spec = drafter_specs.DrafterSpec("draft")
  elif name == "lookup":
    spec = drafter_specs.DrafterSpec("lookup", config.lookup_max_ngram)
  elif name.startswith("self") and name[4:].isdigit():
    spec = drafter_specs.DrafterSpec("self", int(name[4:]))
  elif name in ("feature", "feature_greedy"):
    spec = drafter_specs.DrafterSpec("feature")
  elif name in ("feature_lookup", "feature_lookup_greedy", "feature_lookup_confident"):
    ngram = max(config.lookup_max_ngram, lookup_feature_drafter.MIN_NGRAM)
    spec = drafter_specs.DrafterSpec("feature_lookup", ngram)
  elif name == "feature_confident":
    spec = drafter_specs.DrafterSpec("feature")
  elif name in ("parallel", "parallel_greedy"):
    spec = drafter_specs.DrafterSpec("parallel")
  elif name in ("parallel_seq", "parallel_seq_greedy"):
    spec = drafter_specs.DrafterSpec("parallel_seq")
  elif name in ("parallel_head", "parallel_head_greedy"):
    spec = drafter_specs.DrafterSpec("parallel_head")
  if spec is not None:
    return drafter_specs.make(
      spec,
      pair,
      "greedy" if name.endswith("_greedy") else "sampled",
      mask_token_id=config.pair.draft.train.distill.get("mask_token", -1),
      confidence_threshold=config.confidence_threshold if name.endswith("_confident") else 0.0,
      head_draft_tokens=config.get("head_draft_tokens", 0) if spec.kind == "feature_lookup" else 0,
    )
  if name == "model_confident":
    return drafters.ModelDrafter(pair.draft, confidence_threshold=config.confidence_threshold)
  raise ValueError(
    f"Unknown drafter {name!r}: use model, model_greedy, model_confident, lookup, feature, "
    "feature_greedy, feature_confident, feature_lookup, feature_lookup_greedy, "
    "feature_lookup_confident, parallel, parallel_greedy, "
    "parallel_seq, parallel_seq_greedy, parallel_head, "
    "parallel_head_greedy or selfL "
    "(L = layers of the target, e.g. self2)."
  )


CHAIN = "chain"  # One chain of K draft tokens (config.trees).
SCORINGS = ("full", "narrow")  # The scoring call's width (config.scorings; module docstring).


SEQUOIA = "sequoia:"  # Shaped in the run from measured acceptance per rank (module docstring).


def tree_budget(spec: str) -> tuple[int, int]:
  """(nodes, depth) of a tree spec; a 'sequoia:NxD' to be shaped in the run gives (N, D)."""
  spec = calibration.unfitted(spec)
  if spec.startswith(SEQUOIA) and "@" not in spec:
    count, _, depth = spec[len(SEQUOIA) :].lower().partition("x")
    try:
      return int(count), int(depth)
    except ValueError:
      raise ValueError(f"Bad tree {spec!r}: use 'sequoia:NxD' (N nodes, depth D).") from None
  shape = tree_lib.parse(spec)
  return shape.num_nodes, shape.max_depth


def shaped(spec: str, records: list[dict]) -> str:
  """A tree spec to run: a 'sequoia:NxD' gets the acceptance per rank of the record (same
  task, mode, batch and drafter, measured before it) with the most ranks."""
  if not spec.startswith(SEQUOIA) or "@" in spec:
    return spec
  measured = [r["acceptance_at_rank"] for r in records if len(r.get("acceptance_at_rank", ())) > 1]
  if not measured:
    raise ValueError(
      f"{spec} is shaped from the acceptance per sibling rank of an earlier tree of the same "
      "drafter and mode: list a tree with siblings before it in config.trees."
    )
  ranks = max(measured, key=len)
  return f"{spec}@" + ",".join(f"{a:.4f}" for a in ranks)


def proposal_settings(config: ml_collections.ConfigDict) -> list[tuple[str, int]]:
  """(proposal, K) pairs: the chain at every K of ``num_draft_tokens``, each tree at its
  depth."""
  settings = []
  for spec in [s.strip() for s in config.get("trees", CHAIN).split(";") if s.strip()]:
    if spec == CHAIN:
      settings += [(CHAIN, k) for k in parse_list(config.num_draft_tokens, int)]
    else:
      settings.append((spec, tree_budget(spec)[1]))
  return settings


def draft_cost(bench: Bench, name: str, batch_size: int) -> float | None:
  """c: a draft step over a target step, both timed alone (None for prompt lookup)."""
  if name == "lookup":
    return None
  return bench.step_s(name, batch_size, 1) / bench.step_s("target", batch_size, 1)


def trees_ok(name: str, drafter: drafters.Drafter, schedule: str, spec: str) -> bool:
  """Trees need a drafter that grows them (not prompt lookup), a fixed draft length, and a
  proposal mode that can fill them (a dynamic tree: greedy proposals, ``proposals.fits``)."""
  proposal = getattr(drafter, "proposal", "sampled")
  if name == "lookup" or name.startswith("feature_lookup") or schedule != "fixed":
    return False
  return spec.startswith(SEQUOIA) or proposals.fits(
    proposal, tree_lib.parse(calibration.unfitted(spec))
  )


def check_config(config: ml_collections.ConfigDict) -> None:
  check_choices("tasks", config.tasks, TASKS)
  check_choices("modes", config.modes, MODES)
  check_choices("schedules", config.schedules, speculative.SCHEDULES)
  check_choices("scorings", config.get("scorings", "full"), SCORINGS)
  if min(parse_list(config.num_draft_tokens, int)) < 1 or config.calls < 1:
    raise ValueError("num_draft_tokens and calls must be >= 1.")


def run(
  config: ml_collections.ConfigDict, workdir: str | None = None, log: Callable[[str], None] = print
) -> dict[str, Any]:
  """Runs the comparison (resuming), writes results.json and summary.md; returns the results."""
  check_config(config)
  store = Store(
    config.output_dir,
    fingerprint(config, ("repeat_tokens",), FINGERPRINT_UNLESS_DEFAULT),
    config.resume,
  )
  names = parse_list(config.drafters)
  feature = any(name.startswith("feature") for name in names)
  pair_cfg = pair_config(config)
  modes = [pair_cfg.draft.train.distill.mode] if any(n.startswith("model") for n in names) else []
  parallel = [n for n in names if n.startswith("parallel") and not n.startswith("parallel_head")]
  modes += ["parallel"] if parallel else []
  pair = pair_lib.prepare(
    pair_cfg,
    workdir,
    draft_modes=modes,
    drafts=bool(modes),
    feature_head=feature,
    parallel_head=any(name.startswith("parallel_head") for name in names),
    sequential_head=any(name.startswith("parallel_seq") for name in names),
    log=log,
  )
  built = {name: make_drafter(name, pair, config) for name in names}
  prompts = prompts_lib.of_pair(
    pair,
    config.prompt_source,
    chat=bool(config.get("chat_template", False)),
    limit=config.get("max_prompts", 0),
  )
  batch_sizes = parse_list(config.get("batch_sizes", "1"), int)
  log(f"timing {prompts_lib.describe(prompts, config.prompt_source)}, batches {batch_sizes}")
  tasks = {"continue": prompts, "grounded": grounded_prompts(prompts, config.repeat_tokens)}
  settings = proposal_settings(config)
  widest = max(k if p == CHAIN else tree_budget(p)[0] for p, k in settings)
  cache_slots = prompts.tokens.shape[1] + config.max_new_tokens + widest + 1
  bench = Bench(pair, cache_slots, seed=config.seed, drafters=built)
  rank_temperatures: dict[str, float] = {}  # Per drafter, fitted once ('dynamic:...@fit').

  for task, mode, batch_size in itertools.product(
    parse_list(config.tasks), parse_list(config.modes), batch_sizes
  ):
    batches = prompts_lib.batches(tasks[task], batch_size)
    warp = dict(MODES[mode], max_new_tokens=config.max_new_tokens)
    autoregressive = bench.sample(None, num_draft_tokens=0, **warp)
    warm_autoregressive: tuple[str, ...] = ()
    for name in names:
      for schedule, scoring in itertools.product(
        parse_list(config.schedules), parse_list(config.get("scorings", "full"))
      ):
        for proposal, num_draft_tokens in settings:
          if proposal != CHAIN and not trees_ok(name, built[name], schedule, proposal):
            continue
          if proposal != CHAIN and scoring == "narrow":  # A tree scores all its nodes.
            continue
          record = {
            "task": task,
            "mode": mode,
            "drafter": name,
            "schedule": schedule,
            "num_draft_tokens": num_draft_tokens,
          }
          if batch_size != 1:  # Batch-1 records keep the keys they had before batches.
            record["batch_size"] = batch_size
          if proposal != CHAIN:  # Chain records keep the keys they had before trees.
            record["tree"] = proposal
          if scoring == "narrow":  # Full-width records keep the keys they had before.
            record["scoring"] = scoring
          head_tokens = config.get("head_draft_tokens", 0)
          if head_tokens and name.startswith("feature_lookup"):  # The head's own K.
            record["head_draft_tokens"] = head_tokens
          record_key = "/".join(str(v) for v in record.values())
          if record_key in store.data["records"]:
            continue
          same = [
            r
            for r in store.data["records"].values()
            if (r["task"], r["mode"], r.get("batch_size", 1), r["drafter"])
            == (task, mode, batch_size, name)
          ]
          tree_spec = None if proposal == CHAIN else shaped(proposal, same)
          depth = num_draft_tokens
          if proposal != CHAIN and calibration.needs_fit(proposal):
            if name not in rank_temperatures:
              rank_temperatures[name] = calibration.fit_drafter(
                built[name], pair.target, pair_lib.validation_windows(pair_config(config), pair)
              )
              log(f"{name}: rank temperature {rank_temperatures[name]:.4f} (fitted)")
            record["rank_temperature"] = rank_temperatures[name]
            tree_spec = calibration.fitted(proposal, rank_temperatures[name])
          elif tree_spec != proposal and proposal != CHAIN:  # A shaped tree may be shallower.
            record["shaped_tree"] = tree_lib.parse(tree_spec).parents
            record["shaped_from"] = tree_spec.partition("@")[2]
            depth = tree_lib.parse(tree_spec).max_depth
          # The record's own autoregressive calls, interleaved with its speculative ones: on a
          # shared host a slow minute hits both (one autoregressive timing per setting read
          # 32 to 76 ms a token from one setting to the next on SmolLM2, 2026-11-27).
          pair_timed = time_interleaved(
            {
              "autoregressive": autoregressive,
              "speculative": bench.sample(
                name,
                num_draft_tokens=depth,
                schedule=schedule,
                verifier=config.get("chain_verifier", "token") if proposal == CHAIN else "token",
                tree=tree_spec,
                narrow_scoring=scoring == "narrow",
                **warp,
              ),
            },
            batches,
            config.calls,
            warm=warm_autoregressive,
          )
          ar, timed = pair_timed["autoregressive"], pair_timed["speculative"]
          warm_autoregressive = ("autoregressive",)
          stats = speculative.summarize(timed.outputs)
          if proposal == CHAIN:  # Not in the record's key: the fingerprint holds it.
            record["chain_verifier"] = config.get("chain_verifier", "token")
          record.update(
            ms_per_token=timed.ms_per_token,
            tokens_per_s=timed.tokens_per_s,
            ar_ms_per_token=ar.ms_per_token,
            speedup=ar.ms_per_token / timed.ms_per_token,
            # Call by call against the autoregressive call just before it (same prompt): what a
            # noisy host's slow moments leave of the speedup.
            paired_speedup=timed.paired_speedup(ar),
            # All calls' tokens over all calls' time, over the autoregressive loop's: where the
            # prompts differ (some repeat, some do not), this is a workload's speedup, and the
            # ratio of per-call medians above is a typical prompt's.
            ar_tokens_per_s=ar.tokens_per_s,
            throughput_speedup=timed.tokens_per_s / ar.tokens_per_s,
            tokens_per_call=stats["tokens_per_target_call"],
            mean_draft_length=stats["mean_draft_length"],
            acceptance_rate=stats["acceptance_rate"],
            alpha=stats["alpha"],
            draft_calls_per_call=stats["draft_calls"] / max(stats["target_calls"], 1),
            mean_scored_tokens=stats["mean_scored_tokens"],
            acceptance_at_position=stats["acceptance_at_position"],
            acceptance_at_rank=stats["acceptance_at_rank"],
            draft_cost=draft_cost(bench, name, batch_size),
          )
          store.data["records"][record_key] = record
          store.save()
          log(
            f"{task:>9} {mode:>7} B={batch_size} {name:>15} {schedule:>9} {proposal} {scoring} "
            f"K={num_draft_tokens}: "
            f"{timed.ms_per_token:6.2f} ms/token (AR {ar.ms_per_token:6.2f}), speedup "
            f"{record['speedup']:4.2f}x (paired {record['paired_speedup']:4.2f}x, throughput "
            f"{record['throughput_speedup']:4.2f}x), "
            f"{stats['tokens_per_target_call']:.2f} tokens/call, "
            f"draft length {stats['mean_draft_length']:.2f}, acceptance "
            f"{stats['acceptance_rate']:.3f}"
          )
  summary = summary_table(store.data["records"])
  with open(os.path.join(config.output_dir, "summary.md"), "w") as f:
    f.write(summary + "\n")
  log(summary)
  return store.data


def summary_table(records: dict[str, dict]) -> str:
  """Per task and mode, each drafter's best setting: Markdown. A narrow-scored chain is its
  own proposal ('chain narrow'); 'width' is the scoring call's mean width."""
  best: dict[tuple, dict] = {}
  for record in records.values():
    proposal = record.get("tree", CHAIN)
    if record.get("scoring", "full") != "full":
      proposal += f" {record['scoring']}"
    if record.get("head_draft_tokens"):
      proposal += f" head {record['head_draft_tokens']}"
    group = (
      record["task"],
      record["mode"],
      record.get("batch_size", 1),
      record["drafter"],
      record["schedule"],
      proposal,
    )
    if group not in best or record["speedup"] > best[group]["speedup"]:
      best[group] = record
  lines = [
    "| task | mode | batch | drafter | schedule | proposal | best K | speedup | paired | "
    "throughput | ms/token (AR) | tokens / call | draft length | width | acceptance | alpha | c |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for (task, mode, batch, name, schedule, proposal), r in sorted(best.items()):
    lines.append(
      f"| {task} | {mode} | {batch} | {name} | {schedule} | {proposal} | "
      f"{r['num_draft_tokens']} | "
      f"{r['speedup']:.2f}x | "
      + ("-" if "paired_speedup" not in r else f"{r['paired_speedup']:.2f}x")
      + " | "
      + ("-" if "throughput_speedup" not in r else f"{r['throughput_speedup']:.2f}x")
      + f" | {r['ms_per_token']:.1f} ({r['ar_ms_per_token']:.1f}) | "
      f"{r['tokens_per_call']:.2f} | {r['mean_draft_length']:.2f} | "
      + ("-" if "mean_scored_tokens" not in r else f"{r['mean_scored_tokens']:.2f}")
      + f" | {r['acceptance_rate']:.3f} | {r['alpha']:.3f} | "
      + ("-" if r.get("draft_cost") is None else f"{r['draft_cost']:.3f}")
      + " |"
    )
  return "\n".join(lines)
