"""The prompt set a target answers to make its drafters' training data (``regenerate``).

EAGLE-3, SpecForge and vLLM's speculators train drafters on the target's own answers to a set of
chat prompts (ShareGPT, UltraChat). Those sets are a download; this one is built from what every
machine has:

- **the Python standard library's functions**, three instructions each: explain what this
  function does (its source), write its docstring (its source without one), and complete it
  (its signature and docstring). Real code of every style, the domain where speculative sampling
  pays most;
- **the repository's own chat prompts** (configs/prompts/chat.txt);
- a user's **JSONL** file instead (``--prompts``): one object per line with ``"prompt"`` (a user
  message) or ``"messages"`` (a list of chat messages).

The default set ships as a snapshot (``SNAPSHOT``: Python 3.11's library, 17,171 prompts), read
on every interpreter, since another Python's library makes another set; ``built_prompts`` builds
it from the running one. HumanEval's prompts are never in it: they are held out for
evaluation. Each prompt has a stable id (its source and kind); ``held_out`` puts about one
function (all three of its instructions) or chat prompt in ``HELD_OUT_EVERY`` aside, by a hash
of the id, so the split does not change when the set grows.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import os
import re
import textwrap
from collections.abc import Iterable, Sequence

from specsamp import files
from specsamp.training import data

KINDS = ("explain", "document", "complete")
HELD_OUT_EVERY = 50
"""About 2% of the prompts (by a hash of their id) are held out of training, for tau."""

# A function's source, in characters: shorter ones say little, longer ones crowd out the answer.
MIN_SOURCE_CHARS, MAX_SOURCE_CHARS = 120, 1600


@dataclasses.dataclass(frozen=True)
class Prompt:
  id: str  # Stable: 'stdlib:json/decoder.py:py_scanstring:69:explain', 'chat:3',
  # 'jsonl:1f0c9e2ab4d7' (a JSONL prompt's content hash: the split survives editing the file).
  messages: tuple[dict[str, str], ...]  # Chat messages, the last one the user's.


def held_out(prompt_id: str) -> bool:
  """Whether a prompt is held out of training (about 1 in ``HELD_OUT_EVERY``, by its id). A
  function's three instructions go together (the hash is of the function, not the kind), so a
  held-out prompt's source is never trained on through its siblings."""
  source, _, kind = prompt_id.rpartition(":")
  digest = hashlib.sha256((source if kind in KINDS else prompt_id).encode()).digest()
  return int.from_bytes(digest[:4], "little") % HELD_OUT_EVERY == 0


def _user(text: str) -> tuple[dict[str, str], ...]:
  return ({"role": "user", "content": text},)


def _functions(path: str) -> Iterable[tuple[str, str, ast.FunctionDef]]:
  """(name, source, node) of each function or method with a docstring in one file."""
  try:
    text = data.read_text(path)
    tree = ast.parse(text)
  except (SyntaxError, ValueError, UnicodeDecodeError):  # A test file of bad syntax, on purpose.
    return
  lines = _source_lines(text)
  for node in ast.walk(tree):
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and ast.get_docstring(node):
      source = _source_segment(lines, node)
      if source and MIN_SOURCE_CHARS <= len(source) <= MAX_SOURCE_CHARS:
        # A method's segment starts at 'def' but keeps its body's indentation.
        yield node.name, textwrap.dedent(" " * node.col_offset + source), node


# The file's lines as the parser counts them (only \r\n, \r and \n end a line), ends kept.
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def _source_lines(text: str) -> list[str]:
  return _LINE.findall(text)


def _source_segment(lines: list[str], node: ast.AST) -> str:
  """``ast.get_source_segment(text, node)`` from the file's lines split once: the standard
  library's splits the whole file again for every node, which made building the default
  prompts take minutes (quadratic in a file's size)."""
  first, last = node.lineno - 1, node.end_lineno - 1
  start, end = node.col_offset, node.end_col_offset  # Offsets in UTF-8 bytes, as the parser's.
  if first == last:
    return lines[first].encode()[start:end].decode()
  head = lines[first].encode()[start:].decode()
  tail = lines[last].encode()[:end].decode()
  return "".join([head, *lines[first + 1 : last], tail])


def _without_docstring(source: str, node: ast.FunctionDef) -> str:
  """The function's source with its docstring's lines cut."""
  lines = source.splitlines()
  doc = node.body[0]
  first, last = doc.lineno - node.lineno, doc.end_lineno - node.lineno
  kept = lines[:first] + lines[last + 1 :]
  if len(kept) <= first:  # The docstring was the whole body.
    kept.append(" " * (doc.col_offset - node.col_offset) + "pass")
  return "\n".join(kept)


def _signature_and_docstring(source: str, node: ast.FunctionDef) -> str:
  """The function's lines up to the end of its docstring."""
  return "\n".join(source.splitlines()[: node.body[0].end_lineno - node.lineno + 1])


def _code(source: str) -> str:
  return f"```python\n{source}\n```"


def stdlib_prompts(files: Sequence[str] | None = None) -> list[Prompt]:
  """Three instructions for each documented function of the standard library (module
  docstring), in a stable order."""
  prompts = []
  root = os.path.dirname(os.__file__)
  for path in sorted(files if files is not None else data.stdlib_files()):
    name = os.path.relpath(path, root)
    for function, source, node in _functions(path):
      stem = f"stdlib:{name}:{function}:{node.lineno}"
      prompts += [
        Prompt(
          f"{stem}:explain", _user(f"Explain what this Python function does.\n\n{_code(source)}")
        ),
        Prompt(
          f"{stem}:document",
          _user(
            "Write a docstring for this Python function.\n\n"
            + _code(_without_docstring(source, node))
          ),
        ),
        Prompt(
          f"{stem}:complete",
          _user(
            "Complete this Python function.\n\n" + _code(_signature_and_docstring(source, node))
          ),
        ),
      ]
  return prompts


def chat_prompts(path: str) -> list[Prompt]:
  """One prompt per non-empty line of a text file (configs/prompts/chat.txt)."""
  with open(path, encoding="utf-8") as f:
    lines = [line.strip() for line in f if line.strip()]
  return [Prompt(f"chat:{i}", _user(line)) for i, line in enumerate(lines)]


def jsonl_prompts(path: str) -> list[Prompt]:
  """A user's prompts: one JSON object per line, ``{"prompt": str}`` or ``{"messages": [...]}``
  (chat messages with string ``role`` and ``content``, the last one the user's). A prompt's id
  is a hash of its messages, so the held-out split does not move when lines are added, removed
  or reordered; a line that repeats an earlier prompt is left out (answered once)."""
  if not os.path.exists(path) or os.path.isdir(path):  # A named pipe (<(...)) is a file here.
    raise FileNotFoundError(f"--prompts: no file {path}" + (" (a directory)" * os.path.isdir(path)))
  prompts, seen = [], set()
  with open(path, "rb") as f:
    for number, raw in enumerate(f, 1):
      try:
        line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
      except UnicodeDecodeError as e:
        raise ValueError(
          f"{path}:{number}: not UTF-8 text ({e.reason} at byte {e.start})."
        ) from None
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{number}: not JSON ({e.msg}).") from None
      if isinstance(record, dict) and isinstance(record.get("prompt"), str):
        messages = _user(record["prompt"])
      elif isinstance(record, dict) and isinstance(record.get("messages"), list):
        messages = tuple(record["messages"])
        if not messages or not all(
          isinstance(m, dict) and {"role", "content"} <= set(m) for m in messages
        ):
          raise ValueError(f"{path}:{number}: each message needs a 'role' and a 'content'.")
        if not all(isinstance(m["role"], str) and isinstance(m["content"], str) for m in messages):
          raise ValueError(
            f"{path}:{number}: a message's 'role' and 'content' must be strings (content parts "
            "such as [{'type': 'text', ...}] are not read: join their text)."
          )
        if messages[-1]["role"] != "user":
          raise ValueError(f"{path}:{number}: the last message must be the user's.")
      else:
        raise ValueError(f"{path}:{number}: expected {{'prompt': ...}} or {{'messages': [...]}}.")
      content = json.dumps([[m["role"], m["content"]] for m in messages], ensure_ascii=False)
      digest = hashlib.sha256(content.encode()).hexdigest()[:12]
      if digest not in seen:
        seen.add(digest)
        prompts.append(Prompt(f"jsonl:{digest}", messages))
  if not prompts:
    raise ValueError(f"--prompts: {path} holds no prompt.")
  return prompts


# The default set as Python 3.11's standard library makes it, shipped: another Python's library
# has other functions at other lines (3.12's gives 16,670 prompts, 16,959 ids differ from
# 3.11's 17,171), so a set built from the running interpreter would not continue the shipped
# answers, whose manifests name the set by its sha256 (``regenerate``).
SNAPSHOT = os.path.join(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "shipped", "prompts.jsonl.xz"
)


def built_prompts(files: Sequence[str] | None = None) -> list[Prompt]:
  """The standard library's instructions (or ``files``') and the repository's chat prompts,
  built from the running interpreter's library (``SNAPSHOT`` is this on Python 3.11)."""
  here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  chat_file = os.path.join(here, "configs", "prompts", "chat.txt")
  chat = chat_prompts(chat_file) if os.path.exists(chat_file) else []
  return stdlib_prompts(files) + chat


def write_snapshot(prompts: Sequence[Prompt], path: str = SNAPSHOT) -> None:
  """``prompts`` as xz-compressed JSON lines (id and messages), written atomically."""
  import lzma

  def write(partial: str) -> None:
    with lzma.open(partial, "wt", encoding="utf-8", preset=9) as f:
      for prompt in prompts:
        f.write(json.dumps({"id": prompt.id, "messages": list(prompt.messages)}) + "\n")

  files.write_atomically(path, write)


def read_snapshot(path: str = SNAPSHOT) -> list[Prompt]:
  import lzma

  try:
    with lzma.open(path, "rt", encoding="utf-8") as f:
      records = [json.loads(line) for line in f]
  except (OSError, EOFError, lzma.LZMAError, json.JSONDecodeError) as e:
    raise ValueError(
      f"{path}, the shipped prompt set, is damaged ({e}); restore it (git checkout)."
    ) from None
  return [Prompt(r["id"], tuple(r["messages"])) for r in records]


def default_prompts(files: Sequence[str] | None = None) -> list[Prompt]:
  """The prompt set: the shipped snapshot of Python 3.11's (``SNAPSHOT``), the same on every
  interpreter; with ``files``, those files' instructions and the chat prompts, built here."""
  if files is None and os.path.exists(SNAPSHOT):
    return read_snapshot()
  return built_prompts(files)
