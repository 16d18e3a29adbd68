"""The job behind ``scripts/sample.py``: autoregressive vs speculative on the trained pair.

Prepares the pair (``pair.prepare``: trains on the first run, loads after),
samples every held-out prompt autoregressively and speculatively with the same
keys, in batches of ``sampling.batch_size`` rows, and reports ms/token of
both, the measured speedup, the acceptance statistics, the measured step
costs, the speedup the formula predicts from them, and sample text.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

import jax
import ml_collections
import numpy as np

from specsamp.experiments import pair as pair_lib
from specsamp import sharding
from specsamp.experiments import speedup
from specsamp.sampling import autoregressive, speculative


@dataclasses.dataclass
class Run:
  """One sampler over all prompt batches (timed after a compile-and-warm-up call)."""

  name: str
  tokens: list[list[int]]  # Generated ids per prompt.
  run_s: float  # Wall time over all batches.
  sequential_tokens: int  # Sum over batches of the longest row: tokens produced one after another.
  compile_s: float
  stats: dict[str, Any] | None = None

  @property
  def ms_per_token(self) -> float:
    return 1e3 * self.run_s / max(self.sequential_tokens, 1)

  @property
  def tokens_per_s(self) -> float:
    return sum(len(t) for t in self.tokens) / max(self.run_s, 1e-9)


@dataclasses.dataclass
class SampleReport:
  prompts: list[list[int]]
  texts: dict[str, list[str]]  # 'prompt', 'autoregressive', 'speculative' -> text per prompt.
  autoregressive: Run
  speculative: Run
  costs: speedup.StepCosts

  @property
  def speedup(self) -> float:
    return self.autoregressive.ms_per_token / self.speculative.ms_per_token

  @property
  def predicted_speedup(self) -> float:
    return self.costs.predicted_speedup(self.speculative.stats["alpha"])


def _run_batches(name: str, sample: Callable[[np.ndarray, int], Any], prompts: np.ndarray,
                 batch_size: int) -> tuple[Run, list[Any]]:
  """``sample(batch, index)`` over the prompts in batches, timed after a warm-up call."""
  batches = [prompts[i:i + batch_size] for i in range(0, len(prompts), batch_size)]
  start = time.perf_counter()
  jax.block_until_ready(sample(batches[0], 0))  # Compile and warm up.
  first_s = time.perf_counter() - start
  outputs = []
  start = time.perf_counter()
  for index, batch in enumerate(batches):
    outputs.append(jax.block_until_ready(sample(batch, index)))
  run_s = time.perf_counter() - start
  tokens = [out.generated(row).tolist() for out in outputs for row in range(out.tokens.shape[0])]
  sequential = sum(int(np.max(out.num_generated)) for out in outputs)
  return Run(name=name, tokens=tokens, run_s=run_s, sequential_tokens=sequential,
             compile_s=max(first_s - run_s / len(batches), 0.0)), outputs


def run(config: ml_collections.ConfigDict, workdir: str | None = None,
        log: Callable[[str], None] = print) -> SampleReport:
  """Prepares the pair and samples its held-out prompts both ways."""
  s, num_draft_tokens = config.sampling, config.speculative.num_draft_tokens
  if s.batch_size < 1 or s.num_prompts % s.batch_size:
    raise ValueError(f"sampling.num_prompts ({s.num_prompts}) must be a multiple of "
                     f"sampling.batch_size ({s.batch_size}).")
  pair = pair_lib.prepare(config, workdir, log=log)
  tokenizer, target, draft, prompts = pair.tokenizer, pair.target, pair.draft, pair.prompts
  lengths = np.full((s.batch_size,), prompts.shape[1], np.int32)
  common = dict(max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_k=s.top_k,
                top_p=s.top_p, eos_id=tokenizer.eos_id if s.use_eos else None,
                pad_id=tokenizer.pad_id)
  key = jax.random.key(config.seed)

  # Batch i samples with fold_in(key, i) in both samplers.
  def sample_autoregressive(batch, index):
    with sharding.use_mesh(pair.mesh):
      return autoregressive.generate(target, batch, lengths, jax.random.fold_in(key, index),
                                     **common)

  def sample_speculative(batch, index):
    with sharding.use_mesh(pair.mesh):
      return speculative.speculative_generate(
          target, draft, batch, lengths, jax.random.fold_in(key, index), num_draft_tokens=num_draft_tokens,
          verifier=config.speculative.verifier, **common)

  log(f"sampling {len(prompts)} held-out prompts of {prompts.shape[1]} tokens, "
      f"{s.max_new_tokens} new tokens each, {s.batch_size} per call")
  ar, _ = _run_batches("autoregressive", sample_autoregressive, prompts, s.batch_size)
  sps, outputs = _run_batches("speculative", sample_speculative, prompts, s.batch_size)
  sps.stats = speculative.summarize(outputs)
  cache_length = prompts.shape[1] + s.max_new_tokens + num_draft_tokens + 1
  costs = speedup.measure_costs(target, draft, s.batch_size, num_draft_tokens, cache_length, pair.mesh)
  texts = {"prompt": [tokenizer.decode(p) for p in prompts],
           "autoregressive": [tokenizer.decode(t) for t in ar.tokens],
           "speculative": [tokenizer.decode(t) for t in sps.tokens]}
  return SampleReport(prompts=prompts.tolist(), texts=texts, autoregressive=ar, speculative=sps,
                      costs=costs)


def report_json(report: SampleReport) -> dict[str, Any]:
  """The report as JSON-ready data: prompts, texts, generated ids and statistics per sampler,
  step costs, and the measured and predicted speedups."""
  return {**dataclasses.asdict(report), "speedup": report.speedup,
          "predicted_speedup": report.predicted_speedup}


def format_report(report: SampleReport, num_samples: int = 2) -> str:
  """Human-readable report: sample text, then the numbers."""
  lines = []
  for row in range(min(num_samples, len(report.prompts))):
    lines.append(f"--- held-out prompt {row} " + "-" * 40)
    lines.append(report.texts["prompt"][row])
    for name in ("autoregressive", "speculative"):
      lines.append(f"--- {name} continuation:")
      lines.append(report.texts[name][row])
  lines.append("-" * 64)
  for r in (report.autoregressive, report.speculative):
    lines.append(f"{r.name:>14}: {r.ms_per_token:7.2f} ms/token  {r.tokens_per_s:8.1f} tokens/s  "
                 f"({r.run_s:.2f} s for {len(r.tokens)} prompts; compile {r.compile_s:.1f} s)")
  stats, costs = report.speculative.stats, report.costs
  num_draft_tokens = stats["num_draft_tokens"]
  per_position = " ".join(f"{a:.2f}" for a in stats["acceptance_at_position"])
  lines += [
      f"       speedup: {report.speedup:.2f}x measured (autoregressive ms/token over speculative)",
      f"    acceptance: {stats['acceptance_rate']:.3f} of draft tokens accepted; alpha "
      f"{stats['alpha']:.3f}; P(token t accepted), t=1..{num_draft_tokens}: {per_position}",
      f"tokens/target call: {stats['tokens_per_target_call']:.2f} (K={num_draft_tokens}); accepted-count "
      f"histogram {stats['accepted_histogram']}",
      f"    step costs: target {costs.target_step_s * 1e3:.3f} ms, draft "
      f"{costs.draft_step_s * 1e3:.3f} ms (c = {costs.draft_ratio:.3f}), target scoring {num_draft_tokens + 1} "
      f"tokens {costs.target_score_s * 1e3:.3f} ms ({costs.score_ratio:.2f}x a step)",
      f"     predicted: {report.predicted_speedup:.2f}x = E[tokens/call] "
      f"{speedup.expected_tokens_per_call(stats['alpha'], num_draft_tokens):.2f} x target step / "
      f"({num_draft_tokens} draft steps + scoring); efficiency (measured / predicted) "
      f"{report.speedup / report.predicted_speedup:.2f}",
  ]
  return "\n".join(lines)
