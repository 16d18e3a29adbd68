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
import os
from collections.abc import Mapping
from typing import Any

import jax
import orbax.checkpoint as ocp

from specsamp import sharding
from specsamp.models import transformer
from specsamp.models.config import EXECUTION_FIELDS, TransformerConfig


class CheckpointError(ValueError):
  """A checkpoint that exists but cannot be used (corrupt, incomplete or mismatched)."""


def default_mesh() -> jax.sharding.Mesh:
  """All devices on the data axis (parameters replicated): where a model loads by default."""
  return sharding.make_mesh({"data": -1})


class Checkpoints:
  """A directory of numbered checkpoint steps, managed by orbax's CheckpointManager."""

  def __init__(self, directory: str, *, max_to_keep: int | None = 3):
    self.directory = os.path.abspath(os.path.expanduser(directory))
    self._max_to_keep = max_to_keep
    self._manager: ocp.CheckpointManager | None = None

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
      raise FileNotFoundError(
        f"{self.directory} holds no finished checkpoint (entries: "
        f"{sorted(os.listdir(self.directory))[:8]}). Train first, or point at the right "
        "directory."
      )
    if step is None:
      return max(steps)
    if step not in steps:
      raise FileNotFoundError(f"No step {step} in {self.directory}; it holds steps {steps}.")
    return step

  def read_meta(self, step: int | None = None) -> dict[str, Any]:
    """The JSON metadata of ``step`` (default: the latest)."""
    step = self._step_to_read(step)
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
      (items, meta) of ``step`` (default: the latest).
    """
    step = self._step_to_read(step)
    meta = self.read_meta(step)
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

  def _corrupt(self, step: int, what: str, error: Exception) -> CheckpointError:
    message = str(error).splitlines()[0][:300] if str(error) else ""
    return CheckpointError(
      f"Could not read '{what}' of checkpoint step {step} in {self.directory}: "
      f"{type(error).__name__}: {message}. The checkpoint is corrupt, incomplete, or was written "
      f"for a different model. Steps present: {self.all_steps()}; nothing was deleted."
    )


def check_meta(meta: Mapping[str, Any], expected: Mapping[str, Any], directory: str) -> None:
  """Refuses a checkpoint written for another model, tokenizer or training run.

  A saved model config is read with today's defaults for fields added since it was
  written, so a checkpoint stays usable when TransformerConfig grows a field; how the model
  runs (``EXECUTION_FIELDS``: activation dtype, tensor-parallel mode) may differ.
  """
  for key, want in expected.items():
    saved = meta.get(key)
    if key == "model" and isinstance(saved, Mapping) and isinstance(want, Mapping):
      saved = dataclasses.asdict(TransformerConfig.from_config(saved))
      saved, want = (
        {k: v for k, v in config.items() if k not in EXECUTION_FIELDS} for config in (saved, want)
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

  Returns:
    (model, metadata).
  """
  store = Checkpoints(directory)
  meta = store.read_meta(step)
  if "model" not in meta:
    raise CheckpointError(f"{store.directory} has no model config in its metadata.")
  if config is not None:
    check_meta(meta, {"model": dataclasses.asdict(config)}, store.directory)
  if expected_meta is not None:
    check_meta(meta, expected_meta, store.directory)
  config = config or TransformerConfig.from_config(meta["model"])
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
  restored, meta = store.restore({"params": abstract.arrays()}, step=meta["step"])
  return abstract.merge(restored["params"]), meta
