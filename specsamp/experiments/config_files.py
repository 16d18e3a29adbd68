"""Config files are loaded by path (as ml_collections' --config flag does), not imported
from a package; a config that builds on another loads it with ``sibling``."""

from __future__ import annotations

import importlib.util
import os
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
