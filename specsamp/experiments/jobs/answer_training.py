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
import os
import shutil
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from specsamp import files
from specsamp.experiments.jobs import drafter_specs
from specsamp.experiments.jobs import pair as pair_lib
from specsamp.models.feature_head import FeatureHeadConfig
from specsamp.sampling import lookup_feature_drafter
from specsamp.training import (
  answers,
  checkpoint,
  data,
  feature_train,
  regenerate,
  shipped,
  target_store,
  train,
)

BEST = "best"
BEST_JSON = "best.json"


Accepted = Callable[[Any, tuple[np.ndarray, ...]], np.ndarray]


@dataclasses.dataclass(frozen=True)
class Tau:
  """One evaluation's acceptance on the held-out answers: ``tau`` and ``acc`` the position
  mean (``answers.tau``, what the best is chosen by), ``loop`` the tokens per target call of
  the greedy loop walked over the same counts (``answers.loop_tau``: what decoding gets);
  ``with_lookup`` / ``loop_with_lookup``: the same of 'feature+lookup' with this head (None
  without lookup's counts)."""

  tau: float
  acc: np.ndarray
  loop: float
  with_lookup: float | None = None
  loop_with_lookup: float | None = None


def measure_tau(
  accepted: Accepted,
  params: Any,
  held_out: Sequence[tuple[np.ndarray, ...]],
  K: int,
  lookups: Sequence[tuple[np.ndarray, np.ndarray]] | None = None,
) -> Tau:
  """tau of the drafter ``params`` on held-out greedy answer batches ((tokens, weights), or
  with the target's stored outputs too), from ``accepted(params, batch)``: each position's
  accepted count in ``answers.accepted_run``'s layout (``_drafter_setup``); and, given prompt
  lookup's counts on the same batches (``answers.lookup_accepted``), that of drafter
  'feature+lookup' with this head (``answers.lookup_first``)."""
  runs = [accepted(params, batch) for batch in held_out]
  return tau_of(runs, [np.asarray(batch[1]) for batch in held_out], K, lookups)


def tau_of(
  runs: Sequence[np.ndarray],
  weights: Sequence[np.ndarray],
  K: int,
  lookups: Sequence[tuple[np.ndarray, np.ndarray]] | None = None,
) -> Tau:
  """``measure_tau``'s figures from each held-out batch's accepted counts (``runs``, in
  ``answers.accepted_run``'s layout) and answer weights."""
  tau, acc = answers.tau(runs, K)
  loop = answers.loop_tau(runs, weights, K)[0]
  if lookups is None:
    return Tau(tau, acc, loop)
  both = [answers.lookup_first(*lookup, run) for lookup, run in zip(lookups, runs)]
  return Tau(tau, acc, loop, answers.tau(both, K)[0], answers.loop_tau(both, weights, K)[0])


# Prompt lookup's n-grams in drafter 'feature+lookup': the longest, then down to the shortest.
LOOKUP_NGRAMS = (drafter_specs.LOOKUP_NGRAM, lookup_feature_drafter.MIN_NGRAM)


def lookup_counts(
  held_out: Sequence[tuple[np.ndarray, ...]], K: int
) -> list[tuple[np.ndarray, np.ndarray]]:
  """Prompt lookup's (accepted, matched) counts on each held-out batch, with the n-grams of
  drafter 'feature+lookup' (``answers.lookup_accepted``): ``measure_tau``'s ``lookups``."""
  return [answers.lookup_accepted(*batch[:2], K, *LOOKUP_NGRAMS) for batch in held_out]


_REGENERATE = {
  "train": "scripts/regenerate.py",
  "held_out": "scripts/regenerate.py --split=held_out --settings=greedy",
}


def _no_answers(split: str, directory: str) -> FileNotFoundError:
  return FileNotFoundError(
    f"No regenerated {split} answers in {directory}: run {_REGENERATE[split]} first (tau is "
    "measured on held-out greedy answers)."
  )


def check_answers_exist(config: ml_collections.ConfigDict, workdir: str) -> None:
  """Both splits' shards are in ``workdir`` or, for a config naming ``answers.shipped_dir``,
  shipped there: what ``scripts/train_drafter.py`` checks before it prepares the pair (which
  trains or imports the target on a first run); ``check_answers`` checks them in full after."""
  section = config.answers
  for split, field in (("train", "train_dir"), ("held_out", "held_out_dir")):
    places = [os.path.join(workdir, section[field])]
    if section.get("shipped_dir"):
      places.append(os.path.join(section.shipped_dir, split))
    if not any((regenerate.read_manifest(place) or {}).get("shards") for place in places):
      raise _no_answers(split, places[0])


def check_answers(
  train_dir: str, held_dir: str, tokenizer: Any, target: Any = None
) -> dict[str, dict[str, Any]]:
  """The manifests by split ('train', 'held_out'), once both shard directories are checked:
  made by the same target (``target``'s weights, where given and the manifests record them)
  and this tokenizer, each of its split, with shards; the held-out answers greedy only."""
  manifests = {}
  for split, directory in (("train", train_dir), ("held_out", held_dir)):
    manifest = regenerate.read_manifest(directory)
    if manifest is None or not manifest["shards"]:
      raise _no_answers(split, directory)
    if manifest["plan"]["split"] != split:
      raise ValueError(f"{directory} holds the {manifest['plan']['split']} split, not {split}.")
    # Tokenized alike (the fingerprint); the stop ids the answers ended at may differ.
    if regenerate.tokenization_of(manifest["tokenizer"]) != tokenizer.fingerprint:
      raise ValueError(
        f"{directory} was tokenized by {manifest['tokenizer']}, not the pair's tokenizer "
        f"({tokenizer.fingerprint})."
      )
    manifests[split] = manifest
  weights = {split: m.get("target_weights") for split, m in manifests.items()}
  if manifests["train"]["target"] != manifests["held_out"]["target"] or (
    None not in weights.values() and weights["train"] != weights["held_out"]
  ):
    raise ValueError(
      f"The training and held-out answers come from different targets "
      f"({manifests['train']['target']} {weights['train']} and "
      f"{manifests['held_out']['target']} {weights['held_out']})."
    )
  if target is not None:
    ours = target_store.parameters_fingerprint(target)
    for split, theirs in weights.items():
      if theirs is not None and theirs != ours:
        raise ValueError(
          f"The {split} answers in {train_dir if split == 'train' else held_dir} were made by "
          f"another target's weights (fingerprint {theirs}) than this pair's ({ours}): a "
          "drafter learns the target whose answers it reads. Regenerate them with this target "
          "(scripts/regenerate.py), or point the config at that target."
        )
  settings = {shard["setting"] for shard in manifests["held_out"]["shards"]}
  if settings != {"greedy"}:
    raise ValueError(
      f"{held_dir} holds {sorted(settings)} answers; tau needs greedy ones only "
      "(scripts/regenerate.py --split=held_out --settings=greedy)."
    )
  return manifests


def read_best(directory: str) -> dict[str, Any] | None:
  path = os.path.join(directory, BEST, BEST_JSON)
  if not os.path.exists(path):
    return None
  best = files.read_json(path)
  if not isinstance(best, dict):
    raise ValueError(f"{path} is not a best.json (a JSON object).")
  return best


# Each drafter trained on answers: its name in logs and cards, and the ``config.answers`` fields
# naming its run directory and its optimisation section.
_DRAFTERS = {
  "draft": ("draft", "directory", "train"),
  "feature": ("feature head", "head_directory", "head_train"),
  "parallel": ("parallel draft", "parallel_directory", "parallel_train"),
  "parallel_head": ("parallel feature head", "parallel_head_directory", "head_train"),
}
DRAFTERS = tuple(_DRAFTERS)
KINDS = {drafter: kind for drafter, (kind, _, _) in _DRAFTERS.items()}
HEADS = ("feature", "parallel_head")
"""The drafters that are feature heads: read with (and shipped with) their target."""


def drafter_sections(
  config: ml_collections.ConfigDict, drafter: str | None = None
) -> tuple[str, str, ml_collections.ConfigDict]:
  """(the drafter, its run directory in the workdir, its optimisation section), named by the
  ``config.answers`` fields of ``_DRAFTERS``; ``drafter`` defaults to
  ``config.answers.drafter``."""
  section = config.answers
  drafter = drafter or section.get("drafter", "draft")
  if drafter not in DRAFTERS:
    raise ValueError(f"answers.drafter must be one of {DRAFTERS}, got {drafter!r}.")
  _, directory, optimisation = _DRAFTERS[drafter]
  return drafter, section[directory], section[optimisation]


def check_optimisation(config: ml_collections.ConfigDict, drafter: str | None = None) -> Any:
  """The drafter's optimisation settings (``train.TrainConfig`` for a draft,
  ``feature_train.FeatureTrainConfig`` for a head), checked against each other and the rest of
  the config: what ``scripts/train_drafter.py`` checks before it prepares the pair, so a bad
  setting is refused before a first run trains or imports the target."""
  drafter, _, optimisation = drafter_sections(config, drafter)
  K = config.answers.tau_draft_tokens
  if drafter in ("draft", "parallel"):
    if config.answers.get("init_from"):  # Said, not ignored: it would start from the seed's.
      raise ValueError(
        f"--config.answers.init_from starts a feature head ('feature', 'parallel_head'); the "
        f"{drafter} draft starts from its own initialisation. Unset it, or train a head."
      )
    train_cfg = train.TrainConfig.from_config(optimisation)
    modes = ("none", "token") if drafter == "draft" else ("parallel",)
    field = _DRAFTERS[drafter][2]
    if train_cfg.distill_mode not in modes:
      raise ValueError(
        f"answers.{field}.distill.mode must be one of {modes} on regenerated answers, got "
        f"{train_cfg.distill_mode!r}."
      )
    if drafter == "parallel":
      mask_token = config.draft.train.distill.mask_token  # What the job drafts with.
      if train_cfg.distill_mask_token != mask_token:
        raise ValueError(
          f"answers.parallel_train.distill.mask_token={train_cfg.distill_mask_token} differs "
          f"from draft.train.distill.mask_token={mask_token}, the placeholder the job drafts "
          "with."
        )
      if train_cfg.distill_parallel_tokens < K:
        raise ValueError(
          f"answers.parallel_train.distill.parallel_tokens={train_cfg.distill_parallel_tokens} "
          f"trains fewer draft positions than tau's K={K} (answers.tau_draft_tokens)."
        )
    return train_cfg
  if FeatureHeadConfig.from_config(config.feature.head).parallel:
    raise ValueError(
      "--config.feature.head.parallel=True: train a parallel head with "
      "--config.answers.drafter=parallel_head (it sets it)."
    )
  train_cfg = feature_train.FeatureTrainConfig.from_config(optimisation)
  if train_cfg.ttt_steps < K:
    raise ValueError(
      f"answers.head_train.ttt_steps={train_cfg.ttt_steps} unrolls fewer steps than tau's "
      f"K={K} (answers.tau_draft_tokens)."
    )
  return train_cfg


def _drafter_setup(
  config: ml_collections.ConfigDict,
  drafter: str,
  prepared: pair_lib.Pair,
  answer_stream: np.ndarray,
  manifest: dict[str, Any],
) -> tuple[str, Any, dict[str, Any], Accepted]:
  """(name, trainer, checkpoint meta, accepted counts for ``measure_tau``) of the drafter
  trained on the answers."""
  section, tokenizer, target = config.answers, prepared.tokenizer, prepared.target
  K = section.tau_draft_tokens
  data_meta = {
    "answers": section.train_dir,
    # More passes add answers as more shards do, and a run resumes on them (as before the field).
    "plan": {k: v for k, v in manifest["plan"].items() if k != "passes"},
    "target": manifest["target"],
    "prompts_sha256": manifest["prompts_sha256"],
    # Each pass reads a packed row's sequences apart (``answers.packed_call``); a checkpoint
    # without this was trained with every row attending across its sequences (before
    # the fifteenth session of 2026-11-29), and is not resumed as this run's.
    "context": answers.CONTEXT,
  }
  train_cfg = check_optimisation(config, drafter)
  if drafter in ("draft", "parallel"):
    model_cfg = pair_lib.model_config(config.draft, tokenizer)
    meta = {"model": dataclasses.asdict(model_cfg), "tokenizer": tokenizer.fingerprint}
    trainer = train.Trainer(
      model_cfg, train_cfg, prepared.mesh, teacher=target, seed=config.seed + 3
    )

    # Teacher-forced argmax runs: a draft's after each prefix, a parallel draft's from the K
    # segments' queries.
    count = answers.accepted_parallel if drafter == "parallel" else answers.accepted_run

    def accepted(params, batch):
      weights = train.split_batch(batch)[1]
      return count(trainer.greedy_correct(params, batch), weights[:, 1:] > 0, K)

    if drafter == "parallel":
      meta["parallel"] = {  # The placeholder check_optimisation matched to the job's.
        "mask_token": train_cfg.distill_mask_token,
        "tokens": train_cfg.distill_parallel_tokens,
      }
    return f"{KINDS[drafter]} (answers)", trainer, dict(meta, data=data_meta), accepted
  # The feature head of config.feature.head, its reduced vocabulary the answers' most frequent
  # tokens (what it drafts), trained by its own KL to the target's distribution; as a parallel
  # head, each unrolled step after the first is fed the placeholder instead of the token before
  # (``FeatureHead.unrolled(parallel=True)``), as it drafts.
  head_cfg = dataclasses.replace(
    FeatureHeadConfig.from_config(config.feature.head), parallel=drafter == "parallel_head"
  )
  resolved = head_cfg.resolve(target.config)
  mapping = None
  meta = dict(
    feature_train.head_meta(head_cfg, target), tokenizer=tokenizer.fingerprint, data=data_meta
  )
  initial = None
  if section.get("init_from"):  # Goes on from a trained head, its draft vocabulary kept.
    # All of what it records, for the card; train_on_answers keeps only its parameters'
    # fingerprint in the checkpoints' meta.
    initial, mapping, meta["init_from"] = initial_head(
      section.init_from,
      head_cfg,
      target,
      dict(meta, tokenizer=tokenizer.fingerprint),
      seed=config.seed + 3,
    )
  elif resolved.draft_vocab_size:
    mapping = feature_train.frequent_tokens(
      answer_stream, target.vocab_size, resolved.draft_vocab_size
    )
  trainer = feature_train.FeatureTrainer(
    head_cfg,
    target,
    train_cfg,
    prepared.mesh,
    mapping,
    seed=config.seed + 3,
    initial_params=initial,
  )

  def accepted_unrolled(params, batch):  # Runs over the K unrolled steps, as a chain's.
    weights = train.split_batch(batch)[1]
    steps = trainer.greedy_correct(params, batch, K)
    return answers.chain_layout(answers.accepted_unrolled(steps, weights, K))

  return f"{KINDS[drafter]} (answers)", trainer, meta, accepted_unrolled


def initial_head(
  path: str,
  head_config: FeatureHeadConfig,
  target: Any,
  run_meta: dict[str, Any],
  seed: int = 0,
) -> tuple[dict, np.ndarray | None, dict[str, Any]]:
  """(float32 parameters, draft vocabulary map, what the card and checkpoints record) of the
  trained feature head at ``path`` (a shipped folder, verified first, or a checkpoint directory:
  its newest step, e.g. a run's ``.../best``), for a fresh run to start from
  (``answers.init_from``). It must be a head of ``head_config`` for ``target``: the same
  shape and kind (parallel or not), the same target model, tokenizer and, where both record
  them, the same target and target weights as ``run_meta``'s answers. The one difference
  allowed is a wider MLP in ``head_config``: the start's is grown to it
  (``feature_train.widen_mlp``, its new units drawn from ``seed``), computing what it did."""
  where = os.path.realpath(os.path.expanduser(path))
  directory = shipped.resolve(path)
  if not os.path.isdir(directory):
    raise FileNotFoundError(f"answers.init_from: {path}: no such directory.")

  def refused(why: str) -> ValueError:  # check_meta's advice (delete it) is not for a start.
    return ValueError(f"answers.init_from: {path} {why}".split(". Use another --workdir")[0])

  try:  # In float32: a training checkpoint's master weights, not rounded to the target's dtype.
    model, read = feature_train.load_head(directory, target, param_dtype="float32")
  except checkpoint.CheckpointError as e:
    raise refused(f"holds no head this run can start from: {e}") from None
  if model.head.config.parallel != head_config.parallel:
    kinds = ("a sequential head", "a parallel head")
    raise ValueError(
      f"answers.init_from: {path} holds {kinds[model.head.config.parallel]}; "
      f"--config.answers.drafter trains {kinds[head_config.parallel]}: give one of that kind."
    )
  want = feature_train.head_meta(head_config, target)
  theirs_config, ours_config = model.head.config, head_config.resolve(target.config)
  # A wider MLP than the start's grows it (``feature_train.widen_mlp``): the same function,
  # more room. Every other field must match.
  grown_config = theirs_config.replace(ffn_dim=ours_config.ffn_dim)
  widen = theirs_config.ffn_dim < ours_config.ffn_dim and grown_config == ours_config
  try:
    start_config = grown_config if widen else theirs_config
    checkpoint.check_meta(feature_train.head_meta(start_config, target), want, directory)
  except checkpoint.CheckpointError as e:
    raise refused(f"is not a head of config.feature.head: {e}") from None
  theirs, ours = (m.get("data", {}).get("target") for m in (read, run_meta))
  other_target = None not in (theirs, ours) and theirs != ours
  if read.get("tokenizer") != run_meta["tokenizer"] or other_target:
    raise ValueError(
      f"answers.init_from: {path} is a head for {theirs} (tokenizer {read.get('tokenizer')}); "
      f"these answers are {ours}'s (tokenizer {run_meta['tokenizer']})."
    )
  weights = read.get("teacher_weights")
  if weights is not None and weights != target_store.parameters_fingerprint(target):
    raise ValueError(
      f"answers.init_from: {path} was trained on another target's weights (fingerprint "
      f"{weights}): a head learns the features of the target it read."
    )
  params = train.params_of(model.head)
  if widen:
    params = feature_train.widen_mlp(params, ours_config.ffn_dim, seed)
  mapping = params.get("draft_to_target")
  folder = os.path.dirname(directory)
  is_shipped = shipped.is_shipped(folder)
  start = {
    "path": where,
    "parameters": target_store.parameters_fingerprint(params),
    "sha256sums": "",
    # A shipped head is saved as step 0 (``ship``): its card tells the steps it had.
    "step": None if is_shipped else read.get("step"),
  }
  if widen:  # What it grew from; "parameters" are the grown ones, which a resume matches.
    start["widened_from_ffn_dim"] = theirs_config.ffn_dim
  if is_shipped:
    with open(os.path.join(folder, shipped.SHA256SUMS), "rb") as f:
      start["sha256sums"] = hashlib.sha256(f.read()).hexdigest()
  return params, None if mapping is None else np.asarray(mapping), start


def train_on_answers(
  config: ml_collections.ConfigDict,
  workdir: str | None = None,
  *,
  drafter: str | None = None,
  mesh: jax.sharding.Mesh | None = None,
  log: Callable[[str], None] = print,
  stop_after: int | None = None,
  max_seconds: float | None = None,
  prepared: pair_lib.Pair | None = None,
) -> dict[str, Any]:
  """Trains (or resumes) ``drafter`` (default ``config.answers.drafter``): 'draft', the model
  of ``config.draft.model`` (optimised by ``answers.train``), or 'feature', the head of
  ``config.feature.head`` (``answers.head_train``), on the regenerated answers (module
  docstring); returns the best evaluation (best.json). ``prepared``: the pair's target and
  tokenizer when the caller has them (``pair.prepare(config, workdir, drafts=False)``).
  ``stop_after`` and ``max_seconds`` stop the training early as ``train.fit`` does."""
  drafter, directory, _ = drafter_sections(config, drafter)
  workdir = os.path.abspath(workdir or pair_lib.default_workdir(config))
  section = config.answers
  train_dir = os.path.join(workdir, section.train_dir)
  held_dir = os.path.join(workdir, section.held_out_dir)
  K = section.tau_draft_tokens
  if prepared is None:
    prepared = pair_lib.prepare(config, workdir, drafts=False, mesh=mesh, log=log)
  if section.get("shipped_dir"):  # The answers shipped in the repository, where these lack them.
    for split, split_dir in (("train", train_dir), ("held_out", held_dir)):
      regenerate.seed(os.path.join(section.shipped_dir, split), split_dir, log)
  manifests = check_answers(train_dir, held_dir, prepared.tokenizer, prepared.target)
  manifest = manifests["train"]
  shards = regenerate.read_shards(train_dir)
  stream, answer = answers.stream(shards)
  if section.get("init_from"):  # A fresh run empties its directory's best: not the start's.
    source, run = (
      os.path.realpath(os.path.expanduser(p))
      for p in (section.init_from, os.path.join(workdir, directory))
    )
    if source == run or source.startswith(run + os.sep):
      raise ValueError(
        f"answers.init_from: {section.init_from} lies inside this run's own directory {run}: "
        "copy the head elsewhere, or set another answers.head_directory."
      )
  name, trainer, meta, accepted = _drafter_setup(
    config, drafter, prepared, stream[answer > 0], manifest
  )
  start = meta.pop("init_from", None)
  if start is not None:  # What the start was (its parameters), not where it lay: a resume
    meta["init_from"] = {"parameters": start["parameters"]}  # from another path is this run's.
  train_cfg = trainer.config
  batches = answers.batches(shards, train_cfg.seq_len, train_cfg.batch_size, config.seed)
  held_shards, trained = answers.without_trained_prompts(regenerate.read_shards(held_dir), shards)
  if trained:
    log(f"{name}: {trained} held-out answers left out of tau: their prompt is trained on")
  try:
    held = answers.batches(held_shards, train_cfg.seq_len, train_cfg.batch_size)
  except ValueError as e:  # Too few held-out answers for one batch: say whose they are.
    raise ValueError(f"The held-out answers in {held_dir}: {e}") from None
  if not (
    answers.accepted_run(np.zeros_like(held.weights[:, 1:]), held.weights[:, 1:], K) >= 0
  ).any():
    raise ValueError(f"No held-out answer has {K} tokens: tau at K={K} has nothing to measure.")
  if drafter in HEADS and section.get("target_outputs_dir"):
    batches, held = (
      with_stored_outputs(
        prepared.target, trainer, rows, workdir, section, split, manifest["target"], log
      )
      for split, rows in (("train", batches), ("held_out", held))
    )
  # tau and the held-out loss over ``eval_batches`` batches of held-out rows spread evenly over
  # the file (it is ordered by prompt length); 0: every row.
  evaluation = held.spread(train_cfg.eval_batches or held.steps_per_epoch)
  weights = batches.weights
  log(
    f"{name}: {len(manifest['shards'])} shards, {int(weights.sum()):,} answer tokens "
    f"in {batches.sequences.size:,} ({len(batches.sequences):,} rows of "
    f"{train_cfg.seq_len + 1}); tau on {len(evaluation)} held-out batches"
  )
  for split, what in (("train", "the training answers"), ("held_out", "the held-out answers")):
    warning = regenerate.repetition_warning(manifests[split]["shards"], what)
    if warning:
      log(f"{name}: {warning}")
  lookups = None
  if drafter == "feature":  # What copying gets on the same answers, alone and with the head.
    lookups = lookup_counts(evaluation, K)
    alone, acc = answers.tau([run for run, _ in lookups], K)
    ngrams = LOOKUP_NGRAMS
    log(
      f"{name}: prompt lookup alone (no training; {ngrams[0]}- to {ngrams[1]}-grams) on the same "
      f"answers: tau(K={K}) {alone:.3f}  acc " + " ".join(f"{a:.2f}" for a in acc)
    )
  directory = os.path.join(workdir, directory)
  store = checkpoint.Checkpoints(
    directory,
    max_to_keep=train_cfg.keep_checkpoints,
    resume=config.get("resume_from", "latest"),  # Its own error advises latest_intact.
    log=log,
  )
  if store.latest_step() is None and os.path.isdir(os.path.join(directory, BEST)):
    shutil.rmtree(os.path.join(directory, BEST))  # A fresh run: an older run's best is no bar.
  best_store = checkpoint.Checkpoints(os.path.join(directory, BEST), max_to_keep=1, log=log)
  best = read_best(directory) or {"tau": -1.0}
  # What tau is measured on: a best measured otherwise (another K, other held-out rows or
  # batches) is no bar for this run's evaluations, nor a tau to ship under this run's K.
  measured = {
    "K": K,
    "context": answers.CONTEXT,
    "rows_sha256": hashlib.sha256(
      b"".join(np.ascontiguousarray(part).tobytes() for batch in evaluation for part in batch[:2])
    ).hexdigest(),
  }
  if best.get("measured", measured) != measured:
    raise ValueError(
      f"{directory}'s best was measured at K={best['measured']['K']} on other held-out rows, "
      f"K or context than this run's (K={K}, answers.tau_draft_tokens, eval_batches, the "
      "held-out answers; a best from before 2026-11-29's fix read a row's sequences together): "
      "its tau does not compare. Use another head or draft directory, or the settings it was "
      "measured with."
    )
  best["measured"] = measured
  # A fresh run from a trained head measures where it starts: the bar its steps must pass to be
  # kept as the best (on these held-out rows, which may not be the ones its card measured on).
  start_from = trainer.initial_params if isinstance(trainer, feature_train.FeatureTrainer) else None
  # What the card reports (``card``), as this run saw it: a card written later, by
  # ``--ship_only`` after more answers arrived or on another machine, still tells what the
  # best evaluation was trained and measured on.
  held_answers = sum(len(shard[2]) for shard in held_shards)
  facts = {
    "data": data_summary(manifest),
    "held_out": {
      "answers": held_answers,
      "left_out": trained,
      "rows": sum(len(batch[0]) for batch in evaluation),
      "row_tokens": train_cfg.seq_len + 1,
      "answer_tokens": int(sum(np.asarray(batch[1])[:, 1:].sum() for batch in evaluation)),
    },
    "hardware": hardware_summary(),
  }
  if start is not None:  # The trained head this run started from, for the card.
    facts["init_from"] = start
  # Training time over every run (a resumed run adds to it), written at each evaluation and
  # when a run ends or is stopped (Ctrl-C included), once the run has a best to write it beside.
  clock = {"start": time.perf_counter(), "before": float(best.get("seconds_total", 0.0))}
  curve = list(best.get("curve", []))

  def elapsed() -> float:
    return clock["before"] + time.perf_counter() - clock["start"]

  def write_best() -> None:
    if jax.process_index() == 0 and "step" in best:  # One writer; renamed into place.
      files.write_json(os.path.join(directory, BEST, BEST_JSON), best)

  def on_eval(step: int, params: Any) -> str:
    measured_tau = measure_tau(accepted, params, evaluation, K, lookups)
    tau, acc, with_lookup = measured_tau.tau, measured_tau.acc, measured_tau.with_lookup
    seconds = elapsed()
    tokens_seen = step * train_cfg.batch_size * train_cfg.seq_len
    point = {"step": step, "tokens_seen": tokens_seen, "tau": tau, "seconds": seconds}
    point["tau_loop"] = measured_tau.loop
    if with_lookup is not None:
      point["tau_with_lookup"] = with_lookup
      point["tau_loop_with_lookup"] = measured_tau.loop_with_lookup
    curve.append(point)
    best.update(curve=curve, seconds_total=seconds)
    line = f"tau(K={K}) {tau:.3f}  acc " + " ".join(f"{a:.2f}" for a in acc)
    line += f"  in the loop {measured_tau.loop:.3f}"
    if with_lookup is not None:
      line += f"  feature+lookup {with_lookup:.3f} (loop {measured_tau.loop_with_lookup:.3f})"
    if tau > best["tau"]:
      best.update(
        step=step,
        tau=tau,
        tau_loop=measured_tau.loop,
        acc=[float(a) for a in acc],
        tokens_seen=tokens_seen,
        seconds=seconds,
        **facts,
      )
      if with_lookup is not None:
        best["tau_with_lookup"] = with_lookup
        best["tau_loop_with_lookup"] = measured_tau.loop_with_lookup
      # A resumed run may evaluate a step kept before it stopped (stopped between keeping it
      # and writing best.json): the same parameters (resumes are exact), kept already.
      if step not in best_store.all_steps():
        best_store.save(step, {"params": params}, meta)
        best_store.wait()
      line += "  (best)"
    write_best()
    return line

  if start_from is not None and store.latest_step() is None and "step" not in best:
    log(f"{name}: starting from the head in {section.init_from}")
    log(f"{name} eval  step     0  {on_eval(0, start_from)}")
  try:
    train.fit(
      trainer,
      batches,
      evaluation,
      store,
      meta,
      name=name,
      log=log,
      stop_after=stop_after,
      max_seconds=max_seconds,
      on_eval=on_eval,
    )
  finally:
    best["seconds_total"] = elapsed()
    write_best()
  return best


def with_stored_outputs(
  target: Any,
  trainer: feature_train.FeatureTrainer,
  rows: data.Batches,
  workdir: str,
  section: ml_collections.ConfigDict,
  split: str,
  target_id: str,
  log: Callable[[str], None] = print,
) -> data.Batches:
  """``rows`` (a split's batches) with the target's outputs on each row, built once in
  ``WORKDIR/answers.target_outputs_dir/split`` (``target_store``): a head's steps and
  evaluations then read them instead of running the target."""
  if jax.process_count() > 1:
    raise ValueError(
      "answers.target_outputs_dir stores the target's outputs on one host's disk; on "
      f"{jax.process_count()} processes set it to '' (each step then runs the target)."
    )
  outputs = target_store.build(
    target,
    rows.sequences,
    trainer.head_config.feature_layers,
    os.path.join(workdir, section.target_outputs_dir, split),
    target_id=target_id,
    weights=rows.weights,
    log=log,
  )
  return dataclasses.replace(rows, stored=outputs)


# --- Shipping the best drafter. ----------------------------------------------------------------


def data_summary(manifest: dict[str, Any]) -> dict[str, Any]:
  """The training answers of a manifest, as a card reports them."""
  shards = manifest["shards"]
  return {
    "target": manifest["target"],
    "tokenizer": manifest["tokenizer"],
    "prompts_sha256": manifest["prompts_sha256"],
    "shards": len(shards),
    "prompts": sum(shard["prompts"] for shard in shards),
    "answer_tokens": sum(shard["answer_tokens"] for shard in shards),
    "settings": sorted({shard["setting"] for shard in shards}),
    "regeneration_seconds": sum(shard["seconds"] for shard in shards),
  }


def hardware_summary() -> str:
  """This process's devices and CPU cores, as a card reports them."""
  devices = jax.devices()
  return (
    f"{len(devices)} x {devices[0].device_kind} ({devices[0].platform}), {os.cpu_count()} CPU cores"
  )


def card(
  config: ml_collections.ConfigDict, workdir: str, best: dict[str, Any], drafter: str
) -> str:
  """A shipped drafter's CARD.md: what it drafts for, the data, the training, the hardware
  and the held-out tau. The data, the held-out sample and the hardware are those the training
  recorded in best.json when its best evaluation was made; a best.json from before these were
  recorded falls back to the workdir's manifests and this machine, and the card says so."""
  section = config.answers
  _, _, train_section = drafter_sections(config, drafter)
  data = best.get("data")
  held_out = best.get("held_out")
  hardware = best.get("hardware")
  notes = []
  if data is None:
    data = data_summary(regenerate.read_manifest(os.path.join(workdir, section.train_dir)))
    notes.append("the data are the workdir's answers when the card was written")
  if hardware is None:
    hardware = hardware_summary()
    notes.append("the hardware is the machine that wrote the card")
  if held_out is None:
    held = regenerate.read_manifest(os.path.join(workdir, section.held_out_dir))
    held_sample = f"rows of the {sum(s['prompts'] for s in held['shards'])} held-out greedy answers"
    notes.append("how many held-out rows tau saw was not recorded")
  else:
    held_sample = (
      f"{held_out['rows']} rows of {held_out['row_tokens']} tokens ({held_out['answer_tokens']:,} "
      f"answer tokens) spread over {held_out['answers']} held-out greedy answers"
    )
    if held_out["left_out"]:
      held_sample += (
        f" ({held_out['left_out']} more left out: their prompt is also a training prompt)"
      )
  acc = ", ".join(f"{a:.3f}" for a in best["acc"])
  with_lookup = ""
  if "tau_with_lookup" in best:
    with_lookup = (
      f" With prompt lookup where the context repeats (drafter 'feature+lookup'): "
      f"**{best['tau_with_lookup']:.3f}**"
      + (
        f" ({best['tau_loop_with_lookup']:.3f} in the loop)."
        if "tau_loop_with_lookup" in best
        else "."
      )
    )
  in_the_loop = (  # Cards of a best.json from before 2026-11-30 lack it.
    f" The greedy loop over the same answers (drafting only after the positions where its "
    f"previous iteration stopped): **{best['tau_loop']:.3f}** tokens per target call."
    if "tau_loop" in best
    else ""
  )
  curve = "\n".join(
    f"| {point['step']} | {point['tokens_seen']:,} | {point['tau']:.3f} |"
    for point in best.get("curve", [])
  )
  kind = KINDS[drafter]
  last_step = max([point["step"] for point in best.get("curve", [])] or [best["step"]])
  caveat = (
    f"\n- **Written from a best.json that lacked them**: {'; '.join(notes)}." if notes else ""
  )
  start = best.get("init_from")
  started = (
    f"\n- **Started from** the trained head in `{start['path']}` ("
    + (f"step {start['step']} of its run; " if start.get("step") is not None else "")
    + f"parameters {start['parameters']}"
    + (f"; its SHA256SUMS hashes to `{start['sha256sums'][:16]}...`" if start["sha256sums"] else "")
    + "; its own card tells its data and training)"
    + (
      f", its MLP grown from {start['widened_from_ffn_dim']} hidden units (the new ones' "
      "output rows zero, so it started as that head)"
      if start.get("widened_from_ffn_dim")
      else ""
    )
    + ", not from random parameters: the steps and "
    "tokens here are this run's, and step 0 below is that head measured on the same rows."
    if start
    else ""
  )
  return f"""# A {kind} trained on the target's own answers

- **Target**: `{data["target"]}` (tokenizer {data["tokenizer"]}).
- **Data**: {data["prompts"]:,} answers by the target to prompts of
  `specsamp.training.instructions` (`scripts/regenerate.py`, settings
  {", ".join(data["settings"])}; {data["shards"]} shards,
  {data["answer_tokens"]:,} answer tokens, {data["regeneration_seconds"] / 3600:.2f} h of
  regeneration), prompts sha256 `{data["prompts_sha256"][:16]}...`.
- **Training**: `scripts/train_drafter.py --config.answers.drafter={drafter}`; best at step
  {best["step"]} of {train_section.steps} planned, last evaluated at step {last_step} (batch
  {train_section.batch_size} x {train_section.seq_len} tokens, {best["tokens_seen"]:,} tokens
  seen, the loss on answer tokens only), {best.get("seconds", 0) / 60:.1f} min of training to
  it, {best.get("seconds_total", 0) / 60:.1f} min in all.{started}
- **Hardware**: {hardware}.
- **tau(K={section.tau_draft_tokens})** on {held_sample}:
  **{best["tau"]:.3f}** tokens per target call averaged over answer positions; acc_1..K
  {acc}.{in_the_loop}{with_lookup}
- **Stored**: bfloat16 parameters, an orbax checkpoint; SHA256SUMS covers every file and is
  checked before loading.{caveat}

| step | tokens seen | tau |
|---|---|---|
{curve}
"""


def check_ship_folder(folder: str) -> None:
  """A drafter ships into a new or empty folder (checked by scripts/train_drafter.py before it
  trains, and again by ``ship``)."""
  if os.path.exists(folder) and os.listdir(folder):
    raise FileExistsError(f"{folder} is not empty; ship into a new folder.")


def ship(
  best_dir: str,
  folder: str,
  card: str,
  *,
  target: Any = None,
  param_dtype: str = "bfloat16",
) -> dict[str, Any]:
  """Writes the best drafter of ``best_dir`` (``draft_answers/best`` or
  ``feature_head_answers/best``) to ``folder``: its float parameters in ``param_dtype`` as step 0
  of an orbax checkpoint, ``card`` as CARD.md, and SHA256SUMS over every file
  (``specsamp.training.shipped``: ``--config.draft.checkpoint=FOLDER`` or
  ``--config.feature.checkpoint=FOLDER`` verifies and loads it). A feature head is read with
  its ``target``. Returns the checkpoint's metadata."""
  check_ship_folder(folder)
  meta = checkpoint.Checkpoints(best_dir).read_meta()
  if "head" in meta:
    if target is None:
      raise ValueError(f"{best_dir} holds a feature head: ship it with its target.")
    head, meta = feature_train.load_head(best_dir, target)
    params = train.params_of(head.head)
    shipped_meta = dict(meta)
  else:
    model, meta = checkpoint.load_model(best_dir, checkpoint.default_mesh())
    config = dataclasses.replace(model.config, param_dtype=param_dtype)
    params = train.params_of(model)
    shipped_meta = dict(meta, model=dataclasses.asdict(config))

  def stored(x):  # Floats in param_dtype; the head's integer vocabulary map as it is.
    x = np.asarray(x)
    return x.astype(param_dtype) if np.issubdtype(x.dtype, np.floating) else x

  params = jax.tree.map(stored, params)
  shipped_meta.pop("step", None)
  store = checkpoint.Checkpoints(os.path.join(folder, shipped.CHECKPOINT), max_to_keep=1)
  store.save(0, {"params": params}, shipped_meta)
  store.wait()
  with open(os.path.join(folder, shipped.CARD), "w", encoding="utf-8") as f:
    f.write(card)
  shipped.write_sums(folder)
  return shipped_meta
