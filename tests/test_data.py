"""Corpus splits by file, step-addressed batches, held-out prompts."""

import os

import numpy as np
import pytest

from specsamp.training import data


def test_stdlib_corpus_has_no_test_suites():
  files = data.stdlib_files()
  assert len(files) > 100 and all(f.endswith(".py") for f in files)
  assert not any(f"{os.sep}test{os.sep}" in f or f"{os.sep}tests{os.sep}" in f for f in files)


def test_split_is_deterministic_disjoint_and_stable(tmp_path):
  for i in range(200):
    (tmp_path / f"m{i}.py").write_text(f"x = {i}\n")
  files = data.corpus_files(str(tmp_path / "*.py"))
  first = data.split_files(files, 0.1, 0.1, seed=0)
  assert first == data.split_files(list(reversed(files)), 0.1, 0.1, seed=0) or sorted(
    first.train
  ) == sorted(data.split_files(list(reversed(files)), 0.1, 0.1, seed=0).train)
  parts = [set(first.train), set(first.validation), set(first.prompts)]
  assert sum(map(len, parts)) == len(files) and len(set.union(*parts)) == len(files)
  assert 5 < len(first.prompts) < 40 and 5 < len(first.validation) < 40
  # A new file never moves an old one to another split.
  (tmp_path / "new.py").write_text("y = 1\n")
  second = data.split_files(data.corpus_files(str(tmp_path / "*.py")), 0.1, 0.1, seed=0)
  assert set(first.prompts) <= set(second.prompts) and set(first.train) <= set(second.train)


def test_bad_corpus_and_fractions(tmp_path):
  with pytest.raises(FileNotFoundError, match="No files"):
    data.corpus_files("/nonexistent/**/*.py")
  with pytest.raises(ValueError, match="is a directory: give a glob of its files, e.g. '.*/"):
    data.corpus_files(str(tmp_path))
  # A file too short for three splits even by parts: say what to change.
  small = tmp_path / "small.txt"
  small.write_text("a line\n" * 100)
  with pytest.raises(ValueError, match=r"1 files of 2 parts .*--config.data.validation_fraction"):
    data.split_files([str(small)], 0.04, 0.04)
  with pytest.raises(ValueError, match="validation_fraction"):
    data.split_files(["a", "b", "c"], 0.0, 0.5)


class _WordTokenizer:
  def encode(self, text, add_eos=False):
    return [len(word) + 4 for word in text.split()] + ([3] if add_eos else [])


def test_a_corpus_of_one_file_is_split_by_parts_of_whole_lines(tmp_path):
  """One book or one log (a user's --corpus=book.txt) was refused as "1 files, too few"; it is
  split by parts of whole lines now: disjoint, covering every line once, deterministic, with
  an EOS only where the file ends. A corpus of enough files splits by files as before."""
  book = tmp_path / "book.txt"
  book.write_text("".join(f"line {i} " + "word " * (i % 7) + "\n" for i in range(30_000)))
  split = data.split_files(data.corpus_files(str(book)), 0.04, 0.04, seed=0)
  assert split.unit == "parts" and split == data.split_files([str(book)], 0.04, 0.04, seed=0)
  units = split.train + split.validation + split.prompts
  assert len(units) == 400 and len(set(units)) == 400  # 75 lines each.
  assert (len(split.validation), len(split.prompts)) == (16, 16)
  order = sorted(units, key=lambda u: int(u.split("#lines=")[1].split("-")[0]))
  assert "".join(data.read_text(u) for u in order) == book.read_text()  # Every line once.
  assert data.split_files([str(book)], 0.04, 0.04, seed=1) != split  # Seeded.
  # EOS once, at the file's end, whichever parts the stream holds.
  last = order[-1]
  stream = data.token_stream(_WordTokenizer(), [order[0], last, order[1]], 10**6)
  assert np.count_nonzero(stream == 3) == 1
  assert data.ends_a_file(last) and not data.ends_a_file(order[0])
  # Held-out prompts come from the prompt parts only.
  prompts = data.held_out_prompts(_WordTokenizer(), split.prompts, 4, 20)
  assert prompts.shape == (4, 20)
  # Parts of several files: a file named like a part is still read whole.
  other = tmp_path / "x.txt#lines=0-5"
  other.write_text("whole\n" * 10)
  assert data.read_text(str(other)) == "whole\n" * 10
  two = data.split_files([str(book), str(other)], 0.04, 0.04, seed=0)
  assert two.unit == "parts" and any(u.startswith(str(other)) for u in two.train)


def test_batches_are_a_pure_function_of_the_step_and_cover_each_epoch():
  stream = np.arange(10 * 9, dtype=np.int32)
  batches = data.Batches.pack(stream, seq_len=8, batch_size=2, seed=3)
  assert batches.sequences.shape == (10, 9) and batches.steps_per_epoch == 5
  np.testing.assert_array_equal(batches.at(7), data.Batches.pack(stream, 8, 2, seed=3).at(7))
  epoch = np.concatenate([batches.at(s) for s in range(5)])
  assert sorted(epoch[:, 0].tolist()) == sorted(batches.sequences[:, 0].tolist())
  assert not np.array_equal(batches.at(0), batches.at(5))  # a new permutation per epoch
  with pytest.raises(ValueError, match="fewer than one batch"):
    data.Batches.pack(stream[:20], seq_len=8, batch_size=4)


class _CharTokenizer:
  def encode(self, text, add_eos=False):
    return [ord(c) % 250 + 4 for c in text] + ([3] if add_eos else [])


def test_held_out_prompts_come_from_the_prompt_files(tmp_path):
  paths = []
  for i in range(3):
    path = tmp_path / f"p{i}.py"
    path.write_text("".join(f"line_{i}_{j} = {j}\n" for j in range(30)))
    paths.append(str(path))
  prompts = data.held_out_prompts(_CharTokenizer(), paths, num_prompts=5, prompt_tokens=12)
  assert prompts.shape == (5, 12)
  text = "".join(p.read_text() for p in tmp_path.iterdir())
  codes = [ord(c) % 250 + 4 for c in text]
  joined = ",".join(map(str, codes))
  for row in prompts:
    assert ",".join(map(str, row)) in joined
  longest = max(len(p.read_text()) for p in tmp_path.iterdir())  # One token per character.
  with pytest.raises(ValueError, match=f"fewer than 2 windows.*can be at most {longest}"):
    data.held_out_prompts(_CharTokenizer(), paths, num_prompts=2, prompt_tokens=10_000)


def test_spread_evaluation_batches_are_whole_and_span_the_file():
  """A partial last batch cannot be split over a mesh's data axis (a run on 4 devices failed at
  its first evaluation): spread gives whole batches only, evenly over the file."""
  batches = data.Batches(np.arange(11 * 3, dtype=np.int32).reshape(11, 3), batch_size=4)
  spread = batches.spread(100)
  assert [len(b) for b in spread] == [4, 4]
  assert spread[0][0, 0] == 0 and spread[-1][-1, 0] == 10 * 3  # first and last rows
  assert [len(b) for b in batches.spread(1)] == [4]


def test_a_corpus_file_is_utf8_text_or_refused_by_name(tmp_path):
  """Binary files and other encodings were read with U+FFFD for what did not decode, and trained
  on without a word (a corpus of .pyc files trained a tokenizer on their bytes; the review of
  2026-11-30); a byte-order mark is dropped and line ends read as universal newlines, as the
  text mode that read them before did."""
  (tmp_path / "latin1.txt").write_bytes("caf\u00e9\n".encode("latin-1"))
  with pytest.raises(ValueError, match=r"latin1.txt is not UTF-8 text \(byte 3: b'\\xe9\\n'\)"):
    data.read_text(str(tmp_path / "latin1.txt"))
  (tmp_path / "m.pyc").write_bytes(b"\xa7\r\r\n\x00\x00\x00\x00code")
  with pytest.raises(ValueError, match="m.pyc holds NUL bytes: a binary file"):
    data.read_text(str(tmp_path / "m.pyc"))
  (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbfdef f():\r\n  pass\r")
  assert data.read_text(str(tmp_path / "bom.txt")) == "def f():\n  pass\n"


def test_a_long_line_is_cut_into_chunks_sentencepiece_keeps(tmp_path):
  """SentencePiece drops a sentence past 64 KiB without a word: a corpus of one-line files
  (minified JSON or JS) trained a tokenizer on nothing ("holds no text ... (empty files?)")."""
  (tmp_path / "min.json").write_text("\u00e9" * 50_000, encoding="utf-8")  # 100,000 bytes.
  chunks = list(data.text_chunks([str(tmp_path / "min.json")], max_chars=10**6))
  assert "".join(chunks) == "\u00e9" * 50_000
  assert max(len(c.encode()) for c in chunks) <= 1 << 15
