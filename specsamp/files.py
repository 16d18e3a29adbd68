"""Atomic file writes: whoever reads a file (a resumed run, another host, a user) finds it whole
or not at all.

Every file specsamp writes for later (tokenizers, checkpoints' sidecars, answer shards and their
manifest, the target store's metadata, the best drafter's record, the prompt snapshot, the
scripts' reports) goes through ``write_atomically``: into a partial file of this process's own,
renamed into place. The partial name carries the host and the process id because on several
hosts every process may write the same file into one shared directory (regeneration's answers
are replicated): with one name for all of them, one process would truncate another's file
mid-write and the second rename would find nothing. A write that fails, or a Ctrl-C in the
middle of one, removes its partial file. A path that is a link or not a regular file
(``/dev/stdout``, a named pipe) is written through, not replaced.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from typing import Any


def partial_path(path: str) -> str:
  """The partial file this process writes ``path`` through: its host's name and its process id
  (a pid alone repeats across hosts, identical containers often give every host the same)."""
  return f"{path}.partial-{socket.gethostname()}-{os.getpid()}"


def write_atomically(path: str, data: bytes | str | Callable[[str], None]) -> None:
  """Writes ``path`` whole or not at all. ``data`` is the file's bytes, its text (UTF-8), or a
  function that writes the file at the path it is given (``np.savez`` into an open file, an
  ``lzma`` stream)."""

  def write(target: str) -> None:
    if callable(data):
      data(target)
    else:
      with open(target, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)

  if os.path.islink(path) or (os.path.exists(path) and not os.path.isfile(path)):
    write(path)  # /dev/stdout, a named pipe, or a link the user made: written through.
    return
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  partial = partial_path(path)
  try:
    write(partial)
    os.replace(partial, path)
  except BaseException:
    if os.path.exists(partial):
      os.remove(partial)
    raise


def read_json(path: str) -> Any:
  """The JSON value in ``path``. A file that is not JSON (cut short, a merge conflict's markers,
  binary) is a ValueError that names it, where ``json`` names only a line and column."""
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as error:
    raise ValueError(
      f"{path} is not valid JSON ({error}): damaged, or not the file it should be."
    ) from None


def write_json(path: str, value: Any, indent: int = 1) -> None:
  """``value`` as JSON at ``path``, written atomically."""
  write_atomically(path, json.dumps(value, indent=indent))
