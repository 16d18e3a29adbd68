"""Answering a batch of the prompt set with the whole batch to the end
(``autoregressive.generate``) against with finished rows leaving it (``compacting.generate``,
what ``training/regenerate.py`` runs): seconds, answer tokens per second, and the row-steps
kept, each way run ``repeats`` times in turn after one untimed run of each (compiling), medians
(scripts/benchmark_regeneration.py)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np

from specsamp.experiments.jobs import pair as pair_lib
from specsamp.sampling import autoregressive, compacting
from specsamp.training import instructions, regenerate


def compare(
  config: ml_collections.ConfigDict,
  workdir: str | None,
  *,
  batch_size: int = 64,
  max_new_tokens: int = 256,
  setting: str = "greedy",
  repeats: int = 1,
  offset: int = 0,
  log: Callable[[str], None] = print,
) -> dict[str, Any]:
  """The two ways on the same ``batch_size`` training prompts (from ``offset`` in the shuffled
  order regeneration uses, padded to its width step); greedy answers must agree."""
  prepared = pair_lib.prepare(config, workdir, drafts=False, log=log)
  tokenizer, target = prepared.tokenizer, prepared.target
  chosen = [p for p in instructions.default_prompts() if not instructions.held_out(p.id)]
  order = np.random.default_rng(0).permutation(len(chosen))[offset : offset + batch_size]
  _, rows, _ = regenerate.encode([chosen[i] for i in order], tokenizer, 384)
  prompts, lengths = regenerate.pad_batch(rows, len(rows), tokenizer.pad_id)
  width = prompts.shape[1]
  temperature, top_p = regenerate.SETTINGS[setting]
  options = dict(
    max_new_tokens=max_new_tokens,
    temperature=temperature,
    top_p=top_p,
    eos_id=tokenizer.eos_id,
    pad_id=tokenizer.pad_id,
  )

  def whole():
    out = autoregressive.generate(target, prompts, lengths, jax.random.key(1), **options)
    return np.asarray(out.tokens), np.asarray(out.lengths), len(rows) * int(out.model_calls)

  def compacted():
    out = compacting.generate(target, prompts, lengths, jax.random.key(1), **options)
    return out.tokens, out.lengths, out.row_steps

  ways = {"whole batch": whole, "finished rows leave": compacted}
  seconds = {name: [] for name in ways}
  outputs = {}
  for attempt in range(repeats + 1):  # The first round compiles and is not timed.
    for name, run in ways.items():
      start = time.perf_counter()
      outputs[name] = run()
      if attempt:
        seconds[name].append(time.perf_counter() - start)
        log(f"regeneration: {name}: {seconds[name][-1]:.1f} s")
  answer_tokens = int((outputs["whole batch"][1] - lengths).sum())
  result = {
    "batch_size": len(rows),
    "prompt_width": width,
    "max_new_tokens": max_new_tokens,
    "setting": setting,
    "answer_tokens": answer_tokens,
    "repeats": repeats,
    "device": str(jax.devices()[0].device_kind),
  }
  for name, (_, _, row_steps) in outputs.items():
    median = statistics.median(seconds[name])
    result[name] = {
      "seconds": seconds[name],
      "median_seconds": median,
      "answer_tokens_per_second": answer_tokens / median,
      "row_steps": row_steps,
      "kept": answer_tokens / row_steps,
    }
  if setting == "greedy":
    same = all(
      np.array_equal(a, b)
      for a, b in zip(outputs["whole batch"][:2], outputs["finished rows leave"][:2])
    )
    result["greedy_answers_equal"] = bool(same)
  result["speedup"] = (
    result["whole batch"]["median_seconds"] / result["finished rows leave"]["median_seconds"]
  )
  parts = [
    f"{name} {result[name]['median_seconds']:.1f} s "
    f"({result[name]['answer_tokens_per_second']:.1f} answer tokens/s, "
    f"{result[name]['kept']:.0%} of row-steps kept)"
    for name in ways
  ]
  equal = result.get("greedy_answers_equal")
  log(
    f"regeneration: {answer_tokens:,} answer tokens of {len(rows)} prompts; "
    + "; ".join(parts)
    + f"; {result['speedup']:.2f}x"
    + ("" if equal is None else f"; greedy answers equal: {equal}")
  )
  return result
