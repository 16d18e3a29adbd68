"""The safetensors format, read lazily and written, with no dependency beyond numpy.

A file is an 8-byte little-endian header length, a JSON header mapping each
tensor name to its dtype, shape and byte range, then the raw bytes. Reading
memory-maps the file, so ``tensor(name)`` is a view: slicing it touches only
the bytes of that slice (how a 70B import places each device's shard without
the whole model in host RAM). A model directory holds one
``model.safetensors`` or several shards listed in ``model.safetensors.index.json``.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable, Mapping

import ml_dtypes
import numpy as np

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"

_DTYPES = {
  "F64": np.dtype(np.float64),
  "F32": np.dtype(np.float32),
  "F16": np.dtype(np.float16),
  "BF16": np.dtype(ml_dtypes.bfloat16),
  "I64": np.dtype(np.int64),
  "I32": np.dtype(np.int32),
  "I16": np.dtype(np.int16),
  "I8": np.dtype(np.int8),
  "U8": np.dtype(np.uint8),
  "BOOL": np.dtype(np.bool_),
  "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
  "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
}
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}


class SafetensorsError(ValueError):
  """A file or directory that is not a readable safetensors checkpoint."""


class SafetensorsFile:
  """One .safetensors file, memory-mapped; tensors are read-only numpy views."""

  def __init__(self, path: str):
    self.path = path
    try:
      with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        if header_len > os.path.getsize(path) - 8:
          raise SafetensorsError(f"{path}: header length {header_len} exceeds the file.")
        header = json.loads(f.read(header_len))
    except (struct.error, json.JSONDecodeError, UnicodeDecodeError) as error:
      raise SafetensorsError(f"{path} is not a safetensors file ({error}).") from error
    if not isinstance(header, dict):
      raise SafetensorsError(f"{path} is not a safetensors file (its header is no JSON object).")
    self.metadata = header.pop("__metadata__", {}) or {}
    self._entries = header
    self._data_start = 8 + header_len
    data_bytes = os.path.getsize(path) - self._data_start
    for name, entry in header.items():
      self._check_entry(name, entry, data_bytes)
    self._map = np.memmap(path, dtype=np.uint8, mode="r") if header else None

  def _check_entry(self, name: str, entry: object, data_bytes: int) -> None:
    """Refuses an entry whose byte range lies outside the file or does not hold its shape (a
    truncated download, a corrupt header), naming the file and the tensor."""
    try:
      dtype, shape, (begin, end) = entry["dtype"], list(entry["shape"]), entry["data_offsets"]
      sizes_ok = all(isinstance(n, int) and n >= 0 for n in [*shape, begin, end])
    except (TypeError, KeyError, ValueError):
      raise SafetensorsError(
        f"{self.path}: the header's entry for {name!r} is not a tensor's (dtype, shape, "
        f"data_offsets): {entry!r}."
      ) from None
    if not sizes_ok or not begin <= end:
      raise SafetensorsError(f"{self.path}: tensor {name!r} has a malformed entry {entry!r}.")
    if end > data_bytes:
      raise SafetensorsError(
        f"{self.path}: tensor {name!r} ends at byte {end} of the data, which holds "
        f"{data_bytes}: the file is truncated (an interrupted download or copy)."
      )
    if dtype in _DTYPES and end - begin != int(np.prod(shape)) * _DTYPES[dtype].itemsize:
      raise SafetensorsError(
        f"{self.path}: tensor {name!r} of shape {shape} and dtype {dtype} spans {end - begin} "
        "bytes: a corrupt header."
      )

  def keys(self) -> list[str]:
    return list(self._entries)

  def dtype_name(self, name: str) -> str:
    return self._entries[name]["dtype"]

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self._entries[name]["shape"])

  def tensor(self, name: str) -> np.ndarray:
    entry = self._entries[name]
    if entry["dtype"] not in _DTYPES:
      raise SafetensorsError(
        f"{self.path}: tensor {name!r} has dtype {entry['dtype']}, which "
        f"specsamp cannot read (known: {sorted(_DTYPES)})."
      )
    begin, end = entry["data_offsets"]
    raw = self._map[self._data_start + begin : self._data_start + end]
    return raw.view(_DTYPES[entry["dtype"]]).reshape(entry["shape"])


class Checkpoint:
  """All tensors of a Hugging Face model directory (single file or sharded with an index)."""

  def __init__(self, directory: str):
    self.directory = directory
    index_path = os.path.join(directory, INDEX_FILE)
    single_path = os.path.join(directory, SINGLE_FILE)
    if os.path.exists(index_path):
      try:
        with open(index_path) as f:
          weight_map = json.load(f)["weight_map"]
        files = sorted(set(weight_map.values()))
      except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as e:
        raise SafetensorsError(
          f"{index_path} is not a safetensors index (a JSON object whose 'weight_map' maps "
          f"each tensor to its shard): {type(e).__name__}: {e}."
        ) from None
      absent = [name for name in files if not os.path.isfile(os.path.join(directory, name))]
      if absent:
        raise SafetensorsError(
          f"{index_path} lists shards that are not in {directory}: {absent[:4]} (an unfinished "
          "download?)."
        )
    elif os.path.exists(single_path):
      files, weight_map = [SINGLE_FILE], None
    else:
      present = sorted(os.listdir(directory)) if os.path.isdir(directory) else "no such directory"
      raise FileNotFoundError(
        f"No {SINGLE_FILE} or {INDEX_FILE} in {directory} (found: {present}). specsamp reads "
        "Hugging Face safetensors checkpoints; convert a PyTorch .bin checkpoint with "
        "transformers' save_pretrained(..., safe_serialization=True) first."
      )
    self.files = {name: SafetensorsFile(os.path.join(directory, name)) for name in files}
    self._where = {}
    for file in self.files.values():
      for key in file.keys():
        self._where[key] = file
    if weight_map is not None:
      missing = sorted(set(weight_map) - set(self._where))
      if missing:
        raise SafetensorsError(f"{index_path} lists tensors no shard holds: {missing[:5]}.")

  def __contains__(self, name: str) -> bool:
    return name in self._where

  def keys(self) -> list[str]:
    return list(self._where)

  def tensor(self, name: str) -> np.ndarray:
    if name not in self._where:
      raise KeyError(f"{self.directory} has no tensor {name!r}.")
    return self._where[name].tensor(name)

  def shape(self, name: str) -> tuple[int, ...]:
    if name not in self._where:
      raise KeyError(f"{self.directory} has no tensor {name!r}.")
    return self._where[name].shape(name)

  def dtype_names(self) -> set[str]:
    return {file.dtype_name(key) for key, file in self._where.items()}


def write_file(
  path: str, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None
) -> None:
  """Writes ``tensors`` (name -> array) to one .safetensors file."""
  header, offset = {}, 0
  arrays = {}
  for name, array in tensors.items():
    array = np.ascontiguousarray(array)
    if array.dtype not in _NAMES:
      raise SafetensorsError(f"Cannot write {name!r} of dtype {array.dtype} as safetensors.")
    header[name] = {
      "dtype": _NAMES[array.dtype],
      "shape": list(array.shape),
      "data_offsets": [offset, offset + array.nbytes],
    }
    arrays[name] = array
    offset += array.nbytes
  if metadata:
    header["__metadata__"] = dict(metadata)
  encoded = json.dumps(header, separators=(",", ":")).encode()
  encoded += b" " * (-len(encoded) % 8)  # Align the data to 8 bytes.
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(encoded)))
    f.write(encoded)
    for array in arrays.values():
      f.write(array.tobytes())


def write_sharded(
  directory: str, tensors: Iterable[tuple[str, np.ndarray]], max_shard_bytes: int = 5 << 30
) -> list[str]:
  """Writes tensors (produced one at a time) into shards of at most ``max_shard_bytes``
  plus the index; a single shard is written as ``model.safetensors`` with no index.
  Returns the file names."""
  current: dict[str, np.ndarray] = {}
  size = total = 0
  temp_names = []

  def flush():
    nonlocal current, size
    if current:
      name = f"shard-{len(temp_names):05d}.tmp"
      write_file(os.path.join(directory, name), current, {"format": "pt"})
      temp_names.append((name, list(current)))
      current, size = {}, 0

  for name, array in tensors:
    if current and size + array.nbytes > max_shard_bytes:
      flush()
    current[name] = array
    size += array.nbytes
    total += array.nbytes
  flush()
  if len(temp_names) == 1:
    os.replace(os.path.join(directory, temp_names[0][0]), os.path.join(directory, SINGLE_FILE))
    return [SINGLE_FILE]
  count = len(temp_names)
  weight_map, names = {}, []
  for i, (temp, keys) in enumerate(temp_names):
    final = f"model-{i + 1:05d}-of-{count:05d}.safetensors"
    os.replace(os.path.join(directory, temp), os.path.join(directory, final))
    names.append(final)
    weight_map.update({key: final for key in keys})
  with open(os.path.join(directory, INDEX_FILE), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
  return names
