"""Corpus -> train / validation / held-out prompt splits -> packed, reproducibly shuffled batches.

The default corpus is the Python standard library source of the running
interpreter (tests excluded): every machine has it, and code is the domain
where speculative sampling shone in the paper. ``--corpus=GLOB`` (a glob, or
several separated by commas) takes the user's own text files instead.

Files, not lines, are split, by a hash of their path relative to the corpus
root: a held-out prompt never comes from a file seen in training, and the
split of a file does not change when other files are added. A corpus of too few
files for that (one book, one log) is split by parts instead: each file cut into
parts of whole lines (``path#lines=a-b``, read by ``read_text``), the parts ranked
by a hash, the first for validation, the next for prompts, the rest for training. Training batches
are a pure function of the step (``Batches.at(step)``), so a resumed run sees
exactly the batches the uninterrupted run would have seen.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import hashlib
import os
import re
import sysconfig
from collections.abc import Iterator, Sequence

import numpy as np

_EXCLUDED_DIRS = ("test", "tests", "idle_test", "site-packages", "__pycache__")


def stdlib_files() -> list[str]:
  """The ``*.py`` files of this interpreter's standard library, without test suites."""
  root = sysconfig.get_paths()["stdlib"]
  files = []
  for directory, subdirs, names in os.walk(root):
    subdirs[:] = sorted(d for d in subdirs if d not in _EXCLUDED_DIRS)
    files += [os.path.join(directory, n) for n in sorted(names) if n.endswith(".py")]
  return files


def corpus_files(corpus: str | None) -> list[str]:
  """The files of ``corpus``: None or '' for the standard library, else comma-separated globs."""
  if not corpus:
    files = stdlib_files()
    where = "the Python standard library at " + sysconfig.get_paths()["stdlib"]
  else:
    folders = [p for p in corpus.split(",") if p and os.path.isdir(os.path.expanduser(p))]
    if folders:  # Said "No files in --corpus=...", of a folder that holds files.
      raise ValueError(
        f"--corpus={folders[0]!r} is a directory: give a glob of its files, e.g. "
        f"'{folders[0].rstrip('/')}/**/*.txt' (comma-separated globs for several)."
      )
    files = sorted(
      {
        f
        for pattern in corpus.split(",")
        if pattern
        for f in glob.glob(os.path.expanduser(pattern), recursive=True)
        if os.path.isfile(f)
      }
    )
    where = f"--corpus={corpus!r}"
  if not files:
    raise FileNotFoundError(f"No files in {where}.")
  return files


@dataclasses.dataclass(frozen=True)
class Split:
  """Files of each split."""

  train: tuple[str, ...]
  validation: tuple[str, ...]
  prompts: tuple[str, ...]
  unit: str = "files"  # "parts": a corpus of few files, split by parts of them (split_parts).


def split_files(
  files: Sequence[str], validation_fraction: float, prompt_fraction: float, seed: int = 0
) -> Split:
  """Deterministic split by a hash of each file's path below the files' common root; by parts
  of files (``split_parts``) when whole files leave a split empty."""
  if not (
    0 < validation_fraction and 0 < prompt_fraction and validation_fraction + prompt_fraction < 1
  ):
    raise ValueError("Need 0 < validation_fraction, 0 < prompt_fraction and their sum < 1.")
  parts: dict[str, list[str]] = {"train": [], "validation": [], "prompts": []}
  for f, relative in zip(files, _relative_names(files)):
    u = _hash_unit(seed, relative)
    name = (
      "validation"
      if u < validation_fraction
      else "prompts"
      if u < validation_fraction + prompt_fraction
      else "train"
    )
    parts[name].append(f)
  if all(parts.values()):
    return Split(**{name: tuple(chosen) for name, chosen in parts.items()})
  return split_parts(files, validation_fraction, prompt_fraction, seed)


def _relative_names(files: Sequence[str]) -> list[str]:
  """Each file's path below the files' common root (its name alone for one file): what the
  split hashes, so it does not depend on where the corpus sits."""
  root = os.path.commonpath([os.path.abspath(f) for f in files]) if len(files) > 1 else ""
  return [os.path.relpath(os.path.abspath(f), root) if root else os.path.basename(f) for f in files]


def _hash_unit(seed: int, name: str) -> float:
  """A uniform number in [0, 1) from a seed and a name."""
  digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
  return int.from_bytes(digest[:8], "little") / 2.0**64


# A corpus split by parts: each part at least this many lines (a held-out prompt is a window
# inside one part), and each file cut into about ``PARTS_PER_FILE`` parts when it is long enough.
MIN_PART_LINES = 64
PARTS_PER_FILE = 400
_PART = re.compile(r"^(?P<path>.*)#lines=(?P<start>\d+)-(?P<end>\d+)$")


def part_name(path: str, start: int, end: int) -> str:
  """The name of lines [start, end) of ``path`` as a corpus unit (``read_text`` reads it)."""
  return f"{path}#lines={start}-{end}"


def split_parts(
  files: Sequence[str], validation_fraction: float, prompt_fraction: float, seed: int = 0
) -> Split:
  """Each file cut into parts of whole lines (``MIN_PART_LINES`` or more, about
  ``PARTS_PER_FILE`` per long file), ranked by a hash of (file name, part number): the first
  ``validation_fraction`` of them (at least one) hold out the validation loss, the next
  ``prompt_fraction`` (at least one) the prompts, the rest train. A held-out prompt never
  comes from a part trained on, though its neighbours in the same file are."""
  units = []
  for path, name in zip(files, _relative_names(files)):
    count = len(_file_lines(path))
    size = max(MIN_PART_LINES, -(-count // PARTS_PER_FILE))
    for start in range(0, count, size):
      end = min(start + size, count)
      units.append((_hash_unit(seed, f"{name}#{start // size}"), part_name(path, start, end)))
  validation = max(1, round(validation_fraction * len(units)))
  prompts = max(1, round(prompt_fraction * len(units)))
  if len(units) < validation + prompts + 1:
    raise ValueError(
      f"The corpus has {len(files)} files of {len(units)} parts of {MIN_PART_LINES} lines or "
      "more, too few for non-empty training, validation and prompt splits (a corpus of few "
      "files is split by parts of whole lines, about "
      f"{validation_fraction:.0%} for validation and {prompt_fraction:.0%} for prompts: "
      "--config.data.validation_fraction, --config.data.prompt_fraction). Give more text."
    )
  ranked = [unit for _, unit in sorted(units)]
  return Split(
    train=tuple(sorted(ranked[validation + prompts :], key=_part_order)),
    validation=tuple(sorted(ranked[:validation], key=_part_order)),
    prompts=tuple(sorted(ranked[validation : validation + prompts], key=_part_order)),
    unit="parts",
  )


def _part_order(unit: str) -> tuple[str, int]:
  part = _part(unit)
  return (part[0], part[1]) if part else (unit, 0)


def read_text(path: str) -> str:
  """A corpus file's text, or a part of one (``part_name``): UTF-8 (a leading byte-order mark
  dropped). A binary file or one in another encoding is refused by name: both were read with
  U+FFFD in place of what did not decode, and trained on without a word (the review of
  2026-11-30: a corpus of .pyc files trained a tokenizer on their bytes; Latin-1 text lost
  every accented letter)."""
  part = _part(path)
  if part:
    return "".join(_file_lines(part[0])[part[1] : part[2]])
  return _file_text(path)


def _part(unit: str) -> tuple[str, int, int] | None:
  """(path, start, end) of a part's name, None for a file."""
  match = _PART.match(unit) if not os.path.exists(unit) else None
  return (match["path"], int(match["start"]), int(match["end"])) if match else None


def ends_a_file(unit: str) -> bool:
  """Whether a corpus unit's text ends where its file's does (a file, or a file's last part):
  the token stream puts an EOS there and nowhere else."""
  part = _part(unit)
  return part is None or part[2] >= len(_file_lines(part[0]))


def _file_text(path: str) -> str:
  stat = os.stat(path)
  return _decoded(path, stat.st_mtime_ns, stat.st_size)


def _file_lines(path: str) -> list[str]:
  stat = os.stat(path)
  return _lines(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=1)
def _lines(path: str, mtime_ns: int, size: int) -> list[str]:
  return _decoded(path, mtime_ns, size).splitlines(keepends=True)


@functools.lru_cache(maxsize=1)  # The parts of one file are read one after another.
def _decoded(path: str, mtime_ns: int, size: int) -> str:
  """``path``'s text, read once for each (modification time, size) it has."""
  with open(path, "rb") as f:
    raw = f.read()
  if b"\x00" in raw:
    raise ValueError(
      f"{path} holds NUL bytes: a binary file, not text. Leave it out of --corpus "
      "(e.g. match '*.py', not '*')."
    )
  try:
    return raw.decode("utf-8-sig").replace("\r\n", "\n").replace("\r", "\n")
  except UnicodeDecodeError as error:
    raise ValueError(
      f"{path} is not UTF-8 text (byte {error.start}: {raw[error.start : error.start + 4]!r}); "
      "a corpus is read as UTF-8: convert the file (e.g. iconv -f latin1 -t utf-8) or leave it "
      "out of --corpus."
    ) from None


def shuffled(files: Sequence[str], seed: int) -> list[str]:
  order = np.random.default_rng(seed).permutation(len(files))
  return [files[i] for i in order]


# SentencePiece drops every sentence longer than its max_sentence_length (bytes; the tokenizer
# sets 64 KiB) without a word: a corpus of one-line files (minified JSON or JS) trained on
# nothing. A chunk is cut to this many characters (4 UTF-8 bytes at most each: half the limit).
MAX_CHUNK_CHARS = (1 << 16) // 8


def text_chunks(files: Sequence[str], max_chars: int, lines_per_chunk: int = 8) -> Iterator[str]:
  """Chunks of a few lines (for tokenizer training), each at most ``MAX_CHUNK_CHARS``, up to
  ``max_chars`` in all."""
  total = 0
  for path in files:
    lines = read_text(path).splitlines(keepends=True)
    for start in range(0, len(lines), lines_per_chunk):
      chunk = "".join(lines[start : start + lines_per_chunk])
      for cut in range(0, len(chunk), MAX_CHUNK_CHARS):
        yield chunk[cut : cut + MAX_CHUNK_CHARS]
      total += len(chunk)
      if total >= max_chars:
        return


def token_stream(tokenizer, files: Sequence[str], max_tokens: int) -> np.ndarray:
  """Files (or parts) encoded one after another, each file ended by EOS, up to ``max_tokens``
  ids."""
  pieces, total = [], 0
  for path in files:
    ids = tokenizer.encode(read_text(path), add_eos=ends_a_file(path))
    pieces.append(np.asarray(ids, np.int32))
    total += len(ids)
    if total >= max_tokens:
      break
  return np.concatenate(pieces)[:max_tokens]


@dataclasses.dataclass(frozen=True)
class Batches:
  """Packed sequences of ``seq_len + 1`` tokens (inputs and shifted targets), batched.

  Every epoch visits the sequences in a fresh permutation seeded by (seed,
  epoch); ``at(step)`` is a pure function of the step. With ``weights`` (each token's weight
  as a label: regenerated answers weigh 1, their prompts 0, ``answers.py``), a batch is the
  pair (tokens, weights); with ``stored`` too (the target's outputs on each row,
  ``target_store``), the triple (tokens, weights, stored).
  """

  sequences: np.ndarray  # [num_sequences, seq_len + 1] int32
  batch_size: int
  seed: int = 0
  weights: np.ndarray | None = None  # [num_sequences, seq_len + 1] float32, or None (all 1)
  stored: np.ndarray | None = None  # [num_sequences, seq_len + 1, F]: needs weights

  def __post_init__(self):
    if self.stored is not None and (
      self.weights is None or self.stored.shape[:2] != self.sequences.shape
    ):
      raise ValueError(
        f"Stored target outputs {getattr(self.stored, 'shape', None)} need weights and one "
        f"entry per token of the {self.sequences.shape} rows."
      )

  def _rows(self, rows):
    if self.weights is None:
      return self.sequences[rows]
    if self.stored is None:
      return self.sequences[rows], self.weights[rows]
    if isinstance(rows, np.ndarray):  # A memory map reads sorted rows fastest.
      order = np.argsort(rows, kind="stable")
      stored = np.empty((len(rows), *self.stored.shape[1:]), self.stored.dtype)
      stored[order] = self.stored[rows[order]]
    else:
      stored = np.asarray(self.stored[rows])
    return self.sequences[rows], self.weights[rows], stored

  @classmethod
  def pack(cls, stream: np.ndarray, seq_len: int, batch_size: int, seed: int = 0) -> Batches:
    num = len(stream) // (seq_len + 1)
    if num < batch_size:
      raise ValueError(
        f"{len(stream)} tokens make {num} sequences of {seq_len + 1}, fewer than "
        f"one batch of {batch_size}; use more text or shorter sequences."
      )
    return cls(stream[: num * (seq_len + 1)].reshape(num, seq_len + 1), batch_size, seed)

  @property
  def steps_per_epoch(self) -> int:
    return len(self.sequences) // self.batch_size

  def at(self, step: int) -> np.ndarray:
    epoch, index = divmod(step, self.steps_per_epoch)
    order = np.random.default_rng((self.seed, epoch)).permutation(len(self.sequences))
    return self._rows(order[index * self.batch_size : (index + 1) * self.batch_size])

  def spread(self, num_batches: int) -> list:
    """``num_batches`` whole batches of rows evenly spaced over the file (as many as it holds,
    when it holds fewer): a fixed evaluation set that samples the whole file, as ``first``
    does not when the file is ordered (regenerated answers are sorted by prompt length)."""
    # Whole batches only: a partial one cannot be split over a data axis (a mesh's devices).
    whole = self.steps_per_epoch * self.batch_size
    rows = min(num_batches * self.batch_size, whole)
    index = np.linspace(0, len(self.sequences) - 1, rows).round().astype(np.int64)
    return [self._rows(index[i : i + self.batch_size]) for i in range(0, rows, self.batch_size)]

  def first(self, num_batches: int) -> list[np.ndarray]:
    """The first ``num_batches`` batches in file order (a fixed evaluation set)."""
    num_batches = min(num_batches, self.steps_per_epoch)
    return [
      self._rows(slice(i * self.batch_size, (i + 1) * self.batch_size)) for i in range(num_batches)
    ]


def held_out_prompts(
  tokenizer, files: Sequence[str], num_prompts: int, prompt_tokens: int, seed: int = 0
) -> np.ndarray:
  """``[num_prompts, prompt_tokens]`` ids: windows starting at a line start of held-out files.

  Each prompt comes from a different file when there are enough files; the
  window start is a random line among those leaving ``prompt_tokens`` tokens.
  """
  rng = np.random.default_rng(seed)
  prompts = []
  file_tokens: dict[str, int] = {}  # Tokens of each whole file read.
  for path in shuffled(files, seed) * num_prompts:
    lines = read_text(path).splitlines(keepends=True)
    starts = [i for i in range(len(lines)) if lines[i].strip()]
    if not starts:
      continue
    start = starts[rng.integers(len(starts))]
    ids = tokenizer.encode("".join(lines[start:]))
    if len(ids) < prompt_tokens:
      ids = tokenizer.encode("".join(lines))
      file_tokens[path] = len(ids)
      if len(ids) < prompt_tokens:
        continue
    prompts.append(ids[:prompt_tokens])
    if len(prompts) == num_prompts:
      return np.asarray(prompts, np.int32)
  longest = max(file_tokens.values(), default=0)
  raise ValueError(
    f"The {len(files)} prompt files hold fewer than {num_prompts} windows of {prompt_tokens} "
    f"tokens (--config.sampling.prompt_tokens): the longest holds {longest} tokens, so "
    f"prompt_tokens can be at most {longest}; or lower --config.sampling.num_prompts."
  )
