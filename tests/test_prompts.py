"""Prompt sources of the sample job: text, files (plain and JSONL), HumanEval, and errors."""

import json

import numpy as np
import pytest

from specsamp.experiments.jobs import prompts


class _Tokenizer:
  pad_id = 0

  def encode(self, text):
    return [ord(c) % 50 + 1 for c in text]


def test_text_and_files_give_their_prompts(tmp_path):
  assert prompts.texts_of("text:def f(x):\\n  return") == ["def f(x):\n  return"]
  plain = tmp_path / "plain.txt"
  plain.write_text("def a():\n\nclass B:\\n  pass\n")
  assert prompts.texts_of(f"file:{plain}") == ["def a():", "class B:\n  pass"]
  jsonl = tmp_path / "p.jsonl"
  jsonl.write_text("".join(json.dumps({"prompt": p, "id": i}) + "\n" for i, p in enumerate("xyz")))
  assert prompts.texts_of(f"file:{jsonl}") == ["x", "y", "z"]


def test_bad_sources_are_clear_errors(tmp_path):
  with pytest.raises(ValueError, match="prompt_source='books': must be one of"):
    prompts.texts_of("books")
  with pytest.raises(FileNotFoundError, match="No prompt file"):
    prompts.texts_of(f"file:{tmp_path / 'missing.txt'}")
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"text": "x"}\n')
  with pytest.raises(
    ValueError, match="line 1: a JSONL prompt file needs a JSON object with a string 'prompt'"
  ):
    prompts.texts_of(f"file:{bad}")
  with pytest.raises(ValueError, match="empty prompt"):
    prompts.texts_of("text:")


def test_humaneval_has_its_164_prompts():
  texts = prompts.texts_of("humaneval")
  assert len(texts) == 164
  assert texts[0].startswith("from typing import List") and "def has_close_elements" in texts[0]


def test_instructions_are_the_held_out_split_in_regenerations_order(monkeypatch):
  """The prompts tau is measured on: held-out instructions only, in the order a held-out
  regeneration (plan seed 0) answers them (here of four modules' instructions, not the whole
  standard library's, to keep it fast)."""
  import argparse
  import inspect
  import tarfile
  import typing

  from specsamp.training import instructions

  files = [module.__file__ for module in (argparse, inspect, tarfile, typing)]
  every = instructions.stdlib_prompts(files)
  monkeypatch.setattr(instructions, "default_prompts", lambda: every)
  texts = prompts.texts_of("instructions")
  chosen = [p for p in every if instructions.held_out(p.id)]
  order = np.random.default_rng(0).permutation(len(chosen))
  assert texts == [chosen[i].messages[-1]["content"] for i in order]
  assert 0 < len(texts) < len(every) / 10


def test_prompts_are_right_padded_with_their_lengths():
  encoded = prompts.encode(["ab", "abcd", "a"], _Tokenizer())
  assert encoded.tokens.shape == (3, 4) and encoded.lengths.tolist() == [2, 4, 1]
  assert np.all(encoded.tokens[2, 1:] == 0)
  assert encoded.rows()[1] == _Tokenizer().encode("abcd")
