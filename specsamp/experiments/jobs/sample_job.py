"""The job behind ``scripts/sample.py``: autoregressive vs speculative on the trained pair.

Prepares the pair (``pair.prepare``: trains on the first run, loads after),
samples every held-out prompt autoregressively and speculatively with the same
keys, in batches of ``sampling.batch_size`` rows, and reports ms/token of
both, the measured speedup, the acceptance statistics, the measured step
costs, the speedup the formula predicts from them, and sample text.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import ml_collections
import numpy as np

from specsamp.experiments.benchmarks import speedup, timing
from specsamp.experiments.benchmarks.harness import Bench, format_choice
from specsamp.experiments.jobs import drafter_specs
from specsamp.experiments.jobs import pair as pair_lib
from specsamp.experiments.jobs import prompts as prompts_lib
from specsamp.sampling import (
  calibration,
  lookup_feature_drafter,
  proposals,
  speculative,
  tree_step,
  warping,
)
from specsamp.sampling import statistics as sampling_statistics
from specsamp.sampling import tree as tree_lib
from specsamp.sampling.tree import TreeShape
from specsamp.training import tokenizer as tokenizer_lib

DRAFT = "draft"  # The drafter sampled with, by its name in the harness.


@dataclasses.dataclass
class SampleReport:
  prompts: list[list[int]]
  texts: dict[str, list[str]]  # 'prompt', 'autoregressive', 'speculative' -> text per prompt.
  tokens: dict[str, list[list[int]]]  # 'autoregressive', 'speculative' -> generated ids.
  autoregressive: timing.Timed
  speculative: timing.Timed
  stats: dict[str, Any]  # The speculative run's statistics (speculative.summarize).
  costs: speedup.StepCosts
  settings: dict[str, Any] = dataclasses.field(default_factory=dict)  # What was sampled with.
  choice: dict[str, Any] | None = None  # The automatic draft length's choice and its reasons.
  # One drafting call as the drafter makes it: {'tokens': its width per row, 'seconds': its
  # time, 'per_iteration': the loop's measured calls per iteration}; None: K draft steps.
  draft_call: dict[str, Any] | None = None

  @property
  def speedup(self) -> float:
    return self.autoregressive.ms_per_token / self.speculative.ms_per_token

  @property
  def expected_tokens_per_call(self) -> float:
    """A chain's expected tokens per loop iteration as the call's time pays them: max_new_tokens
    over the slowest row's expected iterations, each row at its own alpha (i.i.d. acceptance;
    ``speedup.slowest_row_iterations``, the sweep's and the automatic K's prediction); at batch
    1 the paper's (1 - alpha^(K+1)) / (1 - alpha) with the last iteration cut at
    max_new_tokens. A tree: the measured tokens per call (no closed form)."""
    if self.settings.get("tree"):
      return self.stats["tokens_per_target_call"]
    rows = self.stats.get("row_alphas") or [self.stats["alpha"]]
    new_tokens = self.settings["max_new_tokens"]
    iterations = speedup.slowest_row_iterations(rows, self.stats["num_draft_tokens"], new_tokens)
    return new_tokens / iterations

  @property
  def predicted_speedup(self) -> float:
    """``expected_tokens_per_call`` x a target step over an iteration's cost: the drafting
    calls the loop made per iteration (measured: K for a chain drafted token by token, fewer
    where max_new_tokens cut the last drafts, 1 for a parallel drafter) at the cost of one
    such call, plus the scoring call. (Before 2026-11-30 the paper's E[tokens/call] at the
    pooled alpha, uncut and one row: at batch 8 it promised tokens the slowest row never
    let a call collect, beside a sweep that predicted the same run otherwise.)"""
    if self.draft_call is None:
      draft_s = self.stats["num_draft_tokens"] * self.costs.draft_step_s
    else:
      draft_s = self.draft_call["per_iteration"] * self.draft_call["seconds"]
    iteration_s = draft_s + self.costs.target_score_s
    return self.expected_tokens_per_call * self.costs.target_step_s / iteration_s


def _generated(outputs: list[Any]) -> list[list[int]]:
  """Generated ids of every row of every call, in prompt order."""
  return [out.generated(row).tolist() for out in outputs for row in range(out.tokens.shape[0])]


def _is_int(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def tree_of(config: ml_collections.ConfigDict) -> TreeShape | None:
  """The pair config's tree proposal (``speculative.tree``; '' is a single chain)."""
  spec = config.speculative.get("tree", "") or ""
  if not spec:
    return None
  try:  # '@fit': the rank temperature is fitted once the pair is loaded (run).
    tree = tree_lib.parse(calibration.unfitted(spec))
    # A static tree, or one with its own '@tau', took '@fit' here and failed only after the
    # pair was prepared and the fit had run (2026-11-30's review).
    if calibration.needs_fit(spec) and ("@" in calibration.unfitted(spec) or not tree.dynamic):
      raise ValueError(
        "'@fit' fits a dynamic tree's rank temperature: give it to a 'dynamic:' tree without "
        "a '@tau' of its own, e.g. 'dynamic:4x3@fit'."
      )
    return tree
  except ValueError as error:
    raise ValueError(f"--config.speculative.tree={spec!r}: {error}") from None


def draft_length(config: ml_collections.ConfigDict) -> int:
  """K: ``speculative.num_draft_tokens``, or the tree's depth when a tree is set."""
  tree = tree_of(config)
  return config.speculative.num_draft_tokens if tree is None else tree.max_depth


def check_settings(config: ml_collections.ConfigDict) -> None:
  """Validates the sampling and speculative sections before anything trains or compiles.

  Raises:
    ValueError: one line naming the flag, its value and what is allowed, e.g.
      ``--config.sampling.top_p=0.0: must be in (0, 1]``.
  """
  s, spec = config.sampling, config.speculative
  tree = tree_of(config)
  verifiers = speculative.EXACT_VERIFIERS if tree is None else tree_step.VERIFIERS
  if tree is not None and tree.dynamic:
    verifiers = ("token",)  # Per-row parents: the token verifier reads them.
  checks = [
    (
      "sampling.max_new_tokens",
      s.max_new_tokens,
      _is_int(s.max_new_tokens) and s.max_new_tokens >= 1,
      "must be an int >= 1",
    ),
    (
      "sampling.temperature",
      s.temperature,
      _is_number(s.temperature)
      and (s.temperature == 0 or s.temperature >= warping.MIN_TEMPERATURE),
      f"must be 0 (greedy) or a finite number >= {warping.MIN_TEMPERATURE:.4g}",
    ),
    (
      "sampling.top_k",
      s.top_k,
      _is_int(s.top_k) and s.top_k >= 0,
      "must be an int >= 0 (0 keeps all)",
    ),
    ("sampling.top_p", s.top_p, _is_number(s.top_p) and 0 < s.top_p <= 1, "must be in (0, 1]"),
    (
      "sampling.batch_size",
      s.batch_size,
      _is_int(s.batch_size) and s.batch_size >= 1,
      "must be an int >= 1",
    ),
    (
      "sampling.num_prompts",
      s.num_prompts,
      _is_int(s.num_prompts)
      and s.num_prompts >= 1
      and _is_int(s.batch_size)
      # Only the held-out windows number num_prompts; a prompt source's count is its own.
      and (
        s.get("prompt_source", "held_out") != "held_out"
        or s.num_prompts % max(s.batch_size, 1) == 0
      ),
      f"must be a positive multiple of sampling.batch_size ({s.batch_size})",
    ),
    (
      "speculative.num_draft_tokens",
      spec.num_draft_tokens,
      _is_int(spec.num_draft_tokens) and spec.num_draft_tokens >= 1,
      "must be an int >= 1 (K)",
    ),
    (
      "speculative.num_draft_tokens",
      spec.num_draft_tokens,
      tree is not None  # A tree's depth is its K (checked below), whatever this says.
      or not (_is_int(spec.num_draft_tokens) and _is_int(s.max_new_tokens))
      or spec.num_draft_tokens <= s.max_new_tokens,
      f"must be <= sampling.max_new_tokens ({s.max_new_tokens}): a row never uses more than "
      "max_new_tokens - 1 draft tokens",
    ),
    (
      "sampling.max_prompts",
      s.get("max_prompts", 0),
      _is_int(s.get("max_prompts", 0)) and s.get("max_prompts", 0) >= 0,
      "must be an int >= 0 (0: all of them)",  # -3 read as all of them (2026-11-30).
    ),
    ("sampling.seed", s.seed, _is_int(s.seed), "must be an int"),
    ("sampling.prompt_seed", s.prompt_seed, _is_int(s.prompt_seed), "must be an int"),
    (
      "sampling.prompt_tokens",
      s.prompt_tokens,
      _is_int(s.prompt_tokens) and s.prompt_tokens >= 1,
      "must be an int >= 1",
    ),
    (
      "speculative.draft_length",
      spec.get("draft_length", "fixed"),
      spec.get("draft_length", "fixed") in ("auto", "fixed"),
      "must be 'auto' or 'fixed'",
    ),
    (
      "speculative.drafter",
      spec.get("drafter", "draft"),
      _parses(spec.get("drafter", "draft")),
      f"must be one of {drafter_specs.NAMES} (drafter_specs.py)",
    ),
    (
      "speculative.proposal",
      spec.get("proposal", "sampled"),
      spec.get("proposal", "sampled") in proposals.PROPOSALS
      and proposals.fits(spec.get("proposal", "sampled"), tree),
      f"must be one of {proposals.PROPOSALS}"
      + (
        ""
        if tree is None
        else " ('greedy' only, with a dynamic tree: its tokens are chosen)"
        if tree.dynamic
        else " ('greedy' with distinct siblings only)"
      ),
    ),
    (
      "speculative.verifier",
      spec.verifier,
      spec.verifier in verifiers,
      f"must be one of {verifiers}"
      + ("" if tree is None else " with a dynamic tree" if tree.dynamic else " with a tree"),
    ),
  ]
  stop = spec.get("confidence_threshold", 0.0)
  checks.append(
    (
      "speculative.confidence_threshold",
      stop,
      isinstance(stop, (int, float)) and 0.0 <= stop < 1.0,
      "must be a number in [0, 1) (0: never stop a draft early)",
    )
  )
  head_tokens = spec.get("head_draft_tokens", 0)
  checks.append(
    (
      "speculative.head_draft_tokens",
      head_tokens,
      _is_int(head_tokens) and head_tokens >= 0,
      "must be an int >= 0 (0: the head drafts K, as copies do)",
    )
  )
  if tree is not None:
    name = spec.get("drafter", "draft")
    kind = drafter_specs.parse(name).kind if _parses(name) else None  # Else refused above.
    checks += [
      (
        "speculative.tree",
        spec.tree,
        not _is_int(s.max_new_tokens) or tree.max_depth <= s.max_new_tokens,
        f"its depth {tree.max_depth} must be <= sampling.max_new_tokens ({s.max_new_tokens})",
      ),
      (
        "speculative.tree",
        spec.tree,
        not (kind == "lookup" and not tree.is_chain),
        f"drafter={name!r} proposes single chains (a copied continuation has no siblings); "
        "trees need a model drafter: draft, self:L, feature or a parallel one",
      ),
      (
        "speculative.tree",
        spec.tree,
        kind != "feature_lookup" or lookup_feature_drafter.is_side_by_side(tree),
        f"drafter={name!r} proposes a chain, or its copy beside the head's chain as the tree "
        f"'chains:2x{tree.max_depth}'; other trees need drafter 'feature'",
      ),
    ]
  for path, value, ok, allowed in checks:
    if not ok:
      raise ValueError(f"--config.{path}={value!r}: {allowed}")
  target = config.get("target", {})
  if tree is not None and not target.get("checkpoint") and "model" in target:
    # A target trained here: its vocabulary is known before it trains (a checkpoint's is
    # checked when the sampler is built, seconds after it loads).
    try:
      tree_step.check_widths(tree, target.model.vocab_size)
    except ValueError as error:
      raise ValueError(f"--config.speculative.tree={spec.tree!r}: {error}") from None
  name = spec.get("drafter", "draft")
  if _parses(name):  # A checkpoint's count is read when it loads (``run``).
    trained = drafter_specs.trained_positions(drafter_specs.parse(name), config, False)
    check_trained_positions(config, trained)


def confidence_threshold(
  config: ml_collections.ConfigDict, tree: TreeShape | None, log: Callable[[str], None] = print
) -> float:
  """The confidence stop the drafter gets: the config's, but 0 with a dynamic tree, which spends
  its node budget where the draft is confident already (the drafters refuse both). Said, not
  refused, as for narrow scoring: a pair config's stop (configs/smollm2_pair.py's 0.5) is no
  reason to refuse a tree."""
  stop = float(config.speculative.get("confidence_threshold", 0.0))
  if stop and tree is not None and tree.dynamic:
    log(
      f"confidence_threshold={stop} applies to chains and static trees: the dynamic tree "
      "drafts without it (it spends its node budget where the draft is confident already)"
    )
    return 0.0
  return stop


def check_trained_positions(config: ml_collections.ConfigDict, trained: Any) -> None:
  """Refuses a fixed K (or a tree's depth) past the positions a parallel drafter was trained
  to fill (``drafter_specs.trained_positions``); the automatic K stays within them."""
  spec = config.speculative
  tree = tree_of(config)
  if trained is None or (tree is None and spec.get("draft_length", "fixed") == "auto"):
    return
  count, source = trained
  flag, K = ("tree", spec.tree) if tree is not None else ("num_draft_tokens", spec.num_draft_tokens)
  depth = tree.max_depth if tree is not None else K
  if depth > count:
    raise ValueError(
      f"--config.speculative.{flag}={K!r}: drafter={spec.get('drafter', 'draft')!r} drafts "
      f"{depth} positions per pass but was trained to fill {count} ({source}); past them it "
      "reads placeholders it never learned (exact, but rarely accepted). Draft at most "
      f"{count}, use --config.speculative.draft_length=auto (it stays within them), or train "
      "more positions."
    )


def _parses(name: str) -> bool:
  try:
    drafter_specs.parse(name)
  except ValueError:
    return False
  return True


def context_warnings(config: ml_collections.ConfigDict, longest_prompt: int) -> list[str]:
  """Warnings for rows that run past what a trained model saw: prompt + max_new_tokens beyond
  its ``train.seq_len`` (models loaded from a checkpoint or imported from a GGUF file do not
  record theirs; a drafter with no draft model has none to warn about)."""
  reach = longest_prompt + config.sampling.max_new_tokens
  drafter = drafter_specs.parse(config.speculative.get("drafter", "draft"))
  warnings = []
  for name in ("target", "draft") if drafter.needs_draft else ("target",):
    section = config[name]
    if section.get("checkpoint") or section.get("gguf"):
      continue
    context = section.train.seq_len
    if reach > context:
      warnings.append(
        f"prompts of up to {longest_prompt} tokens + max_new_tokens="
        f"{config.sampling.max_new_tokens} reach position {reach}, {reach / context:.1f}x the "
        f"{name}'s training context of {context} tokens (--config.{name}.train.seq_len); "
        "quality past it is whatever RoPE extrapolation gives"
      )
  return warnings


def run(
  config: ml_collections.ConfigDict, workdir: str | None = None, log: Callable[[str], None] = print
) -> SampleReport:
  """Prepares the pair and samples the prompts of ``sampling.prompt_source`` both ways."""
  check_settings(config)
  s, num_draft_tokens, tree = config.sampling, draft_length(config), tree_of(config)
  source = s.get("prompt_source", "held_out")
  trains_tokenizer = not (config.target.get("gguf") or config.target.get("checkpoint"))
  if s.get("chat_template", False) and trains_tokenizer:
    raise ValueError(
      "--config.sampling.chat_template=True: this pair's tokenizer is trained here "
      "(SentencePiece) and has no chat template; use a pair whose target comes with one (an "
      "imported HF or GGUF model, e.g. configs/smollm2_pair.py)."
    )
  if source != "held_out":  # A missing file or a batch size that does not divide the prompts
    texts = prompts_lib.texts_of(source)  # fails before anything trains.
    count = min(len(texts), s.max_prompts) if s.get("max_prompts", 0) > 0 else len(texts)
    if count % s.batch_size:
      raise ValueError(
        f"--config.sampling.batch_size={s.batch_size}: must divide the {count} prompts of {source}."
      )
  drafter = drafter_specs.parse(config.speculative.get("drafter", "draft"))
  pair = drafter_specs.prepare_pair(drafter, config, workdir, log)
  tokenizer = pair.tokenizer
  trained = drafter_specs.trained_positions(drafter, config)
  check_trained_positions(config, trained)
  draft = drafter_specs.make(
    drafter,
    pair,
    config.speculative.get("proposal", "sampled"),
    mask_token_id=config.draft.train.distill.get("mask_token", -1),
    confidence_threshold=confidence_threshold(config, tree, log),
    head_draft_tokens=config.speculative.get("head_draft_tokens", 0),
  )
  prompts = prompts_lib.of_pair(
    pair, source, chat=bool(s.get("chat_template", False)), limit=s.get("max_prompts", 0)
  )
  for warning in context_warnings(config, int(prompts.lengths.max())):
    log(f"warning: {warning}")
  if tree is not None and calibration.needs_fit(config.speculative.tree):
    tau = calibration.fit_drafter(draft, pair.target, pair_lib.validation_windows(config, pair))
    tree = tree_lib.parse(calibration.fitted(config.speculative.tree, tau))
    log(f"rank temperature {tau:.4f}, fitted on validation windows (calibration.py)")
  if tree is not None:
    log(f"tree proposal {config.speculative.tree}: {tree.describe()}; K = its depth")
  common = dict(
    max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p
  )
  if config.speculative.get("narrow_scoring", False):
    if tree is None:
      common["narrow_scoring"] = True
    else:  # A config's default (configs/smollm2_pair.py's) is no reason to refuse a tree.
      log("narrow_scoring applies to chains: the tree's scoring call scores all its nodes")
  # One harness, one kept-cache sampler for both loops (benchmarks/harness.py): models split
  # once, compiled loops and KV caches kept between calls; K = 0 is its autoregressive loop.
  batches = prompts_lib.batches(prompts, s.batch_size)
  if s.use_eos:
    tokenizer_lib.check_stop_ids(tokenizer, pair.target.vocab_size)
  scored = (num_draft_tokens if tree is None else tree.num_nodes) + 1
  bench = Bench(
    pair,
    cache_slots=prompts.tokens.shape[1] + s.max_new_tokens + scored,
    seed=s.seed,
    drafters={DRAFT: draft},
    eos_id=tokenizer.stop_ids if s.use_eos else None,
  )
  choice = None
  auto = config.speculative.get("draft_length", "fixed") == "auto"
  if auto and tree is not None:
    log(f"  draft length: the tree's depth, {tree.max_depth} (draft_length='auto' sizes chains)")
  elif auto:
    largest = num_draft_tokens
    if trained is not None and trained[0] < largest:
      largest = trained[0]
      log(
        f"  draft length: at most {largest}, the positions the drafter was trained to fill "
        f"({trained[1]})"
      )
    choice = bench.choose_draft_length(
      DRAFT, batches, largest, verifier=config.speculative.verifier, **common
    )
    log(f"  draft length: {format_choice(choice)}")
    num_draft_tokens = choice["num_draft_tokens"]

  log(
    f"sampling {prompts_lib.describe(prompts, source)}, {s.max_new_tokens} new tokens each, "
    f"{s.batch_size} per call"
  )
  samplers = {"autoregressive": bench.sample(DRAFT, num_draft_tokens=0, **common)}
  if num_draft_tokens or tree is not None:
    samplers["speculative"] = bench.sample(
      DRAFT, num_draft_tokens=num_draft_tokens, verifier=config.speculative.verifier, tree=tree,
      **common,
    )  # fmt: skip
  # Batch i samples with fold_in(key, i) in both samplers; their calls are interleaved.
  timed = timing.time_interleaved(samplers, batches, warm=_probed(choice, batches))
  ar = timed["autoregressive"]
  # K = 0 (the automatic length chose autoregressive sampling): the speculative job is the
  # autoregressive loop itself, timed once; timing it twice would only time the noise.
  # (A shallow copy: both reports share the timed calls' lists, which nothing changes after.)
  sps = timed.get("speculative") or dataclasses.replace(ar, name="speculative")
  tokens = {"autoregressive": _generated(ar.outputs), "speculative": _generated(sps.outputs)}
  scored = (num_draft_tokens if tree is None else tree.num_nodes) + 1
  costs = bench.step_costs(DRAFT, s.batch_size, num_draft_tokens, score_tokens=scored)
  stats = speculative.summarize(sps.outputs)
  draft_call = None
  if num_draft_tokens:
    stats["row_alphas"] = sampling_statistics.row_alphas(sps.outputs)
    width = draft.call_tokens(num_draft_tokens if tree is None else tree.max_depth)
    calls = len(sps.outputs)  # One prefill each, of both models.
    loop_iterations = max(stats["target_calls"] - calls, 1)
    draft_call = {
      "tokens": width,
      "seconds": bench.step_s(DRAFT, s.batch_size, width),
      "per_iteration": (stats["draft_calls"] - calls * draft.model_calls_per_prefill)
      / loop_iterations,
    }
  texts = {
    "prompt": [tokenizer.decode(p, stop=False) for p in prompts.rows()],  # Every turn.
    **{name: [tokenizer.decode(t) for t in ids] for name, ids in tokens.items()},
  }
  return SampleReport(
    choice=choice,
    prompts=prompts.rows(),
    texts=texts,
    tokens=tokens,
    autoregressive=ar,
    speculative=sps,
    stats=stats,
    costs=costs,
    draft_call=draft_call,
    settings={
      "prompt_source": source,
      "temperature": s.temperature,
      "top_k": s.top_k,
      "top_p": s.top_p,
      "drafter": config.speculative.get("drafter", "draft"),
      "num_draft_tokens": num_draft_tokens,
      **({"tree": config.speculative.tree} if tree is not None else {}),
      **({"rank_temperature": tree.rank_temperature} if tree is not None and tree.dynamic else {}),
      **({"draft_length": "auto"} if choice is not None else {}),
      "verifier": config.speculative.verifier,
      "batch_size": s.batch_size,
      "max_new_tokens": s.max_new_tokens,
      "seed": s.seed,
      "prompt_seed": s.prompt_seed,
    },
  )


def _probed(choice: dict[str, Any] | None, batches: list[Any]) -> set[str]:
  """The samplers the automatic draft length's probes already called on every batch's shape
  (they ran on the first batches, all of the first one's shape): the autoregressive loop, and
  the speculative one if its K was probed. Their warm-up calls are skipped: on SmolLM2 each
  costs as much as a timed call."""
  shape = timing.input_shape(batches[0])
  if choice is None or any(timing.input_shape(b) != shape for b in batches):
    return set()
  probed = {p["num_draft_tokens"] for p in choice["probes"]}
  return {"autoregressive"} | ({"speculative"} if choice["num_draft_tokens"] in probed else set())


def report_json(report: SampleReport) -> dict[str, Any]:
  """The report as JSON-ready data: prompts, texts, generated ids and statistics per sampler,
  step costs, and the measured and predicted speedups."""
  return {
    "settings": report.settings,
    "prompts": report.prompts,
    "texts": report.texts,
    "tokens": report.tokens,
    "autoregressive": report.autoregressive.summary(),
    "speculative": report.speculative.summary(),
    "stats": report.stats,
    "costs": dataclasses.asdict(report.costs),
    "draft_call": report.draft_call,
    "speedup": report.speedup,
    "predicted_speedup": report.predicted_speedup,
  }


def rows_jsonl(report: SampleReport) -> list[dict[str, Any]]:
  """One record per prompt: its text, both continuations, and the speculative row's own
  statistics (tokens generated, iterations, tokens per target call, accepted-count
  histogram, draft tokens proposed)."""
  rows = []
  for out in report.speculative.outputs:
    generated = np.asarray(out.num_generated)
    iterations = np.asarray(out.iterations)
    for b in range(len(generated)):
      rows.append(
        {
          "generated_tokens": int(generated[b]),
          "iterations": int(iterations[b]),
          "tokens_per_target_call": float(generated[b] / max(iterations[b], 1)),
          "accepted_histogram": np.asarray(out.accepted_histogram[b]).tolist(),
          "proposed": int(out.proposed[b]),
        }
      )
  return [
    {
      "prompt": report.texts["prompt"][i],
      "autoregressive": report.texts["autoregressive"][i],
      "speculative": report.texts["speculative"][i],
      **row,
    }
    for i, row in enumerate(rows)
  ]


def format_report(report: SampleReport, num_samples: int = 2) -> str:
  """Human-readable report: sample text, then the numbers."""
  lines = []
  for row in range(min(num_samples, len(report.prompts))):
    lines.append(f"--- prompt {row} " + "-" * 40)
    lines.append(report.texts["prompt"][row])
    for name in ("autoregressive", "speculative"):
      lines.append(f"--- {name} continuation:")
      lines.append(report.texts[name][row])
  lines.append("-" * 64)
  lines.append("      settings: " + ", ".join(f"{k}={v}" for k, v in report.settings.items()))
  if report.choice is not None:
    lines.append(f"  draft length: {format_choice(report.choice)}")
  for r in (report.autoregressive, report.speculative):
    lines.append(
      f"{r.name:>14}: {r.ms_per_token:7.2f} ms/token  {r.tokens_per_s:8.1f} tokens/s  "
      f"({r.run_s:.2f} s for {len(report.prompts)} prompts; compile {r.compile_s:.1f} s)"
    )
  stats, costs = report.stats, report.costs
  num_draft_tokens = stats["num_draft_tokens"]
  if num_draft_tokens == 0:  # The automatic length chose autoregressive sampling.
    lines.append(
      f"       speedup: {report.speedup:.2f}x: K=0 samples autoregressively (no K was predicted "
      "to pay on this machine), so the speculative job is the autoregressive loop, timed once"
    )
    return "\n".join(lines)
  tree = report.settings.get("tree")
  expected = (
    f"tokens/call {report.expected_tokens_per_call:.2f} (measured: a tree has no closed form)"
    if tree
    else f"tokens/iteration {report.expected_tokens_per_call:.2f} (max_new_tokens over the "
    "slowest row's expected iterations)"
  )
  call = report.draft_call
  drafting = (
    f"{num_draft_tokens} draft steps"
    if call is None
    else f"{call['per_iteration']:.2f} draft calls of {call['tokens']} token"
    + ("s" if call["tokens"] > 1 else "")
    + f" at {call['seconds'] * 1e3:.3f} ms"
  )
  per_position = " ".join(f"{a:.2f}" for a in stats["acceptance_at_position"])
  lines += [
    f"       speedup: {report.speedup:.2f}x measured (autoregressive ms/token over speculative)",
    f"    acceptance: {stats['acceptance_rate']:.3f} of draft tokens accepted; alpha "
    f"{stats['alpha']:.3f}; P(token t accepted), t=1..{num_draft_tokens}: {per_position}",
    f"tokens/target call: {stats['tokens_per_target_call']:.2f} (K={num_draft_tokens}"
    + (f", tree {tree}, {stats['mean_draft_length']:.1f} nodes proposed per call" if tree else "")
    + "); "
    f"accepted-count histogram {stats['accepted_histogram']}",
    f"    step costs: target {costs.target_step_s * 1e3:.3f} ms, draft "
    f"{costs.draft_step_s * 1e3:.3f} ms (c = {costs.draft_ratio:.3f}), target scoring "
    f"{costs.score_tokens} tokens {costs.target_score_s * 1e3:.3f} ms "
    f"({costs.score_ratio:.2f}x a step)",
    f"     predicted: {report.predicted_speedup:.2f}x = {expected} x target step / "
    f"({drafting} + scoring); efficiency (measured / predicted) "
    f"{report.speedup / report.predicted_speedup:.2f}",
  ]
  return "\n".join(lines)
