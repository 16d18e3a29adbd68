"""Parity with Hugging Face transformers: logits, greedy generation, assisted generation,
and the import / export / checkpoint paths with their errors."""

import dataclasses
import json
import os
import shutil

import hf_models
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import torch
from flax import nnx

from specsamp import hf, sharding
from specsamp.hf import architectures, convert, safetensors_io, weights
from specsamp.models import transformer
from specsamp.sampling import autoregressive, speculative
from specsamp.training import checkpoint, train

# Parity with transformers: every test builds torch models (the inner loop skips them).
pytestmark = pytest.mark.slow

KINDS = list(hf_models.ARCHITECTURES)
# Parity with transformers on every family is the extended command's (it builds and runs a torch
# model per family, ~75 s); the suite keeps a dense Llama, Gemma 3 (sliding windows, soft-caps,
# norms around each block) and the Qwen3 MoE.
SUITE_KINDS = ("llama", "gemma3_text", "qwen3_moe")
EVERY_KIND = [
  kind if kind in SUITE_KINDS else pytest.param(kind, marks=pytest.mark.extended) for kind in KINDS
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """kind -> (torch target, its HF directory, torch draft, the draft's directory)."""
  cache = {}

  def get(kind):
    if kind not in cache:
      target = hf_models.build(kind)
      draft = hf_models.perturbed(target, 0.1, seed=1)
      root = tmp_path_factory.mktemp(kind)
      target.save_pretrained(root / "target")
      draft.save_pretrained(root / "draft")
      cache[kind] = (target, str(root / "target"), draft, str(root / "draft"))
    return cache[kind]

  return get


@pytest.fixture(scope="module")
def imported(saved):
  cache = {}

  def get(kind, which="target"):
    if (kind, which) not in cache:
      _, target_dir, _, draft_dir = saved(kind)
      cache[kind, which] = hf.import_model(target_dir if which == "target" else draft_dir)[0]
    return cache[kind, which]

  return get


def minimal_config(model_type: str, **fields) -> dict:
  """A config.json dict with only the shapes every family needs, and ``fields``."""
  shapes = dict(
    vocab_size=hf_models.VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
  )
  return {"model_type": model_type, **shapes, **fields}


def relative_error(ours, reference) -> float:
  """max |ours - ref| / max |ref|: the error relative to the logits' scale."""
  return float(np.abs(np.asarray(ours) - reference).max() / np.abs(reference).max())


def torch_logits(model, tokens: np.ndarray) -> np.ndarray:
  with torch.no_grad():
    return model(torch.as_tensor(tokens)).logits.numpy()


TOKENS = np.random.default_rng(0).integers(3, hf_models.VOCAB, size=(2, 13))


@pytest.mark.parametrize("kind", EVERY_KIND)
def test_logits_match_transformers(kind, saved, imported):
  torch_model = saved(kind)[0]
  reference = torch_logits(torch_model, TOKENS)
  model = imported(kind)
  logits, _ = model(jnp.asarray(TOKENS))
  assert relative_error(logits, reference) < 1e-4
  # The cached path: a 6-token prefill, then one token per call.
  cache = model.init_cache(2, 16)
  pieces = [model(jnp.asarray(TOKENS[:, :6]), cache=cache)]
  for t in range(6, TOKENS.shape[1]):
    pieces.append(model(jnp.asarray(TOKENS[:, t : t + 1]), cache=pieces[-1][1]))
  stepped = np.concatenate([np.asarray(p[0]) for p in pieces], axis=1)
  assert relative_error(stepped, reference) < 1e-4


def with_config(model, **changes):
  """``model``'s parameters in a model whose config differs by ``changes`` (parameters the
  new config has no place for are dropped)."""
  config = model.config.replace(**changes)
  abstract = nnx.eval_shape(lambda: transformer.Transformer(config, rngs=nnx.Rngs(0)))
  graphdef, abstract_params = nnx.split(abstract, nnx.Param)

  def prune(source, like):
    return {k: prune(source[k], v) if isinstance(v, dict) else source[k] for k, v in like.items()}

  return nnx.merge(graphdef, prune(train.params_of(model), nnx.to_pure_dict(abstract_params)))


@pytest.mark.parametrize(
  "kind, field, value",
  [
    ("mistral", "sliding_window", None),
    ("gemma2", "sliding_window", None),
    ("llama", "rope_scaling", "none"),
    ("gemma2", "query_pre_attn_scalar", None),
    ("gemma2", "post_norms", False),
    ("gemma2", "final_logit_softcap", None),
    ("arcee", "gelu_approximate", False),
    ("qwen3", "qk_norm", False),
    ("gemma3_text", "rope_local_theta", None),
    ("gemma3_text", "rope_scaling", "none"),
    ("phi3", "sliding_window", None),
    ("qwen3_moe", "normalize_expert_weights", False),
    ("qwen3_moe", "experts_per_token", 1),
  ],
)
def test_parity_detects_each_feature(kind, field, value, saved, imported):
  """Negative controls: with one feature switched off parity breaks, so the test above
  would catch a wrong implementation of it."""
  reference = torch_logits(saved(kind)[0], TOKENS)
  changes = {field: value}
  if (field, value) == ("rope_scaling", "none"):  # A factor without scaling is refused.
    changes["rope_scaling_factor"] = 1.0
  if (field, value) == ("sliding_window", None):  # As is a layer pattern without a window.
    changes["sliding_window_pattern"] = 1
  logits, _ = with_config(imported(kind), **changes)(jnp.asarray(TOKENS))
  assert relative_error(logits, reference) > 2e-4  # Twice the parity tolerance.


PROMPTS = np.random.default_rng(1).integers(3, hf_models.VOCAB, size=(2, 7))


@pytest.mark.parametrize("kind", EVERY_KIND)
def test_greedy_matches_transformers_generate(kind, saved, imported):
  torch_model = saved(kind)[0]
  reference = hf_models.generate(torch_model, torch.as_tensor(PROMPTS), 16, do_sample=False)
  out = autoregressive.generate(
    imported(kind),
    PROMPTS,
    np.full(2, PROMPTS.shape[1]),
    jax.random.key(0),
    max_new_tokens=16,
    temperature=0.0,
  )
  np.testing.assert_array_equal(np.asarray(out.tokens)[:, PROMPTS.shape[1] :], reference)


@pytest.mark.slow
# The MoE's assisted generation is the extended command's: its logits and greedy parity stay,
# and test_moe.py samples speculatively over an MoE target exactly.
@pytest.mark.parametrize(
  "kind",
  [k if k in SUITE_KINDS and k != "qwen3_moe" else pytest.param(k, marks=pytest.mark.extended)
   for k in KINDS],
)  # fmt: skip
def test_speculative_greedy_matches_assisted_generation(kind, saved, imported):
  """Ours with a draft vs transformers' generate(assistant_model=draft), batch 1 (HF's limit)."""
  target, _, draft, _ = saved(kind)
  histogram = np.zeros(4, int)
  for row in range(2):
    prompt = PROMPTS[row : row + 1]
    reference = hf_models.generate(
      target, torch.as_tensor(prompt), 16, do_sample=False, assistant_model=draft
    )
    out = speculative.speculative_generate(
      imported(kind),
      imported(kind, "draft"),
      prompt,
      np.array([prompt.shape[1]]),
      jax.random.key(row),
      max_new_tokens=16,
      num_draft_tokens=3,
      temperature=0.0,
    )
    np.testing.assert_array_equal(np.asarray(out.tokens)[:, prompt.shape[1] :], reference)
    histogram += np.asarray(out.accepted_histogram).sum(axis=0)
  # The draft is a noisy copy: some proposals are accepted and some rejected, so both
  # branches of verification ran.
  assert histogram[1:].sum() > 0 and histogram[:-1].sum() > 0, histogram


def read_all(directory) -> dict[str, np.ndarray]:
  tensors = safetensors_io.Checkpoint(str(directory))
  return {name: np.asarray(tensors.tensor(name)) for name in tensors.keys()}


@pytest.mark.parametrize("kind", ["qwen2", "gemma2", "gemma3_text", "phi3", "qwen3_moe"])
def test_export_round_trip_is_bit_exact_and_loads_in_transformers(kind, saved, imported, tmp_path):
  """Phi-3 exports with its q/k/v and gate/up joined again; Qwen3-MoE one tensor per expert."""
  import transformers

  target_dir = saved(kind)[1]
  model = imported(kind)
  model_type = "phi3" if kind == "phi3" else None  # Else the type model_type_of finds.
  files = hf.export_model(
    model, str(tmp_path / "out"), max_shard_bytes=20_000, model_type=model_type
  )
  assert architectures.read_config(str(tmp_path / "out"))["model_type"] == kind
  assert len(files) > 1 and (tmp_path / "out" / safetensors_io.INDEX_FILE).exists()
  original, exported = read_all(target_dir), read_all(tmp_path / "out")
  tied = {"lm_head.weight"} if model.config.tie_embeddings else set()
  assert set(exported) == set(original) - tied
  for name, value in exported.items():
    np.testing.assert_array_equal(value, original[name], err_msg=name)
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(
    str(tmp_path / "out"), attn_implementation="eager"
  ).eval()
  np.testing.assert_array_equal(
    torch_logits(reloaded, TOKENS), torch_logits(saved(kind)[0], TOKENS)
  )
  with pytest.raises(FileExistsError, match="already holds a model"):
    hf.export_model(model, str(tmp_path / "out"))


def test_sharded_checkpoint_imports_onto_a_tensor_parallel_mesh(saved, tmp_path):
  """Shards + index in, parameters placed shard by shard on a data x tensor mesh."""
  torch_model = saved("llama")[0]
  torch_model.save_pretrained(tmp_path, max_shard_size="30KB")
  assert (tmp_path / safetensors_io.INDEX_FILE).exists()
  mesh = sharding.make_mesh({"data": 4, "tensor": 2})
  model, _ = hf.import_model(str(tmp_path), mesh)
  q = model.blocks.attn.q_DNH[...]
  assert q.sharding.spec == jax.sharding.PartitionSpec(None, None, "tensor", None)
  assert q.addressable_shards[0].data.shape[1:] == (32, 2, 8)
  with sharding.use_mesh(mesh):
    logits, _ = jax.jit(lambda m, t: m(t))(model, jnp.asarray(TOKENS))
  assert relative_error(logits, torch_logits(torch_model, TOKENS)) < 1e-4


def test_transforms_are_views_so_a_shard_reads_only_its_bytes(saved):
  """Each HF -> specsamp layout change is a numpy view of the memory map (no copy)."""
  tensors = safetensors_io.Checkpoint(saved("qwen2")[1])
  config = architectures.from_hf(architectures.read_config(saved("qwen2")[1]))
  mapped = tensors.files[safetensors_io.SINGLE_FILE]._map
  for entry in weights.entries(config):
    stored = tensors.tensor(entry.hf_name)
    assert np.shares_memory(entry.to_ours(stored), mapped), entry.hf_name
    np.testing.assert_array_equal(entry.to_hf(np.asarray(entry.to_ours(stored))), stored)


def test_safetensors_format_matches_the_reference_library(tmp_path):
  import ml_dtypes

  rng = np.random.default_rng(0)
  tensors = {
    "a": rng.normal(size=(3, 5)).astype(np.float32),
    "b": rng.normal(size=(7,)).astype(np.float16),
    "c": rng.integers(0, 9, size=(2, 2, 2)).astype(np.int64),
    "d": rng.normal(size=(4, 3)).astype(ml_dtypes.bfloat16),
  }
  safetensors_io.write_file(str(tmp_path / "ours.safetensors"), tensors)
  theirs = safetensors.numpy.load_file(str(tmp_path / "ours.safetensors"))
  for name in "abc":
    np.testing.assert_array_equal(theirs[name], tensors[name])
  reference = {name: tensors[name] for name in "abc"}
  safetensors.numpy.save_file(reference, str(tmp_path / "theirs.safetensors"))
  read = safetensors_io.SafetensorsFile(str(tmp_path / "theirs.safetensors"))
  for name in "abc":
    np.testing.assert_array_equal(read.tensor(name), tensors[name])
  ours = safetensors_io.SafetensorsFile(str(tmp_path / "ours.safetensors"))
  np.testing.assert_array_equal(ours.tensor("d").view(np.uint16), tensors["d"].view(np.uint16))


def test_damaged_safetensors_files_and_indexes_are_named(saved, tmp_path):
  """A truncated shard, a header whose byte range does not hold its shape, and a broken or
  incomplete index: one line naming the file (and the tensor), where the import raised
  numpy's reshape error, a JSON error without the file, or a KeyError (the review of
  2026-11-29)."""
  import shutil

  good = tmp_path / "good.safetensors"
  safetensors_io.write_file(str(good), {"a": np.ones((32, 32), np.float32)})
  data = good.read_bytes()
  (tmp_path / "cut.safetensors").write_bytes(data[:-100])
  with pytest.raises(safetensors_io.SafetensorsError, match="cut.safetensors: tensor 'a' ends at"):
    safetensors_io.SafetensorsFile(str(tmp_path / "cut.safetensors"))
  header = data[8 : 8 + int.from_bytes(data[:8], "little")]
  wrong = header.replace(b"[32,32]", b"[32,16]")
  assert wrong != header
  (tmp_path / "shape.safetensors").write_bytes(data[:8] + wrong + data[8 + len(header) :])
  with pytest.raises(
    safetensors_io.SafetensorsError, match="'a' of shape \\[32, 16\\].*corrupt header"
  ):
    safetensors_io.SafetensorsFile(str(tmp_path / "shape.safetensors"))
  source = saved("llama")[1]
  sharded = tmp_path / "sharded"
  shutil.copytree(source, sharded)
  names = list(read_all(source))
  index = {"weight_map": {name: "model.safetensors" for name in names}}
  for content, message in (
    ("{not json", "is not a safetensors index .*JSONDecodeError"),
    (json.dumps({"metadata": {}}), "is not a safetensors index .*KeyError"),
    (
      json.dumps({"weight_map": dict(index["weight_map"], x="model-2.safetensors")}),
      "lists shards that are not in .*model-2",
    ),
  ):
    (sharded / safetensors_io.INDEX_FILE).write_text(content)
    with pytest.raises(safetensors_io.SafetensorsError, match=message):
      hf.import_model(str(sharded))
  (sharded / "config.json").write_text("{broken")
  with pytest.raises(ValueError, match="config.json is not valid JSON"):
    hf.import_model(str(sharded))
  config = architectures.read_config(source)
  for changes, message in (
    (dict(num_attention_heads=None), "lacks num_attention_heads, which a llama model needs"),
    (
      dict(rope_parameters={"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}),
      "lacks low_freq_factor, high_freq_factor, original_max_position_embeddings, which its",
    ),
  ):
    with pytest.raises(ValueError, match=message):
      architectures.from_hf({k: v for k, v in dict(config, **changes).items() if v is not None})


def test_bfloat16_checkpoint_imports_bit_exact(saved, tmp_path):
  torch_model = hf_models.build("llama").to(torch.bfloat16)
  torch_model.save_pretrained(tmp_path)
  model, _ = hf.import_model(str(tmp_path))
  assert model.config.param_dtype == "bfloat16" and model.config.dtype == "bfloat16"
  table = model.embedder.table_VD[...]
  assert table.dtype == jnp.bfloat16
  expected = torch_model.model.embed_tokens.weight.view(torch.int16).numpy()
  np.testing.assert_array_equal(np.asarray(table).view(np.int16), expected)
  upcast, _ = hf.import_model(str(tmp_path), param_dtype="float32")
  assert upcast.embedder.table_VD[...].dtype == jnp.float32
  # config.json without a dtype: the tensors' own (float32 before: twice the memory).
  config = architectures.read_config(str(tmp_path))
  for key in ("dtype", "torch_dtype"):
    config.pop(key, None)
  write_config(tmp_path, **config)
  model, _ = hf.import_model(str(tmp_path))
  assert model.config.param_dtype == "bfloat16"
  np.testing.assert_array_equal(np.asarray(model.embedder.table_VD[...]).view(np.int16), expected)
  # A config that names another dtype than the tensors': imported in the config's (as
  # transformers' dtype='auto'), with a warning that says how to keep them as stored.
  write_config(tmp_path, **config, dtype="float32")
  with pytest.warns(UserWarning, match="says dtype float32, but the weights are stored in bf"):
    model, _ = hf.import_model(str(tmp_path))
  assert model.config.param_dtype == "float32"


def test_orbax_checkpoint_round_trip(tmp_path):
  from specsamp.training.tokenizer import Tokenizer

  texts = [f"def f{i}(x):\n    return x * {i} + {i % 7}\n" for i in range(400)]
  tokenizer = Tokenizer.train(texts, 300)
  torch_model = hf_models.build("mistral", vocab_size=320)
  torch_model.save_pretrained(tmp_path / "hf")
  (tmp_path / "hf" / "tokenizer.model").write_bytes(tokenizer.model_proto)
  config = hf.import_to_checkpoint(str(tmp_path / "hf"), str(tmp_path / "ckpt"))
  assert config.vocab_size == 320 and config.sliding_window == 4
  assert (tmp_path / "ckpt" / "tokenizer.model").read_bytes() == tokenizer.model_proto
  mesh = sharding.make_mesh({"data": 2, "tensor": 4})
  model, meta = checkpoint.load_model(str(tmp_path / "ckpt"), mesh)
  assert meta["source"]["model_type"] == "mistral" and meta["tokenizer"] == tokenizer.fingerprint
  with sharding.use_mesh(mesh):
    logits, _ = jax.jit(lambda m, t: m(t))(model, jnp.asarray(TOKENS))
  assert relative_error(logits, torch_logits(torch_model, TOKENS)) < 1e-4
  with pytest.raises(FileExistsError, match="already holds a checkpoint"):
    hf.import_to_checkpoint(str(tmp_path / "hf"), str(tmp_path / "ckpt"))
  assert checkpoint.Checkpoints(str(tmp_path / "ckpt")).all_steps() == [0]
  # Nothing is written into a folder that holds other files (a workdir's tokenizer, the HF
  # folder itself): an import or export there would overwrite them.
  before = {f: (tmp_path / "hf" / f).read_bytes() for f in os.listdir(tmp_path / "hf")}
  with pytest.raises(FileExistsError, match=r"hf is not empty \(config.json, "):
    hf.import_to_checkpoint(str(tmp_path / "hf"), str(tmp_path / "hf"))
  with pytest.raises(FileExistsError, match=r"ckpt is not empty .*an export writes only into"):
    hf.export_model(model, str(tmp_path / "ckpt"))
  assert {f: (tmp_path / "hf" / f).read_bytes() for f in os.listdir(tmp_path / "hf")} == before
  assert (tmp_path / "ckpt" / "tokenizer.model").read_bytes() == tokenizer.model_proto
  # What an interrupted import leaves (orbax's unfinished step) is no reason to refuse.
  (tmp_path / "again" / "0.orbax-checkpoint-tmp-1700000000").mkdir(parents=True)
  hf.import_to_checkpoint(str(tmp_path / "hf"), str(tmp_path / "again"))
  assert checkpoint.Checkpoints(str(tmp_path / "again")).all_steps() == [0]
  # An import stopped between its checkpoint's commit and its tokenizer's files: the same
  # import again finishes it (it refused the non-empty folder); another source's is refused.
  os.remove(tmp_path / "again" / "tokenizer.model")
  again = hf.import_to_checkpoint(str(tmp_path / "hf"), str(tmp_path / "again"))
  assert again == config and (tmp_path / "again" / "tokenizer.model").read_bytes() == (
    tokenizer.model_proto
  )
  assert checkpoint.Checkpoints(str(tmp_path / "again")).all_steps() == [0]
  os.remove(tmp_path / "again" / "tokenizer.model")
  shutil.copytree(tmp_path / "hf", tmp_path / "hf_copy")
  with pytest.raises(FileExistsError, match="already holds a checkpoint"):
    hf.import_to_checkpoint(str(tmp_path / "hf_copy"), str(tmp_path / "again"))
  other = Tokenizer.train([text.replace("return", "yield") for text in texts], 300)
  (tmp_path / "hf" / "tokenizer.model").write_bytes(other.model_proto)
  with pytest.raises(FileExistsError, match="no longer the one imported"):
    hf.import_to_checkpoint(str(tmp_path / "hf"), str(tmp_path / "again"))
  (tmp_path / "hf" / "tokenizer.model").write_bytes(tokenizer.model_proto)
  # A tokenizer with more pieces than the model has embeddings is refused.
  hf_models.build("mistral").save_pretrained(tmp_path / "small")
  (tmp_path / "small" / "tokenizer.model").write_bytes(tokenizer.model_proto)
  with pytest.raises(ValueError, match="tokenizer has 300 pieces but the model only 97"):
    hf.import_to_checkpoint(str(tmp_path / "small"), str(tmp_path / "ckpt2"))


# ---- Errors ---------------------------------------------------------------------------------


def write_config(directory, **fields):
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(fields, f)


def copy_with_config(source: str, destination, **changes):
  import shutil

  shutil.copytree(source, destination)
  config = architectures.read_config(source)
  config.update(changes)
  write_config(destination, **config)
  return str(destination)


@pytest.mark.parametrize(
  "changes, message",
  [
    (
      dict(model_type="gpt2", architectures=["GPT2LMHeadModel"]),
      "model_type 'gpt2'.*not supported",
    ),
    (dict(model_type="mixtral"), "model_type 'mixtral'.*llama, mistral, qwen2"),
    (dict(model_type="gemma3"), "model_type 'gemma3'.*gemma3_text"),
    (dict(quantization_config={"quant_method": "gptq"}), "quantized \\(gptq\\)"),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}), "'yarn'"),
    (dict(mlp_bias=True), "mlp_bias"),
    (dict(hidden_act="tanh"), "hidden activation 'tanh'"),
    (dict(attention_bias=True), "attention_bias=true"),
  ],
)
def test_unsupported_architectures_are_refused(changes, message, saved, tmp_path):
  directory = copy_with_config(saved("llama")[1], tmp_path / "m", **changes)
  with pytest.raises(architectures.UnsupportedArchitecture, match=message):
    hf.import_model(directory)


@pytest.mark.parametrize(
  "kind, changes, message",
  [
    ("phi3", dict(rope_parameters={"rope_type": "longrope", "rope_theta": 1e4}), "'longrope'"),
    (
      "phi3",
      dict(
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.75}
      ),
      "partial_rotary_factor=0.75",
    ),
    ("qwen3_moe", dict(mlp_only_layers=[1]), "qwen3_moe with dense mlp_only_layers"),
    ("qwen3_moe", dict(decoder_sparse_step=2), "decoder_sparse_step"),
    ("qwen3", dict(attention_bias=True), "attention_bias=true"),
    (
      "qwen3",
      dict(use_sliding_window=True, sliding_window=4, layer_types=None, max_window_layers=1),
      "qwen3 with sliding layers \\[1, 2\\] of 3",
    ),
    (
      "gemma3_text",
      dict(
        rope_parameters={
          "sliding_attention": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0},
          "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        }
      ),
      "'linear' on the sliding-window layers",
    ),
  ],
)
def test_each_familys_unimplemented_features_are_refused_by_name(kind, changes, message, saved):
  config = {**architectures.read_config(saved(kind)[1]), **changes}
  with pytest.raises(architectures.UnsupportedArchitecture, match=message):
    architectures.from_hf(config)


ALTERNATE = ["sliding_attention", "full_attention", "sliding_attention"]


@pytest.mark.parametrize(
  "kind, changes",
  [
    ("llama", dict(sliding_window=4)),  # Llama, Arcee and Gemma ignore a window.
    ("gemma", dict(sliding_window=4)),
    ("mistral", dict(layer_types=ALTERNATE)),  # Read as Ministral's config: as written.
    ("phi3", dict(layer_types=ALTERNATE)),  # Phi-3 (and Qwen3-MoE) slide every layer.
    ("qwen3", dict(use_sliding_window=True, sliding_window=4, max_window_layers=0)),
    ("qwen3", dict(use_sliding_window=True, sliding_window=4, max_window_layers=3)),
  ],
)
def test_sliding_windows_are_read_as_transformers_reads_the_config(kind, changes, saved, tmp_path):
  """Which layers slide is each family's own rule in transformers (architectures._window): a
  window read where transformers ignores it, or layer_types read where it slides every
  layer, computed another model with no error (the review of 2026-11-29)."""
  import transformers

  directory = copy_with_config(saved(kind)[1], tmp_path / "case", **changes)
  reference = torch_logits(
    transformers.AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager"),
    TOKENS,
  )
  logits, _ = hf.import_model(directory)[0](jnp.asarray(TOKENS))
  assert relative_error(logits, reference) < 1e-4


def test_a_rope_scaling_that_disagrees_with_rope_parameters_is_refused():
  """A rope_scaling added to a transformers-5 config.json (as model cards advise) beside its
  rope_parameters: transformers uses it alone; specsamp merged it under rope_parameters'
  'default' and ran unscaled (2026-11-30). Refused now; one that agrees is read."""
  added = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
  for family, params in (
    ("qwen3", {"rope_type": "default", "rope_theta": 1e6}),
    ("llama", {"rope_type": "default", "rope_theta": 5e5}),
    ("gemma3_text", {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                     "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
  ):  # fmt: skip
    config = minimal_config(family, rope_parameters=params, rope_scaling=added)
    with pytest.raises(ValueError, match="both rope_scaling .* disagree; transformers 5 uses"):
      architectures.from_hf(config)
  # Agreeing keys but no theta: transformers would run its class default, not the 5e5.
  linear = {"rope_type": "linear", "factor": 4.0}
  lost = minimal_config("llama", rope_parameters=dict(linear, rope_theta=5e5), rope_scaling=linear)
  with pytest.raises(ValueError, match="both rope_scaling .* disagree"):
    architectures.from_hf(lost)
  same = dict(linear, rope_theta=5e5)  # What specsamp's export writes: the two alike.
  same = minimal_config("llama", rope_parameters=same, rope_scaling=same)
  assert architectures.from_hf(same).rope_scaling_factor == 4.0


def test_published_config_forms_of_the_new_families():
  """transformers 4's config.json forms: Gemma 3's rope_theta / rope_local_base_freq /
  rope_scaling / sliding_window_pattern and Qwen3-MoE's num_experts; Qwen3 without
  use_sliding_window has no window whatever layer_types says."""
  gemma3 = architectures.from_hf(
    minimal_config(
      "gemma3_text",
      num_hidden_layers=12,
      num_key_value_heads=2,
      head_dim=8,
      rope_theta=1_000_000.0,
      rope_local_base_freq=10_000.0,
      rope_scaling={"rope_type": "linear", "factor": 8.0},
      sliding_window=512,
      sliding_window_pattern=6,
      query_pre_attn_scalar=8,
      hidden_activation="gelu_pytorch_tanh",
    )
  )
  assert (gemma3.rope_theta, gemma3.rope_local_theta) == (1e6, 1e4)
  assert (gemma3.rope_scaling, gemma3.rope_scaling_factor) == ("linear", 8.0)
  assert [gemma3.layer_window(i) for i in range(12)] == [512] * 5 + [None] + [512] * 5 + [None]
  assert gemma3.qk_norm and gemma3.post_norms and gemma3.norm_plus_one
  qwen3_moe = architectures.from_hf(
    minimal_config(
      "qwen3_moe",
      intermediate_size=6144,  # The dense layers' width of the published form: unused here.
      moe_intermediate_size=16,
      num_experts=128,
      num_experts_per_tok=8,
      norm_topk_prob=True,
      num_key_value_heads=2,
      head_dim=8,
      sliding_window=None,
      use_sliding_window=False,
      max_window_layers=48,
    )
  )
  assert (qwen3_moe.num_experts, qwen3_moe.experts_per_token, qwen3_moe.ffn_dim) == (128, 8, 16)
  # No sliding_window key: transformers' default, 4096 (null is no window).
  mistral = minimal_config("mistral")
  assert architectures.from_hf(mistral).sliding_window == 4096
  assert architectures.from_hf(dict(mistral, sliding_window=None)).sliding_window is None
  assert qwen3_moe.normalize_expert_weights and qwen3_moe.sliding_window is None


def test_gemma_legacy_gelu_means_the_tanh_approximation(saved, imported, tmp_path):
  """Released Gemma 1 configs say hidden_act='gelu' and mean tanh GELU, as transformers reads it."""
  directory = copy_with_config(saved("gemma")[1], tmp_path / "legacy", hidden_act="gelu")
  assert hf.import_model(directory)[0].config == imported("gemma").config


def test_tensor_layout_errors(saved, tmp_path):
  source = saved("llama")[1]
  # A config that disagrees with the tensors: a missing tensor, and a shape mismatch.
  deeper = copy_with_config(source, tmp_path / "deeper", num_hidden_layers=4)
  with pytest.raises(architectures.UnsupportedArchitecture, match="lacks 9 tensors"):
    hf.import_model(deeper)
  wider = copy_with_config(source, tmp_path / "wider", intermediate_size=64)
  with pytest.raises(ValueError, match="gate_proj.weight has shape \\(48, 32\\).*\\(64, 32\\)"):
    hf.import_model(wider)
  # Tensors the architecture has no place for (e.g. Qwen3's q/k norms).
  extra = tmp_path / "extra"
  tensors = read_all(source)
  tensors["model.layers.0.self_attn.q_norm.weight"] = np.ones(8, np.float32)
  os.makedirs(extra)
  safetensors_io.write_file(str(extra / "model.safetensors"), tensors)
  write_config(extra, **architectures.read_config(source))
  with pytest.raises(architectures.UnsupportedArchitecture, match="q_norm"):
    hf.import_model(str(extra))
  with pytest.raises(FileNotFoundError, match="No config.json"):
    hf.import_model(str(tmp_path / "nowhere"))
  write_config(tmp_path / "bin", **architectures.read_config(source))
  (tmp_path / "bin" / "pytorch_model.bin").write_bytes(b"")
  with pytest.raises(FileNotFoundError, match="No model.safetensors.*pytorch_model.bin"):
    hf.import_model(str(tmp_path / "bin"))


def test_dtype_problems(saved, tmp_path):
  source = saved("llama")[1]
  config = architectures.read_config(source)
  tensors = read_all(source)
  big = dict(tensors)
  big["model.norm.weight"] = np.full(32, 1e6, np.float32)
  os.makedirs(tmp_path / "big")
  safetensors_io.write_file(str(tmp_path / "big" / "model.safetensors"), big)
  write_config(tmp_path / "big", **config)
  with pytest.raises(ValueError, match="model.norm.weight' overflows float16.*bfloat16"):
    hf.import_model(str(tmp_path / "big"), param_dtype="float16")
  hf.import_model(str(tmp_path / "big"), param_dtype="bfloat16")  # Fits there.
  nan = dict(tensors)
  nan["model.norm.weight"] = np.full(32, np.nan, np.float32)
  os.makedirs(tmp_path / "nan")
  safetensors_io.write_file(str(tmp_path / "nan" / "model.safetensors"), nan)
  write_config(tmp_path / "nan", **config)
  with pytest.raises(ValueError, match="NaN or inf"):
    hf.import_model(str(tmp_path / "nan"))
  ints = dict(tensors)
  ints["model.norm.weight"] = np.ones(32, np.int8)
  os.makedirs(tmp_path / "int")
  safetensors_io.write_file(str(tmp_path / "int" / "model.safetensors"), ints)
  write_config(tmp_path / "int", **config)
  with pytest.raises(ValueError, match="stored as int8, not a float"):
    hf.import_model(str(tmp_path / "int"))
  with pytest.raises(ValueError, match="param_dtype must be one of"):
    hf.import_model(source, param_dtype="int8")


def test_tokenizer_and_vocabulary_mismatches(saved, imported, tmp_path):
  with pytest.raises(FileNotFoundError, match="neither tokenizer.model nor tokenizer.json"):
    hf.load_tokenizer(str(tmp_path))
  (tmp_path / "tokenizer.json").write_text("{}")
  with pytest.raises(ValueError, match="not a tokenizers tokenizer.json"):
    hf.load_tokenizer(str(tmp_path))
  other = hf_models.build("qwen2", vocab_size=101)
  other.save_pretrained(tmp_path / "q2")
  with pytest.raises(
    ValueError, match="draft's vocabulary \\(101\\) differs from the target's \\(97\\)"
  ):
    convert.check_pair(imported("qwen2"), hf.import_model(str(tmp_path / "q2"))[0])


def test_export_refuses_configs_no_hf_architecture_expresses(tiny_model, tmp_path):
  from conftest import tiny_config

  from specsamp.models import transformer as transformer_lib

  odd = transformer_lib.create(tiny_config(norm_plus_one=True, scale_embeddings=False))
  with pytest.raises(architectures.UnsupportedArchitecture, match="scale_embeddings"):
    hf.export_model(odd, str(tmp_path / "odd"))
  assert not (tmp_path / "odd").exists()


def test_a_failed_export_leaves_nothing_and_a_file_is_no_folder(imported, tmp_path):
  """A float16 export of weights past its range wrote inf into the file with only numpy's
  warning (the import refused the same cast by name); now it is refused, and the half-written
  shards are removed (the review of 2026-11-29)."""
  model = imported("llama")
  params = train.params_of(model)
  params["final_norm"]["scale_D"] = params["final_norm"]["scale_D"] * 1e6
  graphdef, state = nnx.split(model, nnx.Param)
  nnx.replace_by_pure_dict(state, params)
  large = nnx.merge(graphdef, state)
  with pytest.raises(ValueError, match="'model.norm.weight' overflows float16.*bfloat16"):
    hf.export_model(large, str(tmp_path / "new" / "in"), dtype="float16", max_shard_bytes=20_000)
  assert not (tmp_path / "new").exists()  # The folders it made, too.
  (tmp_path / "empty").mkdir()
  with pytest.raises(ValueError, match="overflows float16"):
    hf.export_model(large, str(tmp_path / "empty"), dtype="float16", max_shard_bytes=20_000)
  assert os.listdir(tmp_path / "empty") == []
  hf.export_model(large, str(tmp_path / "empty"), dtype="bfloat16")  # Fits there.
  (tmp_path / "a_file").write_text("x")
  with pytest.raises(FileExistsError, match="a_file is a file; an export writes into a folder"):
    hf.export_model(model, str(tmp_path / "a_file"))
  with pytest.raises(NotADirectoryError, match="a_file is a file; an export writes into a new"):
    hf.export_model(model, str(tmp_path / "a_file" / "sub" / "dir"))  # Failed at the write.


def test_tied_embeddings_with_an_output_head_of_other_values_keep_the_head(saved, tmp_path):
  """tie_word_embeddings=true beside an lm_head.weight that differs from the embedding:
  transformers 5 keeps both; specsamp dropped the head, with no error (the review of
  2026-11-29). A head equal to the embedding stays tied."""
  import transformers

  source = saved("llama")[1]
  tensors = read_all(source)
  for name, head in (
    ("other", tensors["lm_head.weight"]),
    ("same", tensors["model.embed_tokens.weight"]),
  ):
    directory = tmp_path / name
    os.makedirs(directory)
    safetensors_io.write_file(
      str(directory / "model.safetensors"), dict(tensors, **{"lm_head.weight": head})
    )
    write_config(directory, **dict(architectures.read_config(source), tie_word_embeddings=True))
    reference = torch_logits(
      transformers.AutoModelForCausalLM.from_pretrained(str(directory)), TOKENS
    )
    model = hf.import_model(str(directory))[0]
    assert model.config.tie_embeddings == (name == "same")
    assert relative_error(model(jnp.asarray(TOKENS))[0], reference) < 1e-4


def test_how_a_model_runs_is_no_part_of_its_export():
  """Layers scanned or unrolled, the attention block size, tensor parallelism: a model
  exports to the same config.json whichever way it runs (the GPU benchmark exports the 8B
  target after choosing its faster layer mode)."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  hf = architectures.read_config(os.path.join(root, "configs/hf/llama-3.2-1b/config.json"))
  hf.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2)
  hf.update(num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512)
  config = architectures.from_hf(hf, param_dtype="bfloat16")
  running = config.replace(scan_layers=False, attention_block_size=0, tensor_parallel="shard_map")
  assert architectures.to_hf(running) == architectures.to_hf(config)
  with pytest.raises(architectures.UnsupportedArchitecture, match="would change"):
    architectures.to_hf(config.replace(norm_plus_one=True))
  # head_dim written out where it is d_model // num_heads (configs/chinchilla_70b.py's 128) is
  # the same model: refused as "'head_dim': (16, None)" until 2026-11-30's review.
  from conftest import tiny_config

  chinchilla = tiny_config()
  explicit = chinchilla.replace(head_dim=chinchilla.d_model // chinchilla.num_heads)
  assert architectures.to_hf(explicit) == architectures.to_hf(chinchilla.replace(head_dim=None))


@pytest.mark.parametrize("model_type", architectures.SUPPORTED_MODEL_TYPES)
def test_a_key_config_json_leaves_out_reads_as_transformers_default(model_type):
  """The values that change no tensor's shape (so no error could catch them) are read as
  transformers reads an absent key: Gemma 2's soft-caps and query scale, Phi-3's and Arcee's
  norm eps, Arcee's activation (the review of 2026-11-29: Gemma 2 off by 0.92 relative)."""
  from transformers import AutoConfig

  hf_config = minimal_config(model_type, num_hidden_layers=4, num_key_value_heads=4, head_dim=8)
  if model_type in ("gemma2", "gemma3_text"):
    hf_config["hidden_activation"] = "gelu_pytorch_tanh"
  if model_type == "qwen3_moe":
    hf_config.update(moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2)
  ours = architectures.from_hf(hf_config)
  theirs = AutoConfig.for_model(**hf_config)
  rope = getattr(theirs, "rope_parameters", None) or {}
  rope = rope.get("full_attention", rope)
  assert ours.norm_eps == theirs.rms_norm_eps
  assert ours.rope_theta == rope.get("rope_theta", getattr(theirs, "rope_theta", None))
  assert ours.tie_embeddings == theirs.tie_word_embeddings
  if model_type in ("gemma2", "gemma3_text"):
    assert ours.attn_logit_softcap == theirs.attn_logit_softcapping
    assert ours.final_logit_softcap == theirs.final_logit_softcapping
    assert ours.query_pre_attn_scalar == theirs.query_pre_attn_scalar
  if model_type == "arcee":
    assert theirs.hidden_act == "relu2" and ours.mlp_activation == "relu2"
  if model_type == "qwen3_moe":
    assert ours.normalize_expert_weights == theirs.norm_topk_prob


@pytest.mark.parametrize("model_type", ["gemma2", "gemma3_text"])
def test_a_gemma_without_a_sliding_window_exports_to_a_model_transformers_runs(
  model_type, tmp_path
):
  """With no window the export wrote sliding_window null and no layer_types: transformers laid
  out its default sliding layers and could not run them. Every layer is now a full one."""
  import transformers

  config = architectures.from_hf(
    minimal_config(
      model_type,
      num_hidden_layers=3,
      num_key_value_heads=2,
      head_dim=8,
      hidden_activation="gelu_pytorch_tanh",
      query_pre_attn_scalar=8,
      layer_types=["full_attention"] * 3,
    )
  )
  assert config.sliding_window is None
  model = transformer.create(config, seed=0)
  hf.export_model(model, str(tmp_path / "out"))
  written = architectures.read_config(str(tmp_path / "out"))
  assert written["layer_types"] == ["full_attention"] * 3
  assert architectures.from_hf(written) == config.replace(max_position=8192)
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(
    str(tmp_path / "out"), attn_implementation="eager"
  ).eval()
  ours, _ = model(jnp.asarray(TOKENS))
  assert relative_error(ours, torch_logits(reloaded, TOKENS)) < 1e-4


def test_max_position_embeddings_is_carried_from_import_to_export():
  """The export wrote 8192 for every model (an imported Llama 3.1's 131072 too, which servers
  size their context from); it is now the imported value, and for a model that records none,
  its llama3 RoPE's scaled range, else 8192."""
  base = minimal_config("llama")
  scaling = dict(
    rope_type="llama3",
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=8192,
  )
  imported = architectures.from_hf(
    dict(base, max_position_embeddings=131072, rope_parameters=scaling)
  )
  assert imported.max_position == 131072
  assert architectures.to_hf(imported)["max_position_embeddings"] == 131072
  # The scaling also in the legacy key transformers 4 and older converters read.
  written = architectures.to_hf(imported)
  assert written["rope_scaling"] == written["rope_parameters"]
  assert written["rope_scaling"]["rope_type"] == "llama3"
  assert architectures.to_hf(architectures.from_hf(base))["rope_scaling"] is None
  unknown = imported.replace(max_position=None)
  assert architectures.to_hf(unknown)["max_position_embeddings"] == 65536
  plain = architectures.from_hf(base)
  assert (
    plain.max_position is None and architectures.to_hf(plain)["max_position_embeddings"] == 8192
  )
  # Nothing is computed with it: a checkpoint's identity leaves it out.
  saved = {"model": dataclasses.asdict(plain.replace(max_position=4096))}
  checkpoint.check_meta(saved, {"model": dataclasses.asdict(plain)}, "here")
  # No tokenizer: bos / eos written as null, not left to a family's default ids.
  assert architectures.to_hf(plain)["eos_token_id"] is None
  assert architectures.to_hf(plain, special_ids={"eos_token_id": 5})["eos_token_id"] == 5


def test_every_id_that_ends_generation_is_exported_and_imported(tmp_path):
  """A tokenizer with several stop ids (an imported Llama 3's or Gemma's generation_config):
  the export lists them all in generation_config.json (transformers reads the list), and an
  import of that folder keeps them."""
  from test_regenerate import word_tokenizer
  from transformers import GenerationConfig

  from specsamp.training import tokenizer as tokenizer_lib

  source = tmp_path / "source"
  word_tokenizer().save(str(source))
  (source / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 9]}))
  tokenizer = tokenizer_lib.load(str(source))
  config = transformer.TransformerConfig(
    vocab_size=64, num_layers=1, d_model=32, num_heads=4, num_kv_heads=2, ffn_dim=64
  )
  model = transformer.create(config, seed=0)
  convert.export_model(model, str(tmp_path / "hf"), tokenizer=tokenizer)
  assert GenerationConfig.from_pretrained(tmp_path / "hf").eos_token_id == [2, 9]
  assert json.loads((tmp_path / "hf" / "config.json").read_text())["eos_token_id"] == 2
  hf.import_to_checkpoint(str(tmp_path / "hf"), str(tmp_path / "ckpt"))
  assert tokenizer_lib.load(str(tmp_path / "ckpt")).stop_ids == (2, 9)
