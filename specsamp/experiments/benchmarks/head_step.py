"""A feature head's training step on regenerated answers, with the target run at every step
against read from its stored outputs (``training/target_store.py``): seconds per step,
interleaved, medians (scripts/benchmark_head_step.py)."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import ml_collections

from specsamp.experiments.jobs import answer_training
from specsamp.experiments.jobs import pair as pair_lib
from specsamp.training import answers, regenerate


def compare(
  config: ml_collections.ConfigDict,
  workdir: str,
  *,
  repeats: int = 5,
  split: str = "held_out",
  log: Callable[[str], None] = print,
) -> dict[str, Any]:
  """Median seconds of the head's training step on ``split``'s answers, online and stored,
  each repeat timing one of each in turn (the same batch, after one untimed step each)."""
  workdir = os.path.abspath(workdir)
  section = config.answers
  prepared = pair_lib.prepare(config, workdir, drafts=False, log=log)
  directory = os.path.join(
    workdir, section.held_out_dir if split == "held_out" else section.train_dir
  )
  manifest = regenerate.read_manifest(directory)
  if manifest is None:
    raise FileNotFoundError(f"No regenerated answers in {directory}: run scripts/regenerate.py.")
  shards = regenerate.read_shards(directory)
  stream, answer = answers.stream(shards)
  _, trainer, _, _ = answer_training._drafter_setup(
    config, "feature", prepared, stream[answer > 0], manifest
  )
  cfg = trainer.config
  online = answers.batches(shards, cfg.seq_len, cfg.batch_size)
  start = time.perf_counter()
  stored = answer_training.with_stored_outputs(
    prepared.target, trainer, online, workdir, section, split, manifest["target"], log
  )
  build_seconds = time.perf_counter() - start
  stored_rows = stored.stored
  batches = {"online": online.at(0), "stored": stored.at(0)}
  state = trainer.init_state()
  seconds: dict[str, list[float]] = {"online": [], "stored": []}
  for repeat in range(repeats + 1):  # The first round compiles and warms up.
    for name, batch in batches.items():
      begin = time.perf_counter()
      state, metrics = trainer.train_step(state, batch)
      jax.block_until_ready(metrics["loss"])
      if repeat:
        seconds[name].append(time.perf_counter() - begin)
  tokens = cfg.batch_size * cfg.seq_len
  result = {
    "batch": [cfg.batch_size, cfg.seq_len],
    "ttt_steps": cfg.ttt_steps,
    "store_rows": int(stored_rows.shape[0]),
    "store_build_seconds": build_seconds,
    **{f"{name}_seconds": statistics.median(s) for name, s in seconds.items()},
    **{f"{name}_all": s for name, s in seconds.items()},
  }
  result["stored_speedup"] = result["online_seconds"] / result["stored_seconds"]
  for name in seconds:
    log(
      f"head step, target {'run at every step' if name == 'online' else 'outputs stored'}: "
      f"{result[f'{name}_seconds']:.2f} s median ({tokens / result[f'{name}_seconds']:,.0f} "
      f"tokens/s)"
    )
  log(f"stored / online: {result['stored_speedup']:.2f}x faster per step")
  return result
