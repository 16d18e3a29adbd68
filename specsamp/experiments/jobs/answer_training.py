r"""A pair's draft trained on the target's regenerated answers (scripts/train_drafter.py).

  WORKDIR/regenerated/train/     scripts/regenerate.py's shards: what the draft trains on
  WORKDIR/regenerated/held_out/  greedy answers to the held-out prompts: tau is measured there
  WORKDIR/draft_answers/<step>/  the run's orbax checkpoints (it resumes from the newest)
  WORKDIR/draft_answers/best/    the parameters of the evaluation with the highest tau, and
                                 best.json (step, tau, acc per position, training tokens)

The loss is taken on answer tokens only (``answers``): ``distill.mode='none'`` is the
cross-entropy to the target's own tokens (on greedy answers, its argmax: what T = 0 accepts),
``'token'`` the KL to the target's whole distribution at each answer position (one teacher-forced
pass of the target per step; it prices T > 0 better). Each evaluation reports the held-out loss
and tau = 1 + sum_k prod_{i<=k} acc_i at ``answers.tau_draft_tokens`` (``answers.tau``: exact for a
greedy chain); the best by tau is kept, since acceptance can fall while the loss still falls.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from specsamp.experiments.jobs import pair as pair_lib
from specsamp.training import answers, checkpoint, regenerate, train

BEST = "best"
BEST_JSON = "best.json"


def measure_tau(
  trainer: train.Trainer, params: Any, held_out: Sequence[tuple[np.ndarray, np.ndarray]], K: int
) -> tuple[float, np.ndarray]:
  """tau and acc [K] of the model ``params`` on held-out greedy answer batches."""
  runs = []
  for tokens, weights in held_out:
    correct = trainer.greedy_correct(params, tokens)
    runs.append(answers.accepted_run(correct, weights[:, 1:] > 0, K))
  return answers.tau(np.concatenate([r.ravel() for r in runs]), K)


def check_answers(train_dir: str, held_dir: str, tokenizer: Any) -> dict[str, Any]:
  """The training manifest, once both shard directories are checked: made by the same target
  and this tokenizer, each of its split, with shards; the held-out answers greedy only."""
  manifests = {}
  for split, directory, command in (
    ("train", train_dir, "scripts/regenerate.py"),
    ("held_out", held_dir, "scripts/regenerate.py --split=held_out --settings=greedy"),
  ):
    manifest = regenerate.read_manifest(directory)
    if manifest is None or not manifest["shards"]:
      raise FileNotFoundError(
        f"No regenerated {split} answers in {directory}: run {command} first (tau is measured "
        "on held-out greedy answers)."
      )
    if manifest["plan"]["split"] != split:
      raise ValueError(f"{directory} holds the {manifest['plan']['split']} split, not {split}.")
    if manifest["tokenizer"] != tokenizer.fingerprint:
      raise ValueError(
        f"{directory} was tokenized by {manifest['tokenizer']}, not the pair's tokenizer "
        f"({tokenizer.fingerprint})."
      )
    manifests[split] = manifest
  if manifests["train"]["target"] != manifests["held_out"]["target"]:
    raise ValueError(
      f"The training and held-out answers come from different targets "
      f"({manifests['train']['target']} and {manifests['held_out']['target']})."
    )
  settings = {shard["setting"] for shard in manifests["held_out"]["shards"]}
  if settings != {"greedy"}:
    raise ValueError(
      f"{held_dir} holds {sorted(settings)} answers; tau needs greedy ones only "
      "(scripts/regenerate.py --split=held_out --settings=greedy)."
    )
  return manifests["train"]


def read_best(directory: str) -> dict[str, Any] | None:
  path = os.path.join(directory, BEST, BEST_JSON)
  if not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as f:
    return json.load(f)


def train_draft(
  config: ml_collections.ConfigDict,
  workdir: str | None = None,
  *,
  mesh: jax.sharding.Mesh | None = None,
  log: Callable[[str], None] = print,
  stop_after: int | None = None,
) -> dict[str, Any]:
  """Trains (or resumes) the draft of ``config.draft.model`` on the regenerated answers
  (module docstring); returns the best evaluation (best.json)."""
  workdir = os.path.abspath(workdir or pair_lib.default_workdir(config))
  section = config.answers
  train_dir = os.path.join(workdir, section.train_dir)
  held_dir = os.path.join(workdir, section.held_out_dir)
  train_cfg = train.TrainConfig.from_config(section.train)
  if train_cfg.distill_mode not in ("none", "token"):
    raise ValueError(
      f"answers.train.distill.mode must be 'none' or 'token' on regenerated answers, got "
      f"{train_cfg.distill_mode!r}."
    )
  K = section.tau_draft_tokens
  prepared = pair_lib.prepare(config, workdir, drafts=False, mesh=mesh, log=log)
  mesh = prepared.mesh
  tokenizer = prepared.tokenizer
  manifest = check_answers(train_dir, held_dir, tokenizer)
  shards = regenerate.read_shards(train_dir)
  model_cfg = pair_lib.model_config(config.draft, tokenizer)
  batches = answers.batches(shards, train_cfg.seq_len, train_cfg.batch_size, config.seed)
  # tau and the held-out loss over every held-out row (their file order is by prompt length).
  held = answers.batches(regenerate.read_shards(held_dir), train_cfg.seq_len, train_cfg.batch_size)
  evaluation = held.first(held.steps_per_epoch)
  if not (
    answers.accepted_run(np.zeros_like(held.weights[:, 1:]), held.weights[:, 1:], K) >= 0
  ).any():
    raise ValueError(f"No held-out answer has {K} tokens: tau at K={K} has nothing to measure.")
  weights = batches.weights
  log(
    f"draft (answers): {len(manifest['shards'])} shards, {int(weights.sum()):,} answer tokens "
    f"in {batches.sequences.size:,} ({len(batches.sequences):,} rows of "
    f"{train_cfg.seq_len + 1}); tau on {len(evaluation)} held-out batches"
  )
  directory = os.path.join(workdir, section.directory)
  meta = {
    "model": dataclasses.asdict(model_cfg),
    "tokenizer": tokenizer.fingerprint,
    "data": {
      "answers": section.train_dir,
      "plan": manifest["plan"],
      "target": manifest["target"],
      "prompts_sha256": manifest["prompts_sha256"],
    },
  }
  trainer = train.Trainer(model_cfg, train_cfg, mesh, teacher=prepared.target, seed=config.seed + 3)
  store = checkpoint.Checkpoints(directory, max_to_keep=train_cfg.keep_checkpoints, log=log)
  if store.latest_step() is None and os.path.isdir(os.path.join(directory, BEST)):
    shutil.rmtree(os.path.join(directory, BEST))  # A fresh run: an older run's best is no bar.
  best_store = checkpoint.Checkpoints(os.path.join(directory, BEST), max_to_keep=1, log=log)
  best = read_best(directory) or {"tau": -1.0}

  def on_eval(step: int, params: Any) -> str:
    tau, acc = measure_tau(trainer, params, evaluation, K)
    line = f"tau(K={K}) {tau:.3f}  acc " + " ".join(f"{a:.2f}" for a in acc)
    if tau > best["tau"]:
      best.update(
        step=step,
        tau=tau,
        acc=[float(a) for a in acc],
        tokens_seen=step * train_cfg.batch_size * train_cfg.seq_len,
      )
      best_store.save(step, {"params": params}, meta)
      best_store.wait()
      if jax.process_index() == 0:  # One writer on a multi-host slice; renamed into place.
        path = os.path.join(directory, BEST, BEST_JSON)
        with open(path + ".partial", "w", encoding="utf-8") as f:
          json.dump(best, f, indent=1)
        os.replace(path + ".partial", path)
      line += "  (best)"
    return line

  train.fit(
    trainer,
    batches,
    evaluation,
    store,
    meta,
    name="draft (answers)",
    log=log,
    stop_after=stop_after,
    on_eval=on_eval,
  )
  return best


# --- Shipping the best draft. -------------------------------------------------------------------

SHA256SUMS = "SHA256SUMS"
CARD = "CARD.md"


def _file_digests(folder: str) -> dict[str, str]:
  """sha256 of every file under ``folder`` (but SHA256SUMS), by path relative to it."""
  digests = {}
  for root, _, names in os.walk(folder):
    for name in sorted(names):
      path = os.path.join(root, name)
      relative = os.path.relpath(path, folder)
      if relative == SHA256SUMS:
        continue
      digest = hashlib.sha256()
      with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
          digest.update(chunk)
      digests[relative] = digest.hexdigest()
  return digests


def verify(folder: str) -> None:
  """Raises ``ValueError`` naming each file of a shipped drafter that is missing, added or not
  what SHA256SUMS says (a corrupted or partial copy)."""
  path = os.path.join(folder, SHA256SUMS)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{folder} has no {SHA256SUMS}: not a shipped drafter.")
  expected = {}
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      fields = line.split(None, 1)
      if len(fields) != 2 or len(fields[0]) != 64:
        raise ValueError(f"{path}:{number}: expected '<sha256>  <file>', got {line.strip()!r}.")
      expected[fields[1].strip().lstrip("*")] = fields[0].lower()  # '*': sha256sum -b.
  found = _file_digests(folder)
  problems = [f"{name}: missing" for name in sorted(set(expected) - set(found))]
  problems += [f"{name}: not in {SHA256SUMS}" for name in sorted(set(found) - set(expected))]
  problems += [
    f"{name}: sha256 {found[name][:12]}..., expected {expected[name][:12]}..."
    for name in sorted(set(found) & set(expected))
    if found[name] != expected[name]
  ]
  if problems:
    raise ValueError(f"The drafter in {folder} is corrupt: " + "; ".join(problems))


def ship(best_dir: str, folder: str, card: str, *, param_dtype: str = "bfloat16") -> dict[str, Any]:
  """Writes the best draft of ``best_dir`` (``draft_answers/best``) to ``folder``: its
  parameters in ``param_dtype`` as step 0 of an orbax checkpoint (loadable with
  ``--config.draft.checkpoint``), ``card`` as CARD.md, and SHA256SUMS over every file.
  Returns the checkpoint's metadata."""
  if os.path.exists(folder) and os.listdir(folder):
    raise FileExistsError(f"{folder} is not empty; ship into a new folder.")
  model, meta = checkpoint.load_model(best_dir, checkpoint.default_mesh())
  config = dataclasses.replace(model.config, param_dtype=param_dtype)
  params = jax.tree.map(lambda x: np.asarray(x).astype(config.param_dtype), train.params_of(model))
  shipped_meta = dict(meta, model=dataclasses.asdict(config))
  shipped_meta.pop("step", None)
  store = checkpoint.Checkpoints(os.path.join(folder, "checkpoint"), max_to_keep=1)
  store.save(0, {"params": params}, shipped_meta)
  store.wait()
  with open(os.path.join(folder, CARD), "w", encoding="utf-8") as f:
    f.write(card)
  digests = _file_digests(folder)
  with open(os.path.join(folder, SHA256SUMS), "w", encoding="utf-8") as f:
    f.writelines(f"{digest}  {name}\n" for name, digest in sorted(digests.items()))
  return shipped_meta
