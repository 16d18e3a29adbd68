"""A byte-level BPE tokenizer (GPT-2 style: SmolLM, Llama 3, Qwen), backed by the
``tokenizers`` library, behind the same interface as the SentencePiece ``Tokenizer``.

Stored as Hugging Face does: ``tokenizer.json`` (the ``tokenizers`` serialization: vocabulary,
merges, pre-tokenizer, decoder, added tokens) and ``tokenizer_config.json`` beside it (the
special tokens and the chat template). ``load`` reads both from an HF model directory or from
a specsamp checkpoint; ``gguf.tokenizer`` builds one from a GGUF file's vocabulary.

The fingerprint hashes the serialized tokenizer: equal fingerprints, equal ids for any text.
The chat template is a Jinja template over ``messages`` (``[{"role", "content"}]``) and
``add_generation_prompt``, rendered as transformers renders it (``apply_chat_template``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any

from specsamp import files
from specsamp.training import tokenizer

TOKENIZER_JSON = tokenizer.JSON_FILE
CONFIG_JSON = tokenizer.CONFIG_FILE  # The HF file beside it: specials, add_bos_token, template.


def _tokenizers_module():
  try:
    import tokenizers
  except ImportError as error:
    raise ImportError(
      "BPE tokenizers (tokenizer.json, GGUF files) need the tokenizers package: "
      "pip install 'tokenizers==0.23.3' (or the project's [gguf] extra)."
    ) from error
  return tokenizers


class BpeTokenizer:
  """A ``tokenizers.Tokenizer`` with its special ids and chat template."""

  def __init__(
    self,
    backend: Any,
    *,
    eos_id: int,
    bos_id: int = -1,
    pad_id: int | None = None,
    add_bos: bool = False,
    chat_template: str | None = None,
    path: str | None = None,
    stop_ids: Sequence[int] = (),
    model_max_length: int | None = None,
  ):
    self.backend = backend
    # The context the tokenizer's folder declares, written back by ``save`` (an export read
    # 1e30 from transformers' default without it; 2026-11-30's review). Not used here.
    self.model_max_length = model_max_length
    size = backend.get_vocab_size(with_added_tokens=True)
    for name, value in (("eos_id", eos_id), ("bos_id", bos_id), ("pad_id", pad_id)):
      if value is not None and not -1 <= value < size:
        raise ValueError(f"{name} {value} is outside the tokenizer's {size} tokens ({path}).")
    if eos_id < 0:
      raise ValueError(f"The tokenizer at {path} names no end-of-sequence token.")
    self._eos_id, self._bos_id, self._pad_id = eos_id, bos_id, pad_id
    for i in stop_ids:
      if int(i) < 0:
        raise ValueError(f"Stop id {i} is not a token id ({path}).")
    self._stop_ids = tuple(dict.fromkeys([eos_id, *(int(i) for i in stop_ids)]))
    self.add_bos = add_bos  # Whether the model expects BOS before a prompt.
    self.chat_template = chat_template
    self._template_cache = None  # (template text, compiled template): _compiled_template.
    self.path = path
    self._special = {i for i, token in backend.get_added_tokens_decoder().items() if token.special}

  @classmethod
  def load(cls, path: str) -> BpeTokenizer:
    """Reads ``tokenizer.json`` (a file, or a directory holding it) and, when present, the
    ``tokenizer_config.json`` beside it."""
    path = os.path.expanduser(path)
    if os.path.isdir(path):
      path = os.path.join(path, TOKENIZER_JSON)
    if not os.path.isfile(path):
      raise FileNotFoundError(f"No tokenizer.json at {path}.")
    tokenizers = _tokenizers_module()
    try:
      backend = tokenizers.Tokenizer.from_file(path)
    except Exception as error:  # tokenizers raises a bare Exception on a malformed file.
      raise ValueError(f"{path} is not a tokenizers tokenizer.json: {error}") from error
    config_path = os.path.join(os.path.dirname(path), CONFIG_JSON)
    config = {}
    if os.path.isfile(config_path):
      config = files.read_json(config_path)
      if not isinstance(config, dict):
        raise ValueError(f"{config_path} is not a tokenizer config (a JSON object).")

    def token_id(key: str) -> int | None:
      token = config.get(key)
      if isinstance(token, dict):  # transformers' AddedToken form.
        token = token.get("content")
      if token is None:
        return None
      found = backend.token_to_id(token)
      if found is None:
        raise ValueError(f"{config_path}: {key} {token!r} is not in {path}'s vocabulary.")
      return found

    eos = token_id("eos_token")
    if eos is None:
      raise ValueError(
        f"{path}: no eos_token in {config_path}; specsamp needs the end-of-sequence token."
      )
    bos = token_id("bos_token")
    add_bos = config.get("add_bos_token")
    if add_bos is None:  # As transformers then: BOS where tokenizer.json's post-processor puts
      # one (Llama 3's TemplateProcessing writes <|begin_of_text|> before every text).
      probe = "a"
      with_specials = backend.encode(probe, add_special_tokens=True).ids
      plain = backend.encode(probe, add_special_tokens=False).ids
      add_bos = bos is not None and with_specials[:1] == [bos] != plain[:1]
    return cls(
      backend,
      eos_id=eos,
      bos_id=-1 if bos is None else bos,
      pad_id=token_id("pad_token"),
      add_bos=bool(add_bos),
      chat_template=_chat_template(config, os.path.dirname(path)),
      model_max_length=config.get("model_max_length"),
      path=path,
      stop_ids=tokenizer.read_stop_ids(os.path.dirname(path), eos, -1 if bos is None else bos),
    )

  def save(self, directory: str) -> list[str]:
    """Writes tokenizer.json and tokenizer_config.json into ``directory`` (atomically);
    returns their names."""
    config = {
      "tokenizer_class": "PreTrainedTokenizerFast",
      "eos_token": self.id_to_piece(self.eos_id),
      "add_bos_token": self.add_bos,
      "add_eos_token": False,
    }
    if self.bos_id >= 0:
      config["bos_token"] = self.id_to_piece(self.bos_id)
    if self._pad_id is not None:
      config["pad_token"] = self.id_to_piece(self._pad_id)
    if self.chat_template is not None:
      config["chat_template"] = self.chat_template
    if self.model_max_length is not None:
      config["model_max_length"] = self.model_max_length
    texts = {TOKENIZER_JSON: self.backend.to_str(), CONFIG_JSON: json.dumps(config, indent=2)}
    for name, text in texts.items():
      files.write_atomically(os.path.join(directory, name), text)
    return [*texts, *tokenizer.write_stop_ids(directory, self.stop_ids)]

  @property
  def vocab_size(self) -> int:
    return self.backend.get_vocab_size(with_added_tokens=True)

  @property
  def eos_id(self) -> int:
    return self._eos_id

  @property
  def stop_ids(self) -> tuple[int, ...]:
    """The ids that end generation: the EOS first, then any others an HF model's
    generation_config.json lists (``tokenizer.read_stop_ids``) or a GGUF file names (its
    end-of-turn and end-of-message tokens)."""
    return self._stop_ids

  @property
  def bos_id(self) -> int:
    return self._bos_id

  @property
  def pad_id(self) -> int:
    return self.eos_id if self._pad_id is None else self._pad_id

  @property
  def fingerprint(self) -> str:
    """A short hash of the serialized tokenizer: equal fingerprints, equal tokenization."""
    return hashlib.sha256(self.backend.to_str().encode()).hexdigest()[:16]

  def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
    """Ids of ``text``; special tokens written in it (e.g. ``<|im_start|>``) are matched."""
    ids = self.backend.encode(text, add_special_tokens=False).ids
    if add_bos:
      if self.bos_id < 0:
        raise ValueError(f"The tokenizer at {self.path} has no BOS token.")
      ids = [self.bos_id] + ids
    if add_eos:
      ids = ids + [self.eos_id]
    return ids

  def decode(self, ids: Sequence[int], *, stop: bool = True) -> str:
    """Text of ``ids``, stopping at the first stop id (``stop``: False reads past them, as a
    chat prompt's turns); special and out-of-vocabulary ids are dropped (a model's vocabulary
    may be padded past the tokenizer's)."""
    stops = self.stop_ids if stop else ()
    kept = tokenizer.decodable(ids, stops, self.vocab_size, self._special.__contains__)
    return self.backend.decode(kept, skip_special_tokens=True)

  def id_to_piece(self, i: int) -> str:
    return self.backend.id_to_token(int(i))

  def apply_chat_template(
    self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = True
  ) -> str:
    """The chat template rendered for ``messages``, as transformers renders it (a trimmed,
    sandboxed Jinja environment); encode the result to prompt the model."""
    if self.chat_template is None:
      raise ValueError(f"The tokenizer at {self.path} has no chat template.")
    special = {"bos_token": self.id_to_piece(self.bos_id) if self.bos_id >= 0 else ""}
    special["eos_token"] = self.id_to_piece(self.eos_id)
    import jinja2

    template = self._compiled_template()
    try:
      return template.render(
        messages=list(messages), add_generation_prompt=add_generation_prompt, **special
      )
    except jinja2.TemplateError as error:  # A traceback from inside Jinja before 2026-11-30.
      raise ValueError(f"{self.path}: its chat template fails to render: {error}") from None

  def _compiled_template(self) -> Any:
    """The chat template compiled once, and again only when ``chat_template`` changed. Jinja
    compiles a template to Python, which took 116 of the 137 s that regeneration spent
    rendering and encoding SmolLM2's 16,769 prompts when it was compiled per call."""
    cached = self._template_cache
    if cached is None or cached[0] != self.chat_template:
      import datetime
      import json

      import jinja2
      import jinja2.ext
      from jinja2.sandbox import ImmutableSandboxedEnvironment

      def raise_exception(message):
        raise ValueError(f"chat template: {message}")

      def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # transformers' filter: Jinja's own escapes HTML and every non-ASCII character.
        return json.dumps(
          x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

      # What transformers' environment adds (2026-11-30's review): {% break %} and
      # {% continue %}, today's date (Llama 3.2's template falls back to a fixed one without
      # it), and its tojson.
      environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
      )
      environment.globals["raise_exception"] = raise_exception
      environment.globals["strftime_now"] = lambda f: datetime.datetime.now().strftime(f)
      environment.filters["tojson"] = tojson
      try:
        compiled = environment.from_string(self.chat_template)
      except jinja2.TemplateError as error:
        raise ValueError(f"{self.path}: its chat template does not compile: {error}") from None
      cached = (self.chat_template, compiled)
      self._template_cache = cached
    return cached[1]


def _chat_template(config: dict, folder: str) -> str | None:
  """The chat template of an HF tokenizer folder, where transformers keeps it: today's
  ``save_pretrained`` writes ``chat_template.jinja`` (and older ones ``chat_template.json``),
  earlier ones put it in ``tokenizer_config.json``, possibly as a list of named templates
  (the one named 'default' is the chat's). A template only in ``chat_template.jinja`` was not
  read, so chat prompting and an export lost it (2026-11-30's review)."""
  template = config.get("chat_template")
  jinja_file = os.path.join(folder, "chat_template.jinja")
  json_file = os.path.join(folder, "chat_template.json")
  if os.path.isfile(jinja_file):
    with open(jinja_file, encoding="utf-8") as f:
      template = f.read()
  elif template is None and os.path.isfile(json_file):
    template = files.read_json(json_file).get("chat_template")
  if isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
    named = {entry.get("name"): entry.get("template") for entry in template}
    template = named.get("default")
  return template
