"""Answering the prompt set three ways, on the same prompts sorted by length as regeneration
sorts a shard (scripts/benchmark_regeneration.py):

- ``whole batch``: batches of ``batch_size``, each to its longest answer
  (``autoregressive.generate``);
- ``finished rows leave``: the same batches, rows that end leaving (``compacting.generate``);
- ``waiting prompts refill``: every prompt through one batch of ``batch_size``, the next
  prompts prefilled into the places of finished rows, then the tail compacted
  (``compacting.generate(batch_size=...)``: what ``training/regenerate.py`` runs).

Seconds, answer tokens per second and the row-steps kept, each way run ``repeats`` times in
turn after an untimed run of each on the first two batches' prompts (compiling), medians; greedy
answers must agree."""

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

WAYS = ("whole batch", "finished rows leave", "waiting prompts refill")


def ways(
  target: Any,
  rows: list[np.ndarray],
  batch_size: int,
  options: dict[str, Any],
  width_step: int = regenerate.WIDTH_STEP,
) -> dict[str, Callable[[], tuple[np.ndarray, np.ndarray, int]]]:
  """Each way as a function of nothing: (tokens [N, W], lengths [N], row-steps computed), rows
  in the order given, every way's tokens as wide as the widest prompt's batch + the answers."""
  tokens, lengths = regenerate.pad_batch(rows, len(rows), options["pad_id"], width_step)

  def batched(generate) -> tuple[np.ndarray, np.ndarray, int]:
    width = tokens.shape[1] + options["max_new_tokens"]
    out_tokens = np.full((len(rows), width), options["pad_id"], np.int32)
    out_lengths, work = np.zeros(len(rows), np.int32), 0
    for first in range(0, len(rows), batch_size):
      part = rows[first : first + batch_size]
      # The batch at its own width, padded to a full batch, as regeneration padded it.
      prompts, widths = regenerate.pad_batch(part, batch_size, options["pad_id"], width_step)
      got_tokens, got_lengths, steps = generate(prompts, widths)
      out_tokens[first : first + len(part), : got_tokens.shape[1]] = got_tokens[: len(part)]
      out_lengths[first : first + len(part)] = got_lengths[: len(part)]
      work += steps
    return out_tokens, out_lengths, work

  def whole():
    def one(prompts, widths):
      out = autoregressive.generate(target, prompts, widths, jax.random.key(1), **options)
      return np.asarray(out.tokens), np.asarray(out.lengths), batch_size * int(out.model_calls)

    return batched(one)

  def compacted():
    def one(prompts, widths):
      out = compacting.generate(target, prompts, widths, jax.random.key(1), **options)
      return out.tokens, out.lengths, out.row_steps

    return batched(one)

  def refilled():
    out = compacting.generate(
      target, tokens, lengths, jax.random.key(1), batch_size=batch_size, width_step=width_step,
      **options,
    )  # fmt: skip
    return out.tokens, out.lengths, out.row_steps

  return dict(zip(WAYS, (whole, compacted, refilled)))


def measure(
  target: Any,
  rows: list[np.ndarray],
  batch_size: int,
  options: dict[str, Any],
  repeats: int = 1,
  log: Callable[[str], None] = print,
  width_step: int = regenerate.WIDTH_STEP,
) -> dict[str, Any]:
  """``ways`` timed: an untimed round on the first two batches' prompts, then ``repeats``
  rounds on all of them, the ways in turn. With ``width_step`` past the longest prompt every
  batch has one width, and the untimed round compiles every program the timed ones run."""
  timed = ways(target, rows, batch_size, options, width_step)
  warm = ways(target, rows[: 2 * batch_size], batch_size, options, width_step)
  for run in warm.values():
    run()
  seconds = {name: [] for name in WAYS}
  outputs = {}
  for _ in range(repeats):
    for name in WAYS:
      start = time.perf_counter()
      outputs[name] = timed[name]()
      seconds[name].append(time.perf_counter() - start)
      log(f"regeneration: {name}: {seconds[name][-1]:.1f} s")
  prompt_lengths = np.asarray([len(r) for r in rows])
  answer_tokens = int((outputs[WAYS[0]][1] - prompt_lengths).sum())
  result = {
    "prompts": len(rows),
    "batch_size": batch_size,
    "width_step": width_step,
    "answer_tokens": answer_tokens,
  }
  for name in WAYS:
    median = statistics.median(seconds[name])
    result[name] = {
      "seconds": seconds[name],
      "median_seconds": median,
      "answer_tokens_per_second": answer_tokens / median,
      "row_steps": outputs[name][2],
      "kept": answer_tokens / outputs[name][2],
    }
  if options.get("temperature") == 0.0:
    first = outputs[WAYS[0]]
    result["greedy_answers_equal"] = all(
      np.array_equal(first[0], outputs[name][0]) and np.array_equal(first[1], outputs[name][1])
      for name in WAYS[1:]
    )
  for name in WAYS[1:]:
    result[name]["speedup"] = result[WAYS[0]]["median_seconds"] / result[name]["median_seconds"]
  return result


def compare(
  config: ml_collections.ConfigDict,
  workdir: str | None,
  *,
  prompts: int = 128,
  batch_size: int = 32,
  max_new_tokens: int = 256,
  setting: str = "greedy",
  repeats: int = 1,
  offset: int = 0,
  width_step: int = regenerate.WIDTH_STEP,
  log: Callable[[str], None] = print,
) -> dict[str, Any]:
  """``measure`` on ``prompts`` training prompts of the pair's target (from ``offset`` in the
  shuffled order regeneration uses), sorted by length."""
  prepared = pair_lib.prepare(config, workdir, drafts=False, log=log)
  tokenizer, target = prepared.tokenizer, prepared.target
  chosen = [p for p in instructions.default_prompts() if not instructions.held_out(p.id)]
  order = np.random.default_rng(0).permutation(len(chosen))[offset : offset + prompts]
  _, rows, _ = regenerate.encode([chosen[i] for i in order], tokenizer, 384)
  rows = sorted(rows, key=len)
  temperature, top_p = regenerate.SETTINGS[setting]
  options = dict(
    max_new_tokens=max_new_tokens,
    temperature=temperature,
    top_p=top_p,
    eos_id=tokenizer.stop_ids,
    pad_id=tokenizer.pad_id,
  )
  result = measure(target, rows, batch_size, options, repeats, log, width_step)
  result.update(
    max_new_tokens=max_new_tokens,
    setting=setting,
    repeats=repeats,
    device=str(jax.devices()[0].device_kind),
  )
  parts = [
    f"{name} {result[name]['median_seconds']:.1f} s "
    f"({result[name]['answer_tokens_per_second']:.1f} answer tokens/s, "
    f"{result[name]['kept']:.0%} of row-steps kept"
    + (f", {result[name]['speedup']:.2f}x" if "speedup" in result[name] else "")
    + ")"
    for name in WAYS
  ]
  equal = result.get("greedy_answers_equal")
  log(
    f"regeneration: {result['answer_tokens']:,} answer tokens of {len(rows)} prompts, batch "
    f"{batch_size}; "
    + "; ".join(parts)
    + ("" if equal is None else f"; greedy answers equal: {equal}")
  )
  return result
