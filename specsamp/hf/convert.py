"""Import a Hugging Face model directory into specsamp, save and load it as an orbax
checkpoint, and export a specsamp model back to the HF format.

Import never holds the whole model in host RAM: each parameter is built with
``jax.make_array_from_callback``, which asks for each addressable device's
shard; the callback slices that shard out of a memory-mapped view of the
safetensors tensor (see ``weights``), casts it, and hands it over. A process
reads only the bytes of its own devices' shards, so the same code imports a
70B model on a pod slice (every host runs it; each places its share).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
import warnings
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specsamp import multihost, sharding
from specsamp.hf import architectures, safetensors_io, weights
from specsamp.models import transformer
from specsamp.models.config import TransformerConfig
from specsamp.sampling import model_protocol
from specsamp.training import checkpoint, train
from specsamp.training import tokenizer as tokenizer_lib


def load_tokenizer(hf_dir: str) -> Any:
  """The tokenizer of an HF directory: SentencePiece's tokenizer.model, else tokenizer.json
  with tokenizer_config.json (``tokenizer.load``)."""
  return tokenizer_lib.load(hf_dir)


def _cast(
  name: str,
  shard: np.ndarray,
  dtype: jnp.dtype,
  advice: str = "import it with param_dtype='bfloat16' or 'float32'",
) -> np.ndarray:
  """``shard`` in ``dtype``; refuses integer tensors, NaN/inf weights and overflowing casts
  (``advice``: what the overflow's message suggests)."""
  if not jnp.issubdtype(shard.dtype, jnp.floating):
    raise ValueError(
      f"Tensor {name!r} is stored as {shard.dtype}, not a float: quantized or "
      "corrupt weights, which specsamp does not import."
    )
  with np.errstate(over="ignore"):  # Overflow is reported below, with the tensor's name.
    out = np.asarray(shard, dtype=dtype)
  if not np.isfinite(out).all():
    if not np.isfinite(np.asarray(shard, np.float32)).all():
      raise ValueError(f"Tensor {name!r} holds NaN or inf values.")
    raise ValueError(
      f"Tensor {name!r} overflows {jnp.dtype(dtype).name} (largest magnitude "
      f"{float(np.abs(np.asarray(shard, np.float32)).max()):.3g}); {advice}."
    )
  return out


def import_model(
  hf_dir: str,
  mesh: jax.sharding.Mesh | None = None,
  *,
  param_dtype: str | None = None,
  dtype: str | None = None,
  tensor_parallel: str = "auto",
) -> tuple[transformer.Transformer, dict[str, Any]]:
  """Reads an HF model directory into a specsamp Transformer placed on ``mesh``.

  Args:
    hf_dir: a directory with config.json and model.safetensors (or shards
      plus model.safetensors.index.json).
    mesh: where parameters go, sharded by the rules table (default: all
      devices on 'data').
    param_dtype: weight dtype (default: the checkpoint's); dtype: activation
      dtype (default: param_dtype).
    tensor_parallel: 'auto' or 'shard_map'.

  Returns:
    (model, the HF config dict).
  """
  hf_dir = os.path.expanduser(hf_dir)
  hf_config = architectures.read_config(hf_dir)
  tensors = safetensors_io.Checkpoint(hf_dir)
  model = import_tensors(
    hf_config,
    tensors,
    hf_dir,
    mesh,
    param_dtype=param_dtype,
    dtype=dtype,
    tensor_parallel=tensor_parallel,
  )
  return model, hf_config


_SAFETENSORS_FLOATS = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "F64": "float64"}


def stored_dtype(hf_config: Mapping[str, Any], tensors: Any, source: str) -> str | None:
  """The dtype weights import in when the caller names none: config.json's (``dtype``,
  ``torch_dtype``), as transformers' dtype='auto' reads it, else the tensors' own when they
  are all of one float dtype (a bfloat16 checkpoint without the key imported as float32 before,
  twice its memory). A config that names another dtype than its tensors is warned about."""
  said = architectures.checkpoint_dtype(hf_config)
  names = tensors.dtype_names() if hasattr(tensors, "dtype_names") else set()
  floats = {_SAFETENSORS_FLOATS[n] for n in names if n in _SAFETENSORS_FLOATS}
  found = floats.pop() if len(floats) == 1 else None
  if said and found and said != found:
    warnings.warn(
      f"{source}: config.json says dtype {said}, but the weights are stored in {found}; they "
      f"import in {said} (as transformers' dtype='auto'); give param_dtype={found!r} to keep them "
      "as stored.",
      stacklevel=3,
    )
  return said or found


def import_tensors(
  hf_config: Mapping[str, Any],
  tensors: Any,
  source: str,
  mesh: jax.sharding.Mesh | None = None,
  *,
  param_dtype: str | None = None,
  dtype: str | None = None,
  tensor_parallel: str = "auto",
) -> transformer.Transformer:
  """A Transformer from an HF config dict and a tensor source under HF names and layouts
  (``keys()``, ``shape(name)`` and ``tensor(name)``: a safetensors ``Checkpoint``, or
  ``gguf.GgufTensors``), placed on ``mesh`` one device shard at a time; ``source`` names it
  in error messages."""
  hf_dir = source
  param_dtype = param_dtype or stored_dtype(hf_config, tensors, source)
  config = architectures.from_hf(
    hf_config, param_dtype=param_dtype, dtype=dtype, tensor_parallel=tensor_parallel
  )
  if config.tie_embeddings and _distinct_output_head(tensors):
    # tie_word_embeddings with an lm_head.weight of other values: transformers 5 keeps both
    # (it warns that it will not tie them), so the model has an output head of its own.
    hf_config = {**hf_config, "tie_word_embeddings": False}
    config = config.replace(tie_embeddings=False)
  mesh = mesh or checkpoint.default_mesh()
  model = sharding.abstract_model(lambda rngs: transformer.Transformer(config, rngs=rngs), mesh)
  graphdef, abstract, shardings = model.graphdef, model.shapes, model.shardings
  table = weights.entries(config, hf_config["model_type"])
  expected = {entry.hf_name for entry in table}
  missing = sorted(expected - set(tensors.keys()))
  if missing:
    raise architectures.UnsupportedArchitecture(
      f"{hf_dir} lacks {len(missing)} tensors a {hf_config['model_type']} model with this "
      f"config.json needs, e.g. {missing[:4]}."
    )
  unexpected = sorted(
    name
    for name in set(tensors.keys()) - expected
    if not name.endswith(weights.IGNORED_SUFFIXES)
    and not (config.tie_embeddings and name == "lm_head.weight")
  )
  if unexpected:
    raise architectures.UnsupportedArchitecture(
      f"{hf_dir} has {len(unexpected)} tensors that specsamp's {hf_config['model_type']} model "
      f"has no place for, e.g. {unexpected[:4]}: the architecture differs from what "
      "config.json says, or uses a feature specsamp lacks."
    )
  # The entries of each parameter, by their leading index into the stacked parameter: (layer,)
  # or (layer, expert). Every shape is checked before any tensor is read.
  by_path: dict[weights.Path, dict[tuple[int, ...], weights.Entry]] = {}
  for entry in table:
    shape = tuple(tensors.shape(entry.hf_name))
    if shape != entry.hf_shape:
      raise ValueError(f"{entry.hf_name} has shape {shape}; config.json implies {entry.hf_shape}.")
    by_path.setdefault(entry.path, {})[entry.index] = entry
  params: dict = jax.tree.map(lambda x: None, abstract)
  for path, entries in by_path.items():
    # This parameter's tensors (or fused parts) in our layout, read now and dropped once it is
    # placed: a safetensors tensor is a view of the mapped file, but a GGUF one is dequantized
    # to float32, and reading every tensor first held the whole model so on the host (an 8B
    # Q4 file: 32 GB, whatever the mesh or param_dtype; the review of 2026-11-30).
    indexed = {
      index: (entry.to_ours(entry.part(tensors.tensor(entry.hf_name))), entry.hf_name)
      for index, entry in entries.items()
    }
    target = weights.get(abstract, path)
    lead = len(next(iter(indexed)))  # Leading stacked axes: 0, 1 (layers) or 2 (+ experts).
    assert len(indexed) == int(np.prod(target.shape[:lead])), (path, target.shape)

    def read(index, indexed=indexed, lead=lead, shape=target.shape, dtype=target.dtype):
      ranges = [range(size)[index[axis]] for axis, size in enumerate(shape[:lead])]
      pieces = [
        _cast(indexed[key][1], indexed[key][0][index[lead:]], dtype)
        for key in itertools.product(*ranges)
      ]
      block = np.stack(pieces) if lead else pieces[0]
      return block.reshape(*(len(r) for r in ranges), *pieces[0].shape)

    array = jax.make_array_from_callback(target.shape, weights.get(shardings, path), read)
    weights.put(params, path, array)
  return nnx.merge(graphdef, params)


def _distinct_output_head(tensors: Any) -> bool:
  """Whether ``tensors`` hold an lm_head.weight that differs from the embedding table."""
  names = set(tensors.keys())
  if not {"lm_head.weight", "model.embed_tokens.weight"} <= names:
    return False
  head, table = (tensors.tensor(n) for n in ("lm_head.weight", "model.embed_tokens.weight"))
  if head.shape != table.shape or head.dtype != table.dtype:
    return True
  rows = max(1, (64 << 20) // max(1, int(np.prod(head.shape[1:])) * head.dtype.itemsize))
  for start in range(0, head.shape[0], rows):  # 64 MiB at a time, bytes against bytes.
    a, b = (np.ascontiguousarray(t[start : start + rows]).view(np.uint8) for t in (head, table))
    if not np.array_equal(a, b):
      return True
  return False


def _source_meta(hf_dir: str, hf_config: Mapping[str, Any]) -> dict[str, Any]:
  return {
    "format": "huggingface",
    "path": os.path.abspath(hf_dir),
    "model_type": hf_config["model_type"],
  }


def import_to_checkpoint(
  hf_dir: str, output_dir: str, mesh: jax.sharding.Mesh | None = None, **import_options: Any
) -> TransformerConfig:
  """Imports ``hf_dir`` and saves it as an orbax checkpoint (step 0) in ``output_dir``,
  with the model config, tokenizer fingerprint and source in its metadata. Refuses a
  directory that already holds a checkpoint (nothing saved is overwritten)."""
  hf_dir = os.path.expanduser(hf_dir)
  finished = finish_stopped_import(hf_dir, output_dir)
  if finished is not None:
    return finished
  store = empty_store(output_dir)
  model, hf_config = import_model(hf_dir, mesh, **import_options)
  tokenizer = load_tokenizer(hf_dir) if tokenizer_lib.find(hf_dir) else None
  save_checkpoint(model, tokenizer, store, _source_meta(hf_dir, hf_config))
  return model.config


def finish_stopped_import(hf_dir: str, output_dir: str) -> TransformerConfig | None:
  """Completes an import of ``hf_dir`` into ``output_dir`` that stopped between its checkpoint's
  commit and its tokenizer's files (the tokenizer is written after the weights): the same
  import run again writes the tokenizer, after checking that the checkpoint came from
  ``hf_dir`` and recorded that tokenizer's fingerprint. Returns the checkpoint's model config,
  or None where there is nothing to finish (no checkpoint, or one with its tokenizer)."""
  output_dir = os.path.expanduser(output_dir)
  if not os.path.isdir(output_dir) or tokenizer_lib.find(output_dir) is not None:
    return None
  store = checkpoint.Checkpoints(output_dir, max_to_keep=None)
  if store.latest_step() is None:
    return None
  meta = store.read_meta()
  recorded = meta.get("tokenizer")
  if recorded is None or meta.get("source", {}).get("path") != os.path.abspath(hf_dir):
    return None  # Not this import's, or one without a tokenizer: empty_store refuses it.
  tokenizer = load_tokenizer(hf_dir) if tokenizer_lib.find(hf_dir) else None
  if tokenizer is None or tokenizer.fingerprint != recorded:
    raise FileExistsError(
      f"{output_dir} holds an import of {hf_dir} that stopped before writing its tokenizer, "
      f"and {hf_dir}'s tokenizer is no longer the one imported; choose another output directory."
    )
  tokenizer.save(store.directory)  # Every process, as save_checkpoint writes it.
  return TransformerConfig.from_config(meta["model"])


def refuse_non_empty(output_dir: str, action: str) -> None:
  """Raises FileExistsError when ``output_dir`` exists and holds anything: ``action`` (an
  import, an export) writes its files (the tokenizer's, config.json) over same-named ones, so
  a workdir's tokenizer or a user's HF folder would be overwritten."""
  if os.path.exists(output_dir) and not os.path.isdir(output_dir):
    raise FileExistsError(f"{output_dir} is a file; {action} writes into a folder.")
  # Checked before any weight is read (orbax failed at the save, after a whole import): the
  # folder itself where it exists, else the nearest folder above it, where it will be made.
  where = os.path.abspath(output_dir)
  while not os.path.exists(where):
    where = os.path.dirname(where)
  if not os.path.isdir(where):
    raise NotADirectoryError(
      f"{output_dir}: {where} is a file; {action} writes into a new or empty folder."
    )
  if not os.access(where, os.W_OK | os.X_OK):
    raise PermissionError(f"{output_dir}: this process cannot write in {where}.")
  held = sorted(os.listdir(output_dir)) if os.path.isdir(output_dir) else []
  # What an interrupted orbax save leaves (a step it never finished): no user's file.
  held = [name for name in held if ".orbax-checkpoint-tmp" not in name]
  if held:
    shown = ", ".join(held[:4]) + (f" and {len(held) - 4} more" if len(held) > 4 else "")
    raise FileExistsError(
      f"{output_dir} is not empty ({shown}); {action} writes only into a new or empty "
      "directory, so that nothing there is overwritten: choose another one."
    )


def empty_store(output_dir: str) -> checkpoint.Checkpoints:
  """The checkpoint store an import writes: a new or empty directory (``refuse_non_empty``;
  one that already holds a checkpoint says so)."""
  store = checkpoint.Checkpoints(os.path.expanduser(output_dir), max_to_keep=None)
  if store.latest_step() is not None:
    raise FileExistsError(
      f"{store.directory} already holds a checkpoint (steps "
      f"{store.all_steps()}); choose another output directory."
    )
  refuse_non_empty(store.directory, "an import")
  return store


def save_checkpoint(
  model: transformer.Transformer,
  tokenizer: Any,
  store: checkpoint.Checkpoints,
  source: dict[str, Any],
) -> None:
  """Saves an imported ``model`` as step 0 of ``store`` with the model config, the
  tokenizer's fingerprint and ``source`` in its metadata, and the tokenizer's files beside
  the step directories (orbax lists only those)."""
  if tokenizer is not None and tokenizer.vocab_size > model.vocab_size:
    raise ValueError(
      f"{source.get('path')}: the tokenizer has {tokenizer.vocab_size} pieces but the model "
      f"only {model.vocab_size} embeddings."
    )
  meta = {
    "model": dataclasses.asdict(model.config),
    "tokenizer": None if tokenizer is None else tokenizer.fingerprint,
    "source": source,
  }
  store.save(0, {"params": train.params_of(model)}, meta)
  store.wait()
  if tokenizer is not None:  # Every process: a host without a shared folder needs it too, and
    tokenizer.save(store.directory)  # the writes are atomic (files.write_atomically).


def export_model(
  model: transformer.Transformer,
  output_dir: str,
  *,
  tokenizer: Any = None,
  dtype: str | None = None,
  max_shard_bytes: int = 5 << 30,
  model_type: str | None = None,
) -> list[str]:
  """Writes ``model`` as an HF model directory (config.json, generation_config.json,
  safetensors shards, and the tokenizer's files when given) that transformers loads with
  ``AutoModelForCausalLM.from_pretrained``. One tensor (one layer of a stacked parameter) at
  a time is on the host. ``model_type``: the HF type to write (default the one
  ``architectures.model_type_of`` gives; e.g. 'phi3' for a model imported from Phi-3, whose
  q/k/v and gate/up are joined again); refused when it cannot express the model exactly.

  Returns the safetensors file names. Refuses a directory that already holds a model, or
  anything else (``refuse_non_empty``).
  """
  config = model.config
  dtype = dtype or config.param_dtype
  ids = {}
  if tokenizer is not None:
    ids = {
      "bos_token_id": tokenizer.bos_id,
      "eos_token_id": tokenizer.eos_id,
      "pad_token_id": tokenizer.pad_id,
    }
    ids = {key: value for key, value in ids.items() if value is not None and value >= 0}
  hf_config = architectures.to_hf(config, dtype=dtype, special_ids=ids, model_type=model_type)
  if os.path.exists(os.path.join(output_dir, "config.json")):
    raise FileExistsError(
      f"{output_dir} already holds a model (config.json); choose another directory."
    )
  refuse_non_empty(output_dir, "an export")
  params = train.params_of(model)
  np_dtype = jnp.dtype(dtype)

  def tensors():
    parts: list = []  # The parts of one fused HF tensor (Phi-3), gathered until it is whole.
    table = weights.entries(config, hf_config["model_type"])
    for position, entry in enumerate(table):
      array = weights.get(params, entry.path)
      # One layer's (expert's).
      host = multihost.to_host(array[entry.index] if entry.index else array)
      parts.append((entry, np.ascontiguousarray(entry.to_hf(host))))
      if position + 1 == len(table) or table[position + 1].hf_name != entry.hf_name:
        joined = np.ascontiguousarray(weights.joined(parts))
        yield (
          entry.hf_name,
          _cast(entry.hf_name, joined, np_dtype, "export it as bfloat16 or float32"),
        )
        parts = []

  if jax.process_index() != 0:
    for _ in tensors():  # Other hosts join the gathers, and write nothing.
      pass
    return []
  created = os.path.abspath(output_dir)  # The outermost folder this export makes, if any.
  while not os.path.exists(os.path.dirname(created)):
    created = os.path.dirname(created)
  created = None if os.path.isdir(output_dir) else created
  before = set() if created else set(os.listdir(output_dir))
  os.makedirs(output_dir, exist_ok=True)
  try:
    names = safetensors_io.write_sharded(output_dir, tensors(), max_shard_bytes)
    with open(os.path.join(output_dir, "config.json"), "w") as f:
      json.dump(hf_config, f, indent=2)
    generation = dict(ids)
    if tokenizer is not None:
      tokenizer.save(output_dir)
      stops = list(getattr(tokenizer, "stop_ids", (tokenizer.eos_id,)))
      if len(stops) > 1:  # Every id that ends generation (Llama 3's, Gemma's), as HF lists them.
        generation["eos_token_id"] = stops
    with open(os.path.join(output_dir, "generation_config.json"), "w") as f:
      json.dump(generation, f, indent=2)
  except BaseException:
    # A failed export (a tensor that overflows the dtype, Ctrl-C) leaves no half model: what
    # it wrote is removed, and the folders it made; a failure to remove hides no error.
    if created:
      shutil.rmtree(created, ignore_errors=True)
    else:
      for name in set(os.listdir(output_dir)) - before:
        path = os.path.join(output_dir, name)
        try:
          shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
        except OSError:
          pass
    raise
  return names


def check_pair(
  target: Any,
  draft: Any,
  target_tokenizer: Any = None,
  draft_tokenizer: Any = None,
) -> None:
  """Refuses a target/draft pair that cannot speculate together: different vocab sizes, or
  tokenizers (when both are known) that map text to different ids."""
  model_protocol.check_same_vocabulary(target, draft)
  if target_tokenizer is not None and draft_tokenizer is not None:
    tokenizer_lib.check_same(target_tokenizer, draft_tokenizer)
