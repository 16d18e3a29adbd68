"""What a sampler allocates, estimated before it allocates anything.

The samplers' large buffers are the KV caches (one per model, ``batch x cache_length`` slots
in every layer) and, for speculative sampling, the K draft distributions q and the K + 1
target distributions p, each a float32 row of the vocabulary. ``check_fits`` compares their
sum with the memory of the devices, so a batch or K that cannot fit is refused with the
numbers, instead of an allocator error from inside the compiled loop.

The estimate is a lower bound (activations and compiler temporaries come on top), and it is
compared with the memory of all devices together (a perfectly sharded cache), so it refuses
only what cannot fit at all.
"""

from __future__ import annotations

import math
import os
from typing import Any

import jax
import numpy as np

from specsamp.sampling import model_protocol


def tree_bytes(tree: Any) -> int:
  """Bytes of the arrays (or shape-dtype structs) of a pytree."""
  return sum(
    math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize for leaf in jax.tree.leaves(tree)
  )


_CACHE_BYTES: dict[Any, int] = {}


def cache_bytes(model: Any, batch_size: int, cache_length: int) -> int:
  """Bytes of ``model.init_cache(batch_size, cache_length)``, from its shapes alone (traced once
  per model structure and shape, then remembered: a sampler calls this on every call)."""
  static, dynamic = model_protocol.split_model(model)
  shapes = tuple((leaf.shape, str(leaf.dtype)) for leaf in jax.tree.leaves(dynamic))
  key = (static, shapes, batch_size, cache_length)
  if key not in _CACHE_BYTES:
    _CACHE_BYTES[key] = tree_bytes(
      jax.eval_shape(lambda: model.init_cache(batch_size, cache_length))
    )
  return _CACHE_BYTES[key]


def device_memory() -> tuple[int, str]:
  """(bytes, description) of the memory the samplers can use: the sum of every device's limit
  on an accelerator; the host's RAM on CPU (where all devices share it)."""
  devices = jax.devices()
  stats = devices[0].memory_stats() if devices[0].platform != "cpu" else None
  if stats and stats.get("bytes_limit"):
    return (
      int(stats["bytes_limit"]) * len(devices),
      f"{len(devices)} {devices[0].device_kind} devices",
    )
  try:
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError, AttributeError):  # Not POSIX: no limit known.
    return 0, "unknown"
  return int(ram) * jax.process_count(), "host RAM"


def _gib(num_bytes: float) -> str:
  return f"{num_bytes / 2**30:.2f} GiB"


def check_fits(parts: dict[str, int], shape: str) -> None:
  """Raises ``ValueError`` when the buffers in ``parts`` (name -> bytes) exceed the memory of
  the devices; ``shape`` says what they are for (e.g. '4 rows x 2048 cache slots')."""
  total = sum(parts.values())
  available, where = device_memory()
  if available and total > available:
    listed = ", ".join(f"{name} {_gib(size)}" for name, size in parts.items())
    raise ValueError(
      f"Sampling {shape} needs at least {_gib(total)} ({listed}), more than the "
      f"{_gib(available)} of {where}: lower the batch size, max_new_tokens, num_draft_tokens "
      "or the prompt length."
    )


def is_out_of_memory(error: Exception) -> bool:
  """Whether a JAX runtime error is an allocation failure (XLA's RESOURCE_EXHAUSTED, or the
  CPU client's 'Out of memory allocating')."""
  text = str(error).lower()
  return "resource_exhausted" in text or "out of memory" in text


def out_of_memory_error(error: Exception, shape: str) -> ValueError:
  """The one-line error for an allocation failure of the compiled sampler."""
  first = str(error).strip().splitlines()[0][:200]
  return ValueError(
    f"Sampling {shape} ran out of device memory inside the compiled loop ({first}): the KV "
    "caches fit, but the activations do not (scoring K + 1 tokens attends over the whole "
    "cache); lower the batch size, num_draft_tokens or max_new_tokens."
  )
