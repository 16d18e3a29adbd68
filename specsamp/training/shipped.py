r"""A drafter shipped as a folder: its checkpoint, its card and the sums that prove the copy whole.

  FOLDER/checkpoint/0/   an orbax checkpoint (step 0): the parameters, in bfloat16, and metadata
  FOLDER/CARD.md         what it was trained on, for how long, on what, and its tau
  FOLDER/SHA256SUMS      '<sha256>  <file>' for every other file (``sha256sum -c`` reads it)

``resolve`` is what a config's ``draft.checkpoint`` / ``feature.checkpoint`` goes through: a
shipped folder is verified (a flipped byte, a missing or an added file is an error naming each)
and its checkpoint directory returned; any other path is returned as it is.
"""

from __future__ import annotations

import hashlib
import os

SHA256SUMS = "SHA256SUMS"
CARD = "CARD.md"
CHECKPOINT = "checkpoint"


def file_digests(folder: str) -> dict[str, str]:
  """sha256 of every file under ``folder`` (but SHA256SUMS), by path relative to it."""
  digests = {}
  for root, dirs, names in os.walk(folder):
    dirs.sort()
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


def write_sums(folder: str) -> None:
  digests = file_digests(folder)
  with open(os.path.join(folder, SHA256SUMS), "w", encoding="utf-8") as f:
    f.writelines(f"{digest}  {name}\n" for name, digest in sorted(digests.items()))


def verify(folder: str) -> None:
  """Raises ``ValueError`` naming each file of a shipped drafter that is missing, added or not
  what SHA256SUMS says (a corrupted or partial copy)."""
  path = os.path.join(folder, SHA256SUMS)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{folder} has no {SHA256SUMS}: not a shipped drafter.")
  expected = {}
  try:
    with open(path, encoding="utf-8") as f:
      lines = f.readlines()
  except UnicodeDecodeError:
    raise ValueError(f"{path} is not a text file of '<sha256>  <file>' lines.") from None
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
    fields = line.split(None, 1)
    if len(fields) != 2 or len(fields[0]) != 64:
      raise ValueError(f"{path}:{number}: expected '<sha256>  <file>', got {line.strip()!r}.")
    expected[fields[1].strip().lstrip("*")] = fields[0].lower()  # '*': sha256sum -b.
  found = file_digests(folder)
  problems = [f"{name}: missing" for name in sorted(set(expected) - set(found))]
  problems += [f"{name}: not in {SHA256SUMS}" for name in sorted(set(found) - set(expected))]
  problems += [
    f"{name}: sha256 {found[name][:12]}..., expected {expected[name][:12]}..."
    for name in sorted(set(found) & set(expected))
    if found[name] != expected[name]
  ]
  if problems:
    raise ValueError(f"The drafter in {folder} is corrupt: " + "; ".join(problems))


def is_shipped(path: str) -> bool:
  return os.path.isfile(os.path.join(path, SHA256SUMS))


def resolve(path: str) -> str:
  """The checkpoint directory to load for a config's checkpoint ``path``: a shipped folder's,
  once ``verify`` passes; any other path unchanged."""
  path = os.path.expanduser(path)
  parent = os.path.dirname(os.path.normpath(path))
  if os.path.basename(os.path.normpath(path)) == CHECKPOINT and is_shipped(parent):
    verify(parent)  # A shipped folder's checkpoint named directly is verified all the same.
    return path
  if not is_shipped(path):
    if os.path.isfile(os.path.join(path, CARD)) and os.path.isdir(os.path.join(path, CHECKPOINT)):
      raise FileNotFoundError(
        f"{path} is a shipped drafter ({CARD}, {CHECKPOINT}/) without its {SHA256SUMS}: the "
        "copy cannot be verified; copy the folder again."
      )
    return path
  verify(path)
  return os.path.join(path, CHECKPOINT)


def packaged(name: str) -> str:
  """The folder of a drafter shipped inside the package (``specsamp/shipped/<name>``)."""
  return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "shipped", name)
