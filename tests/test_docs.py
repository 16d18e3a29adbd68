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
@pytest.mark.parametrize("page", sorted(set(RUN)))
def test_page_runs_as_written(page, capsys):
  namespace = docs_blocks.run_page(page)
  if page == "README.md":
    assert namespace["spec"].tokens.shape == (2, 4 + 32)
  if page == "docs/bring_your_own_model.md":
    assert namespace["out"].tokens.shape == (2, 4 + 16)
    assert "tokens_per_target_call" in namespace["out"].summary()
