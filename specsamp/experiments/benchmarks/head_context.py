"""A feature head's offline tau on the held-out answers, read two ways: each packed sequence
apart (``answers.packed_call``, how training and tau read rows since 2026-11-29's fifteenth
session), and whole rows read causally (how they were read before, every sequence seeing the
ones before it in its row).

  python scripts/head_tau_by_context.py --config=configs/smollm2_pair.py

The head is ``config.feature.checkpoint`` (SmolLM2's: the shipped head) unless given; the rows
are what ``scripts/train_drafter.py`` measures tau on (the held-out answers without those whose
prompt a training shard holds, ``eval_batches`` batches spread over them), so the two taus
differ by the context alone.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import nnx

from specsamp.experiments.jobs import answer_training
from specsamp.experiments.jobs import pair as pair_lib
from specsamp.training import answers, feature_train, regenerate, shipped


def compare(
  config: ml_collections.ConfigDict,
  workdir: str,
  head: str | None = None,
  log: Callable[[str], None] = print,
) -> dict[str, Any]:
  """{'K', 'rows', 'head', 'per_sequence': {'tau', 'acc', 'loop'}, 'whole_rows': {...},
  'lookup': {'tau', 'loop'}, 'feature+lookup': {...}, and the head and lookup side by side in
  one tree ('feature and lookup, one tree (...)', ``answers.lookup_beside``)}: ``tau`` the mean
  over answer positions,
  ``loop`` the greedy loop's tokens per call walked over the same counts (``answers.loop_tau``;
  the whole-rows reading's as if each row's sequences were read alone)."""
  section = config.answers
  train_dir = os.path.join(workdir, section.train_dir)
  held_dir = os.path.join(workdir, section.held_out_dir)
  prepared = pair_lib.prepare(config, workdir, drafts=False, log=log)
  if section.get("shipped_dir"):
    for split, split_dir in (("train", train_dir), ("held_out", held_dir)):
      regenerate.seed(os.path.join(section.shipped_dir, split), split_dir, log)
  head = head or config.feature.checkpoint
  if not head:
    raise ValueError("No head to measure: give --head, or set config.feature.checkpoint.")
  model, _ = feature_train.load_head(shipped.resolve(head), prepared.target)
  train_cfg = answer_training.check_optimisation(config, "feature")
  K = section.tau_draft_tokens
  held_shards, removed = answers.without_trained_prompts(
    regenerate.read_shards(held_dir), regenerate.read_shards(train_dir)
  )
  held = answers.batches(held_shards, train_cfg.seq_len, train_cfg.batch_size)
  evaluation = held.spread(train_cfg.eval_batches or held.steps_per_epoch)
  graphdef, state = nnx.split(model)

  @jax.jit
  def correct(state, tokens_BL, weights_BL):
    merged = nnx.merge(graphdef, state)
    return feature_train.greedy_steps_correct(merged, tokens_BL, K, None, weights_BL)

  counts: dict[str, list[np.ndarray]] = {"per_sequence": [], "whole_rows": []}
  for tokens, weights in (batch[:2] for batch in evaluation):
    for name, read in (("per_sequence", weights), ("whole_rows", None)):
      steps = np.asarray(correct(state, tokens, read))
      counts[name].append(answers.accepted_unrolled(steps, weights, K))
  result: dict[str, Any] = {
    "K": K,
    "head": head,
    "rows": int(sum(len(batch[0]) for batch in evaluation)),
    "row_tokens": train_cfg.seq_len + 1,
    "held_out_left_out": removed,
  }
  weights = [np.asarray(batch[1]) for batch in evaluation]
  # Prompt lookup alone and 'feature+lookup' with this head (read per sequence), as
  # train_drafter reports them: the position mean and the loop's figure.
  lookups = answer_training.lookup_counts(evaluation, K)
  measured = {
    name: answer_training.tau_of(
      [answers.chain_layout(a) for a in accepted],
      weights,
      K,
      lookups if name == "per_sequence" else None,
    )
    for name, accepted in counts.items()
  }
  for name, m in measured.items():
    result[name] = {"tau": float(m.tau), "acc": [float(a) for a in m.acc], "loop": float(m.loop)}
    log(
      f"{name}: tau(K={K}) {m.tau:.4f}, acc_1..{K} " + " ".join(f"{a:.3f}" for a in m.acc)
      + f"; in the greedy loop {m.loop:.4f}"
    )  # fmt: skip
  alone = [run for run, _ in lookups]
  result["lookup"] = {
    "tau": float(answers.tau(alone, K)[0]),
    "loop": float(answers.loop_tau(alone, weights, K)[0]),
  }
  per_sequence = measured["per_sequence"]
  result["feature+lookup"] = {
    "tau": float(per_sequence.with_lookup),
    "loop": float(per_sequence.loop_with_lookup),
  }
  # The head's chain and lookup's copy side by side in one tree call ('feature+lookup' with
  # tree='chains:2xK'): with the chain's n-grams, and down to 1-grams (the tree's default).
  runs = [answers.chain_layout(a) for a in counts["per_sequence"]]
  own = [
    answers.lookup_accepted(*batch[:2], K, answer_training.LOOKUP_NGRAMS[0], 1)
    for batch in evaluation
  ]
  for name, looked in (("beside", lookups), ("beside, 1-grams", own)):
    beside = [answers.lookup_beside(*lookup, run) for lookup, run in zip(looked, runs)]
    result[f"feature and lookup, one tree ({name})"] = {
      "tau": float(answers.tau(beside, K)[0]),
      "loop": float(answers.loop_tau(beside, weights, K)[0]),
    }
  for name in [key for key in result if "lookup" in key]:
    tau, loop = result[name]["tau"], result[name]["loop"]
    log(f"{name}: tau(K={K}) {tau:.4f}; in the greedy loop {loop:.4f}")
  return result
