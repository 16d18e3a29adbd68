"""The Python blocks of the README and docs/*.md: each is run by tests/test_docs.py, or marked
as a fragment by an HTML comment ``<!-- fragment: why -->`` just above its fence."""

from __future__ import annotations

import dataclasses
import functools
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = (
  "README.md",
  *sorted(
    f"docs/{name}" for name in os.listdir(os.path.join(ROOT, "docs")) if name.endswith(".md")
  ),
)


@dataclasses.dataclass(frozen=True)
class Block:
  page: str
  line: int  # 1-based line of the opening fence.
  code: str
  fragment: str | None  # Why it is not run, or None.


def python_blocks(page: str) -> list[Block]:
  with open(os.path.join(ROOT, page), encoding="utf-8") as f:
    lines = f.read().splitlines()
  blocks, i = [], 0
  while i < len(lines):
    if lines[i].strip() in ("```python", "```py"):
      start = i
      end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
      above = "\n".join(lines[max(0, start - 4) : start])
      marker = re.search(r"<!--\s*fragment:?\s*(.*?)-->\s*$", above, re.S)
      blocks.append(
        Block(
          page,
          start + 1,
          "\n".join(lines[start + 1 : end]),
          " ".join(marker.group(1).split()) if marker else None,
        )
      )
      i = end
    i += 1
  return blocks


@functools.cache
def run_page(page: str) -> dict:
  """Runs the page's non-fragment blocks in order in one namespace (from the repository root)
  and returns it; once per test session."""
  namespace: dict = {"__name__": f"doc:{page}"}
  cwd = os.getcwd()
  os.chdir(ROOT)
  try:
    for block in python_blocks(page):
      if block.fragment is None:
        exec(compile(block.code, f"{page}:{block.line}", "exec"), namespace)
  finally:
    os.chdir(cwd)
  return namespace
