"""Config files are loaded by path (as ml_collections' --config flag does), not imported
from a package; a config that builds on another loads it with ``sibling``."""

from __future__ import annotations

import importlib.util
import os
import re
from types import ModuleType


def load_module(path: str) -> ModuleType:
  """The Python module at ``path``, executed afresh."""
  name = "specsamp_config_" + os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def sibling(config_file: str, name: str) -> ModuleType:
  """configs/<name>.py, next to ``config_file`` (pass ``__file__``)."""
  return load_module(os.path.join(os.path.dirname(os.path.abspath(config_file)), f"{name}.py"))


_FIELD = re.compile(r"^\s*\w+((?:\.\w+)+)\s*=\s*[^#]*?(?:#\s*(.*))?$")


def field_comments(path: str) -> dict[str, str]:
  """Each field's comment in a config file, by its last name (``top_p``) and by its path after
  ``config.`` (``sampling.top_p``): the comment at the end of its assignment, or the comment
  lines just above it."""
  comments: dict[str, str] = {}
  above: list[str] = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      stripped = line.strip()
      if stripped.startswith("#"):
        above.append(stripped.lstrip("# "))
        continue
      match = _FIELD.match(line)
      if match:
        text = match.group(2) or " ".join(above)
        dotted = match.group(1).lstrip(".")
        if text:
          for name in (dotted, dotted.rsplit(".", 1)[-1]):
            comments.setdefault(name, text)
      above = []
  return comments


def describe(path: str) -> str:
  """Every leaf field of the config at ``path`` (its ``get_config()``), its default and its
  comment: what ``--help`` shows under ``--config``."""
  config = load_module(path).get_config()
  comments = field_comments(path)
  lines = []

  def walk(node, prefix):
    for name, value in node.items():
      dotted = f"{prefix}{name}"
      if hasattr(value, "items"):
        walk(value, dotted + ".")
        continue
      comment = comments.get(dotted) or comments.get(name, "")
      lines.append(f"--config.{dotted}={value!r}" + (f"  {comment}" if comment else ""))

  walk(config, "")
  return "\n".join(lines)
