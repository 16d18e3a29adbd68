r"""The target's outputs on packed training rows, computed once and read at every epoch.

A feature head trains on the target's features at its ``feature_layers`` and on the target's
distribution as its teacher (``feature_train``). Computed online, every training step pays one
teacher-forced pass of the target, so every epoch over the same answers pays it again. Stored,
the pass runs once per row: each row gets its features and the hidden state leaving the
target's last layer, from which the step recomputes the teacher's logits through the final
norm and the output head, restricted to the head's draft vocabulary (``Transformer.output``).
That costs a matrix product over those columns instead of the whole target.

  DIRECTORY/outputs.bin    [rows, seq_len + 1, (len(layers) + 1) * d_model] in the activation
                           dtype, row-major: the features, then the last layer's output
  DIRECTORY/meta.json      target, layers, dtype, shape, how the pass read the rows (each
                           packed sequence apart, ``answers.packed_call``), and a sha256 of
                           the rows' tokens and answer weights
  DIRECTORY/progress.json  rows written so far (renamed into place after each chunk)

The rows are written in chunks and flushed before ``progress.json`` names them, so a stopped
build resumes at the first unwritten chunk. New shards only extend a store: ``answers.stream``
packs the shards in order, so the rows of the old ones come first, unchanged, and a store whose
rows are exactly the first of the new ones keeps them and computes only the rest. A store made
for other rows, another target or other layers is rebuilt: it is derived from the shards, which
are never touched. On CPU the stored float32 values are the online pass's (tested), so a head
trains the same either way; a bfloat16 target stores bfloat16.

What it costs: (len(layers) + 1) * d_model values per token, 9.2 KB for SmolLM2-135M in
float32 (1M tokens: 9.2 GB on disk, read through a memory map).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx

from specsamp import files, multihost
from specsamp.training import answers, train

OUTPUTS, META, PROGRESS = "outputs.bin", "meta.json", "progress.json"


def width(layers: tuple[int, ...], d_model: int) -> int:
  """Values stored per token: the features at ``layers``, then the last layer's output."""
  return (len(layers) + 1) * d_model


def _numpy_dtype(dtype: Any) -> np.dtype:
  return np.dtype(ml_dtypes.bfloat16) if jnp.dtype(dtype) == jnp.bfloat16 else np.dtype(dtype)


def _read_json(path: str) -> dict[str, Any] | None:
  """The JSON object in ``path``; None when it is absent or damaged (the store is derived
  data: a damaged record rebuilds it)."""
  if not os.path.exists(path):
    return None
  try:
    with open(path, encoding="utf-8") as f:
      value = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError):
    return None
  return value if isinstance(value, dict) else None


def _rows_sha256(sequences: np.ndarray, weights: np.ndarray | None, rows: int) -> str:
  """The hash of the first ``rows`` rows: their tokens, and their answer weights when the pass
  keeps their sequences apart (the weights tell the sequences apart)."""
  digest = hashlib.sha256(sequences[:rows].tobytes())
  if weights is not None:
    digest.update(weights[:rows].tobytes())
  return digest.hexdigest()


def _extends(
  stored: dict[str, Any] | None,
  meta: dict[str, Any],
  sequences: np.ndarray,
  weights: np.ndarray | None,
) -> bool:
  """Whether a store made with ``stored`` holds the first rows of ``sequences`` (``meta``'s
  rows): the same target, layers, dtype and row length, fewer rows, and those rows' tokens
  exactly the first of these (more shards pack into the same rows, then new ones after them)."""
  if stored is None or stored == meta:
    return False
  same = ("target", "layers", "dtype", "context")
  if any(stored.get(key) != meta[key] for key in same) or stored["shape"][1:] != meta["shape"][1:]:
    return False
  old_rows = int(stored["shape"][0])
  if not 0 < old_rows < meta["shape"][0]:
    return False
  return _rows_sha256(sequences, weights, old_rows) == stored["rows_sha256"]


def _capture_fn(target: Any, layers: tuple[int, ...]):
  """A jitted [B, L] tokens -> [B, L, width] of the target's features and last-layer output.
  Only the first token's logits are formed (``logits_at``): the store needs none. The program
  is compiled once per model structure and layers (``_capture``), not once per store built."""
  graphdef, state = nnx.split(target)
  return lambda tokens_BL, weights_BL=None: _capture(graphdef, layers, state, tokens_BL, weights_BL)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _capture(graphdef: Any, layers: tuple[int, ...], state: Any, tokens_BL, weights_BL):
  model = nnx.merge(graphdef, state)
  last, d_model = model.config.num_layers, model.config.d_model
  # A head may read the last layer's output among its features: captured once, stored twice.
  captured = layers if last in layers else (*layers, last)
  positions_BL, call = answers.packed_call(weights_BL)  # Each packed sequence read apart.
  out = model(
    tokens_BL,
    positions_BL,
    tree=call,
    capture_layers=captured,
    logits_at=jnp.zeros(tokens_BL.shape[0], jnp.int32),
  )
  if captured is layers:
    at = layers.index(last) * d_model
    return jnp.concatenate([out.features, out.features[..., at : at + d_model]], axis=-1)
  return out.features


def parameters_fingerprint(model: Any) -> str:
  """A short hash of the first and last 64 values of every parameter's first and last rows
  (exact bytes, no sums: the same on any mesh; no parameter is copied whole). ``model``: an
  nnx module (its ``nnx.Param`` leaves) or any pytree of arrays. On several hosts every process
  must call it (a parameter split over hosts is gathered: a collective)."""
  digest = hashlib.sha256()
  # An nnx module's parameters with its layers stacked, however it runs them (params_of).
  params = train.params_of(model) if isinstance(model, nnx.Module) else model
  for leaf in jax.tree.leaves(params):
    if not hasattr(leaf, "ndim") or leaf.ndim == 0:
      digest.update(np.asarray(leaf).tobytes())
      continue
    for part in (leaf[(0,) * (leaf.ndim - 1)][:64], leaf[(-1,) * (leaf.ndim - 1)][-64:]):
      host = multihost.to_host(part) if isinstance(part, jax.Array) else np.asarray(part)
      digest.update(host.tobytes())
  return digest.hexdigest()[:16]


def build(
  target: Any,
  sequences: np.ndarray,
  layers: tuple[int, ...],
  directory: str,
  *,
  target_id: str,
  weights: np.ndarray | None = None,
  chunk_rows: int = 8,
  log: Callable[[str], None] = print,
) -> np.ndarray:
  """The target's outputs on every row of ``sequences`` ([N, L] tokens), built (or completed,
  or extended by appended rows) in ``directory``; returns them read-only as a memory map
  [N, L, width]. ``weights``: the rows' answer weights ([N, L], ``answers``): the target then
  reads each packed sequence apart, as the head's training pass does."""
  layers = tuple(int(layer) for layer in layers)
  sequences = np.ascontiguousarray(sequences, np.int32)
  if weights is not None:
    weights = np.ascontiguousarray(weights, np.float32)
  dtype = _numpy_dtype(target.config.activation_dtype)
  shape = [int(n) for n in sequences.shape] + [width(layers, target.config.d_model)]
  meta = {
    # The answers' target id and the parameters in use: a store made by another model of the
    # same shape (another checkpoint) is another target's.
    "target": f"{target_id} {parameters_fingerprint(target)}",
    "layers": list(layers),
    "dtype": dtype.name,
    "shape": shape,
    # How the pass read the rows: each packed sequence apart (answer rows), or whole rows.
    "context": "whole_rows" if weights is None else answers.CONTEXT,
    "rows_sha256": _rows_sha256(sequences, weights, len(sequences)),
  }
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, OUTPUTS)
  progress = _read_json(os.path.join(directory, PROGRESS))
  stored_meta = _read_json(os.path.join(directory, META))
  if progress is not None and _extends(stored_meta, meta, sequences, weights):
    # New shards appended rows after the stored ones: keep those, compute only the new rows.
    old_rows = stored_meta["shape"][0]
    log(f"target outputs: {directory} holds the first {old_rows:,} rows; extending it")
    with open(path, "r+b") as f:
      f.truncate(int(np.prod(shape)) * dtype.itemsize)
    files.write_json(os.path.join(directory, META), meta)
    stored_meta = meta
  size = int(np.prod(shape)) * dtype.itemsize
  if (
    progress is not None
    and stored_meta == meta
    and (not os.path.exists(path) or os.path.getsize(path) != size)
  ):
    log(f"target outputs: {path} is not the size its record says (a damaged copy?); rebuilding")
    progress = None
  if stored_meta != meta or progress is None:
    if os.path.exists(path):
      log(f"target outputs: {directory} was built for other rows, target or layers; rebuilding")
    for name in (PROGRESS, META, OUTPUTS):
      if os.path.exists(os.path.join(directory, name)):
        os.remove(os.path.join(directory, name))
    files.write_json(os.path.join(directory, META), meta)
    np.memmap(path, dtype, "w+", shape=tuple(shape)).flush()
    progress = {"rows": 0}
    files.write_json(os.path.join(directory, PROGRESS), progress)
  done, total = int(progress["rows"]), shape[0]
  if done < total:
    outputs = np.memmap(path, dtype, "r+", shape=tuple(shape))
    capture = _capture_fn(target, layers)
    start, first = time.perf_counter(), done
    log(
      f"target outputs: {total - done:,} of {total:,} rows of {shape[1]} tokens to compute "
      f"({np.prod(shape) * dtype.itemsize / 2**30:.2f} GiB in {directory})"
    )
    for row in range(done, total, chunk_rows):
      stop = min(row + chunk_rows, total)
      chunk = [sequences[row:stop]] + ([] if weights is None else [weights[row:stop]])
      if stop - row < chunk_rows:  # One compiled shape: pad the last chunk with its first row.
        chunk = [np.concatenate([a, np.repeat(a[:1], chunk_rows - len(a), 0)]) for a in chunk]
      outputs[row:stop] = np.asarray(capture(*map(jnp.asarray, chunk)))[: stop - row]
      outputs.flush()
      files.write_json(os.path.join(directory, PROGRESS), {"rows": stop})
      if (stop - first) % (chunk_rows * 16) == 0 or stop == total:
        seconds = time.perf_counter() - start
        log(
          f"target outputs: {stop:,}/{total:,} rows, "
          f"{(stop - first) * shape[1] / seconds:.0f} tokens/s"
        )
    del outputs
  return np.memmap(path, dtype, "r", shape=tuple(shape))
