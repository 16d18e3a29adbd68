"""Orbax checkpoints: periodic saves that keep the last N, exact resume, restore onto any mesh.

A checkpoint step holds named pytree items (e.g. ``params``, ``opt_state``)
and a JSON ``meta`` item (the model config, the tokenizer fingerprint, the
step). Restoring takes abstract arrays (``jax.ShapeDtypeStruct`` with a
sharding), so each device reads only its own shard, on whatever mesh the
reader uses. Errors say what is wrong with the directory; nothing is ever
deleted except by orbax's keep-the-last-N policy on save.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

import jax
import orbax.checkpoint as ocp

from specsamp import sharding
from specsamp.models import transformer
from specsamp.models.config import EXECUTION_FIELDS, NOT_IDENTITY_FIELDS, TransformerConfig


class CheckpointError(ValueError):
  """A checkpoint that exists but cannot be used (corrupt, incomplete or mismatched)."""


def default_mesh() -> jax.sharding.Mesh:
  """All devices on the data axis (parameters replicated): where a model loads by default."""
  return sharding.make_mesh({"data": -1})


RESUME = ("latest", "latest_intact")
"""Which step a read without an explicit step takes: 'latest' (the newest; a corrupt one is an
error), or 'latest_intact' (the newest that reads: each newer corrupt step is moved aside to
``<directory>.corrupt/<step>``, never deleted)."""


class _AbandonedReadNoise(logging.Filter):
  def filter(self, record: logging.LogRecord) -> bool:
    return "exception was never retrieved" not in record.getMessage()


def _is_abandoned_read_noise(error: BaseException | None) -> bool:
  text = str(error)
  return (isinstance(error, RuntimeError) and "Event loop is closed" in text) or (
    "Encountered error while reading array index" in text
  )


def _quiet_abandoned_reads() -> None:
  """After a failed restore, orbax's other pending reads fail later, in background threads and
  in coroutines collected at exit, printing "exception was never retrieved", "Event loop is
  closed" and "Encountered error while reading array index" tracebacks. The failure is already
  reported as one ``CheckpointError``; these echoes of it are dropped, and only these."""
  asyncio_logger = logging.getLogger("asyncio")
  if not any(isinstance(f, _AbandonedReadNoise) for f in asyncio_logger.filters):
    asyncio_logger.addFilter(_AbandonedReadNoise())
  if getattr(sys.excepthook, "specsamp_quiet", False):
    return
  previous_except, previous_thread, previous_unraisable = (
    sys.excepthook,
    threading.excepthook,
    sys.unraisablehook,
  )

  def except_hook(kind, error, traceback):
    if not _is_abandoned_read_noise(error):
      previous_except(kind, error, traceback)

  def thread_hook(args):
    if not _is_abandoned_read_noise(args.exc_value):
      previous_thread(args)

  def unraisable_hook(unraisable):
    if not _is_abandoned_read_noise(unraisable.exc_value):
      previous_unraisable(unraisable)

  except_hook.specsamp_quiet = True
  sys.excepthook, threading.excepthook, sys.unraisablehook = (
    except_hook,
    thread_hook,
    unraisable_hook,
  )


def _print_to_stderr(line: str) -> None:
  print(line, file=sys.stderr, flush=True)


class Checkpoints:
  """A directory of numbered checkpoint steps, managed by orbax's CheckpointManager.

  Args:
    directory: where the steps are.
    max_to_keep: the newest steps kept on save (orbax deletes older ones).
    resume: one of ``RESUME``: what reading the latest step does when it is corrupt.
    log: where a step moved aside is reported.
  """

  def __init__(
    self,
    directory: str,
    *,
    max_to_keep: int | None = 3,
    resume: str = "latest",
    log: Callable[[str], None] = _print_to_stderr,
  ):
    if resume not in RESUME:
      raise ValueError(f"resume must be one of {RESUME}, got {resume!r}.")
    if max_to_keep is not None and max_to_keep < 1:  # Orbax would keep none: every step deleted.
      raise ValueError(f"max_to_keep must be >= 1 or None (all), got {max_to_keep}.")
    self.directory = os.path.abspath(os.path.expanduser(directory))
    self._max_to_keep = max_to_keep
    self._manager: ocp.CheckpointManager | None = None
    self.resume = resume
    self._log = log

  def _open(self, create: bool) -> ocp.CheckpointManager:
    if self._manager is None:
      if not create and not os.path.isdir(self.directory):
        raise FileNotFoundError(f"No checkpoint directory at {self.directory}.")
      options = ocp.CheckpointManagerOptions(max_to_keep=self._max_to_keep, create=create)
      self._manager = ocp.CheckpointManager(self.directory, options=options)
    return self._manager

  def latest_step(self) -> int | None:
    """The newest finished step, or None (also when the directory does not exist)."""
    if not os.path.isdir(self.directory):
      return None
    return self._open(create=False).latest_step()

  def all_steps(self) -> list[int]:
    if not os.path.isdir(self.directory):
      return []
    return list(self._open(create=False).all_steps())

  def save(self, step: int, items: Mapping[str, Any], meta: Mapping[str, Any]) -> None:
    """Saves ``items`` and ``meta`` as ``step`` (asynchronously; ``wait`` to block)."""
    args = {name: ocp.args.StandardSave(tree) for name, tree in items.items()}
    args["meta"] = ocp.args.JsonSave(dict(meta, step=int(step)))
    self._open(create=True).save(int(step), args=ocp.args.Composite(**args), force=True)

  def wait(self) -> None:
    if self._manager is not None:
      self._manager.wait_until_finished()

  def _step_to_read(self, step: int | None) -> int:
    steps = self.all_steps()
    if not os.path.isdir(self.directory):
      raise FileNotFoundError(f"No checkpoint directory at {self.directory}.")
    if not steps:
      entries = sorted(os.listdir(self.directory))
      hint = "Train first, or point at the right directory."
      if "config.json" in entries or any(e.endswith((".safetensors", ".gguf")) for e in entries):
        hint = (  # A model in another format: say how to bring it in.
          "It holds a model in another format: import it first (python scripts/import_hf.py "
          f"--hf_dir={self.directory} --output=NEW_DIR; a GGUF file: scripts/import_gguf.py, "
          "or the pair config's target.gguf)."
        )
      raise FileNotFoundError(
        f"{self.directory} holds no finished checkpoint (entries: {entries[:8]}). {hint}"
      )
    if step is None:
      return max(steps)
    if step not in steps:
      raise FileNotFoundError(f"No step {step} in {self.directory}; it holds steps {steps}.")
    return step

  def read_meta(self, step: int | None = None) -> dict[str, Any]:
    """The JSON metadata of ``step`` (default: the latest, as ``resume`` says)."""
    return self._newest_intact(self._read_meta, step)

  def _read_meta(self, step: int) -> dict[str, Any]:
    try:
      restored = self._open(create=False).restore(
        step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())
      )
    except Exception as error:  # orbax raises many types for unreadable files.
      raise self._corrupt(step, "meta", error) from error
    return dict(restored["meta"])

  def restore(
    self, abstract: Mapping[str, Any], step: int | None = None
  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Restores the items named in ``abstract`` (trees of ShapeDtypeStruct with shardings);
    items not named (e.g. the optimizer state, when sampling) stay on disk.

    Returns:
      (items, meta) of ``step`` (default: the latest, as ``resume`` says).
    """
    return self._newest_intact(lambda s: self._restore(abstract, s), step)

  def _restore(self, abstract: Mapping[str, Any], step: int) -> tuple[dict, dict]:
    meta = self._read_meta(step)
    args = {name: ocp.args.StandardRestore(tree) for name, tree in abstract.items()}
    try:
      restored = self._open(create=False).restore(step, args=ocp.args.Composite(**args))
    except Exception as error:
      raise self._corrupt(step, "/".join(abstract), error) from error
    items = {name: restored[name] for name in abstract}
    for name, tree in abstract.items():
      want, got = jax.tree.structure(tree), jax.tree.structure(items[name])
      if want != got:
        raise CheckpointError(
          f"Step {step} in {self.directory}: '{name}' has structure {got}, expected {want}."
        )
    return items, meta

  def _newest_intact(self, read: Callable[[int], Any], step: int | None) -> Any:
    """``read(step)``; without a step, of the latest, or (resume='latest_intact') of the newest
    step that reads, moving each corrupt newer one aside."""
    if step is not None or self.resume == "latest":
      return read(self._step_to_read(step))
    latest = self._step_to_read(None)
    try:
      return read(latest)
    except CheckpointError as error:
      first = error
    # The newest older step that reads; the steps above it are moved aside only then. When
    # none reads, no step is corrupt on its own (a run or a code change that reads them all
    # differently, e.g. another optimizer): the error stands and nothing is moved.
    failed = {latest: first}
    for older in sorted((s for s in self.all_steps() if s < latest), reverse=True):
      try:
        result = read(older)
      except CheckpointError as error:
        failed[older] = error
        continue
      for newer in sorted(failed, reverse=True):
        self._move_aside(newer, failed[newer])
      return result
    raise first

  def _move_aside(self, step: int, error: Exception) -> None:
    if jax.process_count() > 1:
      raise CheckpointError(
        f"{error} On a multi-host run, move {self.directory}/{step} aside by hand (every host "
        "must agree on the step to resume from)."
      ) from error
    self.wait()
    aside = f"{self.directory}.corrupt"
    destination = os.path.join(aside, str(step))
    suffix = 1
    while os.path.exists(destination):
      destination = os.path.join(aside, f"{step}.{suffix}")
      suffix += 1
    os.makedirs(aside, exist_ok=True)
    shutil.move(os.path.join(self.directory, str(step)), destination)
    self._manager = None  # Re-reads the steps present.
    self._log(
      f"checkpoint step {step} in {self.directory} is corrupt; moved it to {destination} "
      f"(resume=latest_intact) and reading step {self.latest_step()} instead."
    )

  def unrolled_blocks(self, step: int) -> bool:
    """Whether ``step`` holds the blocks' parameters one layer at a time ('blocks/0/...', the
    layout before the blocks were stacked for ``lax.scan``)."""
    try:
      path = os.path.join(self.directory, str(step), "params")
      tree = ocp.StandardCheckpointer().metadata(path).item_metadata.tree
    except Exception:  # No params item, or metadata orbax cannot read: not this layout.
      return False
    blocks = tree.get("blocks") if isinstance(tree, Mapping) else None
    return isinstance(blocks, Mapping) and bool(blocks) and all(str(k).isdigit() for k in blocks)

  def restore_unrolled(self, stacked: Any, step: int) -> Any:
    """Parameters saved one layer at a time ('blocks/<i>/...'), restored and stacked into the
    layout of ``stacked`` (abstract arrays of the stacked model, with their shardings): older
    checkpoints load unchanged on disk."""

    def one_layer(leaf):
      spec = leaf.sharding.spec
      return jax.ShapeDtypeStruct(
        leaf.shape[1:],
        leaf.dtype,
        sharding=jax.sharding.NamedSharding(
          leaf.sharding.mesh, jax.sharding.PartitionSpec(*spec[1:])
        ),
      )

    num_layers = jax.tree.leaves(stacked["blocks"])[0].shape[0]
    per_layer = jax.tree.map(one_layer, stacked["blocks"])
    legacy = dict(stacked, blocks={str(i): per_layer for i in range(num_layers)})
    items, _ = self.restore({"params": legacy}, step=step)
    params = items["params"]
    layers = [params["blocks"][str(i)] for i in range(num_layers)]
    shardings = jax.tree.map(lambda leaf: leaf.sharding, stacked["blocks"])
    blocks = jax.jit(
      lambda layers: jax.tree.map(lambda *a: jax.numpy.stack(a), *layers), out_shardings=shardings
    )(layers)
    return dict(params, blocks=blocks)

  def _corrupt(self, step: int, what: str, error: Exception) -> CheckpointError:
    _quiet_abandoned_reads()
    # TensorStore appends a repr of its spec ("See full TensorStore details: <bound method...");
    # the first sentence says what failed.
    message = str(error).split("See full TensorStore details")[0].strip()
    message = " ".join(message.split())[:240]
    older = [s for s in self.all_steps() if s < step]
    remedy = (
      f" resume=latest_intact (--config.resume_from=latest_intact, or --resume=latest_intact) "
      f"reads step {max(older)} instead, moving step {step} aside."
      if older
      else ""
    )
    return CheckpointError(
      f"Could not read '{what}' of checkpoint step {step} in {self.directory}: "
      f"{type(error).__name__}: {message} The step is corrupt, incomplete, or was written for a "
      f"different model; steps present: {self.all_steps()}, nothing was deleted.{remedy}"
    )


MODEL_KEYS = ("model", "target_model")  # Metadata keys that hold a TransformerConfig.
RECORDED_SINCE = ("teacher_weights", "train_dtype")
"""Metadata keys added after checkpoints were written without them: compared only where the
saved metadata records them (a workdir from before stays usable)."""


def check_meta(meta: Mapping[str, Any], expected: Mapping[str, Any], directory: str) -> None:
  """Refuses a checkpoint written for another model, tokenizer or training run.

  A saved model config (``model``, or the ``target_model`` a feature head reads) is read with
  today's defaults for fields added since it was written, so a checkpoint stays usable when
  TransformerConfig grows a field; how the model runs (``EXECUTION_FIELDS``: activation dtype,
  tensor-parallel mode) may differ.
  """
  for key, want in expected.items():
    if key in RECORDED_SINCE and key not in meta:
      continue
    saved = meta.get(key)
    if key in MODEL_KEYS and isinstance(saved, Mapping) and isinstance(want, Mapping):
      want = dataclasses.asdict(TransformerConfig.from_config(want))
      saved = dataclasses.asdict(TransformerConfig.from_config(saved))
      saved, want = (
        {k: v for k, v in config.items() if k not in NOT_IDENTITY_FIELDS}
        for config in (saved, want)
      )
    if saved != want and key == "teacher_weights":
      raise CheckpointError(
        f"The checkpoint in {directory} was trained from another target's weights (fingerprint "
        f"{saved}; this pair's target: {want}), and learned that target. Delete this directory "
        "to train it again for this target, or use another --workdir."
      )
    if saved != want:
      raise CheckpointError(
        f"The checkpoint in {directory} was written with a different {key}: "
        f"{_differences(saved, want)}. Use another --workdir, or delete this directory to "
        "retrain."
      )


def _differences(saved: Any, want: Any) -> str:
  """Only the fields that differ ("name: saved X, requested Y"), or both values when they are
  not both mappings."""
  if not (isinstance(saved, Mapping) and isinstance(want, Mapping)):
    return f"saved {saved!r}, requested {want!r}"
  names = sorted(set(saved) | set(want), key=str)
  return "; ".join(
    f"{name}: saved {saved.get(name, '(absent)')!r}, requested {want.get(name, '(absent)')!r}"
    for name in names
    if saved.get(name, "(absent)") != want.get(name, "(absent)")
  )


def load_model(
  directory: str,
  mesh: jax.sharding.Mesh | None = None,
  *,
  config: TransformerConfig | None = None,
  step: int | None = None,
  expected_meta: Mapping[str, Any] | None = None,
  tokenizer: Any = None,
  role: str = "model",
  resume: str = "latest",
  execution: Mapping[str, Any] | None = None,
) -> tuple[transformer.Transformer, dict[str, Any]]:
  """The one way to load a model: trained, distilled or imported from Hugging Face.

  The parameters are restored shard by shard onto ``mesh`` (any mesh: each device reads
  only its own shard), with the model config from the checkpoint's metadata.

  Args:
    directory: a checkpoint directory (``~`` expanded).
    mesh: where to place the model; default all devices on 'data'.
    config: run the model with this config instead (it must equal the saved one but for
      how it executes: ``EXECUTION_FIELDS``).
    step: the step to load; default the latest.
    expected_meta: metadata the checkpoint must match (``check_meta``), e.g. the model,
      tokenizer and data a workdir was trained with.
    tokenizer: a ``Tokenizer`` the checkpoint must have been made with (when it records
      one), and whose every piece it must embed.
    role: what the model is ('target', 'draft'), for error messages.
    resume: without ``step``, 'latest' or 'latest_intact' (``RESUME``): whether a corrupt
      latest step is an error or is moved aside for the newest intact one.
    execution: fields of ``EXECUTION_FIELDS`` to run the model with instead of the saved ones
      (the tensor-parallel mode of this run's mesh, ...).

  Returns:
    (model, metadata).
  """
  store = Checkpoints(directory, resume=resume)
  meta = store.read_meta(step)
  if "model" not in meta:
    raise CheckpointError(f"{store.directory} has no model config in its metadata.")
  if config is not None:
    check_meta(meta, {"model": dataclasses.asdict(config)}, store.directory)
  if expected_meta is not None:
    check_meta(meta, expected_meta, store.directory)
  config = config or TransformerConfig.from_config(meta["model"])
  if execution:
    unknown = sorted(set(execution) - set(EXECUTION_FIELDS))
    if unknown:
      raise ValueError(f"Only how a model runs may differ from its checkpoint, not {unknown}.")
    config = config.replace(**execution)
  if tokenizer is not None:
    if meta.get("tokenizer") not in (None, tokenizer.fingerprint):
      raise CheckpointError(
        f"The {role} checkpoint {store.directory} was made with tokenizer {meta['tokenizer']}, "
        f"not {tokenizer.path} ({tokenizer.fingerprint})."
      )
    if config.vocab_size < tokenizer.vocab_size:
      raise CheckpointError(
        f"The {role} checkpoint {store.directory} has {config.vocab_size} embeddings, fewer "
        f"than the tokenizer's {tokenizer.vocab_size} pieces."
      )
  abstract = sharding.abstract_model(
    lambda rngs: transformer.Transformer(config, rngs=rngs), mesh or default_mesh()
  )
  arrays = abstract.arrays()
  if store.unrolled_blocks(meta["step"]):
    params = store.restore_unrolled(arrays, meta["step"])
    return abstract.merge(params), meta
  restored, read = store.restore({"params": arrays}, step=step)
  if read["step"] != meta["step"]:  # An older intact step was read: it must match as well.
    check_meta(read, {"model": meta["model"]}, store.directory)
  return abstract.merge(restored["params"]), read
