"""SentencePiece tokenizer: train one on a corpus, load any ``.model`` file, encode and decode.

The samplers only see token ids; what matters for speculative sampling is that
the draft and the target read and write the SAME ids, so a tokenizer carries a
fingerprint (a hash of its serialized model) and ``check_same`` refuses a pair
whose tokenizers differ.

Trained tokenizers are set up for source code: identity normalisation, no
dummy prefix, whitespace kept (runs of spaces become pieces, so indentation is
cheap), "\\n" as its own piece, digits split, and byte fallback so any text
round-trips exactly: ``decode(encode(text)) == text``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import sentencepiece as spm

from specsamp.files import read_json, write_atomically

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
MODEL_TYPES = ("bpe", "unigram")  # What Tokenizer.train trains; text round-trips exactly.


def _training_failure(message: str, vocab_size: int) -> str:
  """SentencePiece's training error in the terms of specsamp's flags (its own names an option
  specsamp does not expose)."""
  chars = re.search(r"smaller than required_chars\. \d+ vs (\d+)", message)
  bound = re.search(r"value <= (\d+)", message)
  if "sentences_.empty()" in message:
    return (
      "The corpus holds no text to train a tokenizer on (empty files?); point "
      "--config.data.corpus at text files."
    )
  if chars:
    return (
      f"The corpus's characters need {chars.group(1)} pieces (with the special and byte "
      f"pieces), more than vocab_size={vocab_size} (binary files read as text?): raise "
      "--config.tokenizer.vocab_size or point --config.data.corpus at text."
    )
  if "Vocabulary size too high" in message:
    return (
      f"The corpus is too small for a tokenizer of vocab_size={vocab_size}"
      + (f" (it supports at most {bound.group(1)})" if bound else "")
      + ": lower --config.tokenizer.vocab_size or give more text (--config.data.corpus)."
    )
  return f"SentencePiece training failed: {message}"


class Tokenizer:
  """A SentencePiece model with BOS/EOS handling and a fingerprint."""

  def __init__(
    self,
    model_proto: bytes,
    path: str | None = None,
    add_bos: bool = False,
    stop_ids: Sequence[int] = (),
  ):
    self._processor = spm.SentencePieceProcessor()
    try:
      self._processor.LoadFromSerializedProto(model_proto)
    except Exception as error:  # sentencepiece raises plain RuntimeError/OSError.
      raise ValueError(
        f"Not a valid SentencePiece model: {path or '<bytes>'} ({error})."
      ) from error
    self.model_proto = model_proto
    self.path = path
    self.add_bos = add_bos  # Whether the model expects BOS before a prompt (``load``).
    self._stop_ids = tuple(dict.fromkeys([self.eos_id, *(int(i) for i in stop_ids)]))

  @classmethod
  def load(cls, path: str) -> Tokenizer:
    """Loads a ``.model`` file (ours, or e.g. a Llama 2 / Gemma tokenizer.model)."""
    if not os.path.isfile(path):
      raise FileNotFoundError(f"No SentencePiece model at {path}.")
    with open(path, "rb") as f:
      tokenizer = cls(f.read(), path, add_bos=_adds_bos(os.path.dirname(path)))
    stops = read_stop_ids(os.path.dirname(path), tokenizer.eos_id, tokenizer.bos_id)
    tokenizer._stop_ids = stops
    return tokenizer

  @classmethod
  def train(
    cls,
    texts: Iterable[str],
    vocab_size: int,
    *,
    path: str | None = None,
    model_type: str = "bpe",
    max_sentences: int = 100_000,
    seed: int = 0,
  ) -> Tokenizer:
    """Trains a code tokenizer on ``texts`` (each a chunk of a few lines); saves it to ``path``.

    Args:
      texts: training text, one chunk per item (newlines inside are kept).
      vocab_size: number of pieces, including the 4 special ids and 256 byte pieces.
      path: where to write the ``.model`` file (written atomically), or None.
      model_type: 'bpe' (fast to train) or 'unigram'.
      max_sentences: chunks sampled from ``texts`` for training.
      seed: the sampling seed.
    """
    if model_type not in MODEL_TYPES:  # SentencePiece's 'word' and 'char' do not round-trip.
      raise ValueError(
        f"--config.tokenizer.model_type={model_type!r}: must be one of {MODEL_TYPES} (a 'word' "
        "tokenizer decoded '\u2581' for spaces and fell back to bytes for most text)."
      )
    if vocab_size < 300:
      raise ValueError(
        f"vocab_size must be at least 300 (4 special ids + 256 byte pieces + "
        f"merges), got {vocab_size}."
      )
    buffer = io.BytesIO()
    spm.set_random_generator_seed(seed)
    try:
      spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=buffer,
        vocab_size=vocab_size,
        model_type=model_type,
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        add_dummy_prefix=False,
        split_by_whitespace=False,
        allow_whitespace_only_pieces=True,
        split_digits=True,
        user_defined_symbols=["\n"],
        max_sentence_length=1 << 16,
        input_sentence_size=max_sentences,
        shuffle_input_sentence=True,
        character_coverage=0.995,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        num_threads=os.cpu_count() or 1,
        minloglevel=2,
      )
    except RuntimeError as error:  # e.g. vocab_size below the characters the text needs.
      raise ValueError(_training_failure(str(error), vocab_size)) from error
    tokenizer = cls(buffer.getvalue(), path)
    if path is not None:
      write_atomically(path, tokenizer.model_proto)
    return tokenizer

  @property
  def chat_template(self) -> None:
    return None  # SentencePiece models carry none.

  @property
  def vocab_size(self) -> int:
    return self._processor.GetPieceSize()

  @property
  def pad_id(self) -> int:
    pad = self._processor.pad_id()
    return pad if pad >= 0 else self.eos_id  # Llama's tokenizer.model has no pad id.

  @property
  def bos_id(self) -> int:
    return self._processor.bos_id()

  @property
  def eos_id(self) -> int:
    return self._processor.eos_id()

  @property
  def stop_ids(self) -> tuple[int, ...]:
    """The ids that end generation: the EOS first, then any others an HF model's
    generation_config.json lists (``read_stop_ids``)."""
    return self._stop_ids

  @property
  def fingerprint(self) -> str:
    """A short hash of the serialized model: equal fingerprints, equal tokenization."""
    return hashlib.sha256(self.model_proto).hexdigest()[:16]

  def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
    ids = self._processor.EncodeAsIds(text)
    if add_bos:
      ids = [self.bos_id] + ids
    if add_eos:
      ids = ids + [self.eos_id]
    return ids

  def decode(self, ids: Sequence[int], *, stop: bool = True) -> str:
    """Text of ``ids``, stopping at the first stop id (``stop``: False reads past them, as a
    chat prompt's turns); special and out-of-vocabulary ids are dropped (a model's vocabulary
    may be padded past the tokenizer's)."""
    stops = self.stop_ids if stop else ()
    kept = decodable(ids, stops, self.vocab_size, self._processor.IsControl)
    return self._processor.DecodeIds(kept)

  def id_to_piece(self, i: int) -> str:
    return self._processor.IdToPiece(int(i))

  def save(self, directory: str) -> list[str]:
    """Writes ``tokenizer.model`` into ``directory`` (atomically), and a tokenizer_config.json
    saying ``add_bos_token`` when the model expects BOS; returns their names."""
    write_atomically(os.path.join(directory, MODEL_FILE), self.model_proto)
    written = [MODEL_FILE, *write_stop_ids(directory, self.stop_ids)]
    if not self.add_bos:
      return written
    write_atomically(os.path.join(directory, CONFIG_FILE), json.dumps({"add_bos_token": True}))
    return [*written, CONFIG_FILE]


GENERATION_CONFIG = "generation_config.json"


def read_stop_ids(directory: str, eos_id: int, bos_id: int = -1) -> tuple[int, ...]:
  """The ids that end generation: ``eos_id``, then the ``eos_token_id`` entries of a
  ``generation_config.json`` in ``directory`` (an HF model's: Llama 3's end of text and of a
  turn, Gemma's <eos> and <end_of_turn>), each once; only ``eos_id`` without the file. An id
  may lie past a SentencePiece model's pieces (Phi-3's <|end|> is one of the model's added
  tokens): the sampler checks them against the model's vocabulary. The BOS is left out (a
  generation_config written with a family's default ids, not this tokenizer's)."""
  path = os.path.join(directory, GENERATION_CONFIG)
  listed: Any = []
  if os.path.isfile(path):
    config = read_json(path)
    if not isinstance(config, dict):
      raise ValueError(f"{path} is not a generation config (a JSON object), got {config!r}.")
    listed = config.get("eos_token_id")
    listed = [] if listed is None else listed
    listed = [listed] if isinstance(listed, int) else listed
    if not isinstance(listed, list) or not all(
      isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in listed
    ):
      raise ValueError(
        f"{path}: eos_token_id must be a token id or a list of them (ints >= 0), got {listed!r}."
      )
  return tuple(dict.fromkeys([int(eos_id), *(i for i in listed if i != bos_id)]))


def write_stop_ids(directory: str, stop_ids: Sequence[int]) -> list[str]:
  """Writes the stop ids beyond the first (the EOS) as ``generation_config.json``'s
  ``eos_token_id`` list, as an HF model folder holds them; returns the names written."""
  if len(stop_ids) <= 1:
    return []
  text = json.dumps({"eos_token_id": [int(i) for i in stop_ids]}, indent=2)
  write_atomically(os.path.join(directory, GENERATION_CONFIG), text)
  return [GENERATION_CONFIG]


def check_stop_ids(tokenizer: Any, vocab_size: int) -> None:
  """Refuses stop ids the model cannot emit (an HF folder's generation_config.json naming ids
  past the model's vocabulary), naming where they come from."""
  past = [i for i in tokenizer.stop_ids if i >= vocab_size]
  if past:
    raise ValueError(
      f"The tokenizer's stop ids {list(tokenizer.stop_ids)} include {past}, past the model's "
      f"{vocab_size} tokens: they come from the eos_token_id of the generation_config.json "
      f"beside the tokenizer ({tokenizer.path}). Correct that file, or sample without "
      "stopping at EOS (--config.sampling.use_eos=False)."
    )


def decodable(
  ids: Sequence[int],
  eos_id: int | Sequence[int],
  vocab_size: int,
  is_special: Callable[[int], bool],
) -> list[int]:
  """The ids a tokenizer decodes: up to the first EOS (or any of the stop ids), without
  special ids and ids past the tokenizer's vocabulary (a model's vocabulary may be padded
  past it)."""
  stops = {int(eos_id)} if np.ndim(eos_id) == 0 else {int(i) for i in eos_id}
  kept = []
  for i in (int(i) for i in ids):
    if i in stops:
      break
    if 0 <= i < vocab_size and not is_special(i):
      kept.append(i)
  return kept


MODEL_FILE = "tokenizer.model"
CONFIG_FILE = "tokenizer_config.json"
# SentencePiece tokenizers transformers gives BOS by default (add_bos_token=True) when their
# tokenizer_config.json names the class and says nothing else.
_BOS_BY_DEFAULT = (
  "LlamaTokenizer",
  "LlamaTokenizerFast",
  "CodeLlamaTokenizer",
  "CodeLlamaTokenizerFast",
  "GemmaTokenizer",
  "GemmaTokenizerFast",
)


def _adds_bos(directory: str) -> bool:
  """Whether an HF directory's SentencePiece model expects BOS before a prompt: its
  tokenizer_config.json's add_bos_token, else the class's default; none (a tokenizer specsamp
  trained): no."""
  path = os.path.join(directory, CONFIG_FILE)
  if not os.path.isfile(path):
    return False
  with open(path, encoding="utf-8") as f:
    try:
      config = json.load(f)
    except json.JSONDecodeError as error:
      raise ValueError(f"{path} is not valid JSON: {error}") from None
  default = config.get("tokenizer_class") in _BOS_BY_DEFAULT
  return bool(config.get("add_bos_token", default))


JSON_FILE = "tokenizer.json"


def find(directory: str) -> str | None:
  """The tokenizer file in ``directory`` (an HF model directory, a checkpoint or a workdir):
  SentencePiece's tokenizer.model, else tokenizer.json; None when it has neither."""
  for name in (MODEL_FILE, JSON_FILE):
    path = os.path.join(os.path.expanduser(directory), name)
    if os.path.isfile(path):
      return path
  return None


def load(path: str):
  """A tokenizer from a file (``*.model``: SentencePiece; ``*.json``: a ``tokenizers``
  tokenizer.json, with tokenizer_config.json beside it) or a directory holding one."""
  path = os.path.expanduser(path)
  if os.path.isdir(path):
    found = find(path)
    if found is None:
      raise FileNotFoundError(f"{path} holds neither {MODEL_FILE} nor {JSON_FILE}.")
    path = found
  if path.endswith(".json"):
    from specsamp.training.bpe_tokenizer import BpeTokenizer

    return BpeTokenizer.load(path)
  return Tokenizer.load(path)


def check_same(
  first: Tokenizer, second: Tokenizer, names: tuple[str, str] = ("target", "draft")
) -> None:
  """Raises ValueError unless both tokenizers map text to the same ids."""
  if first.fingerprint != second.fingerprint:
    raise ValueError(
      f"The {names[0]} and {names[1]} use different tokenizers ({first.path or 'unsaved'}, "
      f"fingerprint {first.fingerprint}, {first.vocab_size} pieces vs {second.path or 'unsaved'}, "
      f"fingerprint {second.fingerprint}, {second.vocab_size} pieces). Speculative sampling "
      "compares token ids, so both models must share one tokenizer."
    )
