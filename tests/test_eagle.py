"""Published EAGLE-3 heads: a tiny head written in the EAGLE project's format (config.json,
model.safetensors or pytorch_model.bin, d2t as offsets) is imported and checked against an
independent NumPy forward of the EAGLE-3 layer; round trip; refusals; and sampling with it."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from specsamp.hf import eagle
from specsamp.hf.safetensors_io import write_file
from specsamp.models import transformer
from specsamp.models.config import TransformerConfig
from specsamp.sampling import autoregressive, speculative
from specsamp.sampling.feature_drafter import FeatureDrafter

# EAGLE-3 heads against their torch reference (the inner loop skips them).
pytestmark = pytest.mark.slow

D, H, KV, HD, F, V, VD, N = 32, 4, 2, 8, 48, 64, 24, 8
TARGET = TransformerConfig(
  vocab_size=V,
  num_layers=N,
  d_model=D,
  num_heads=4,
  num_kv_heads=2,
  ffn_dim=64,
  rope_theta=500_000.0,  # The target's base; the head's is its own (10000).
)


@pytest.fixture(scope="module")
def target():
  return transformer.create(TARGET, seed=1)


def _hf_head(seed=0):
  rng = np.random.default_rng(seed)
  w = lambda *shape: (rng.normal(size=shape) / np.sqrt(shape[-1])).astype(np.float32)  # noqa: E731
  tensors = {
    "fc.weight": w(D, 3 * D),
    "midlayer.self_attn.q_proj.weight": w(H * HD, 2 * D),
    "midlayer.self_attn.k_proj.weight": w(KV * HD, 2 * D),
    "midlayer.self_attn.v_proj.weight": w(KV * HD, 2 * D),
    "midlayer.self_attn.o_proj.weight": w(D, H * HD),
    "midlayer.mlp.gate_proj.weight": w(F, D),
    "midlayer.mlp.up_proj.weight": w(F, D),
    "midlayer.mlp.down_proj.weight": w(D, F),
    "midlayer.input_layernorm.weight": 1 + 0.1 * w(D),
    "midlayer.hidden_norm.weight": 1 + 0.1 * w(D),
    "midlayer.post_attention_layernorm.weight": 1 + 0.1 * w(D),
    "norm.weight": 1 + 0.1 * w(D),
    "lm_head.weight": w(VD, D),
  }
  used = np.sort(rng.choice(V, VD, replace=False))
  tensors["d2t"] = (used - np.arange(VD)).astype(np.int64)
  t2d = np.zeros(V, bool)
  t2d[used] = True
  tensors["t2d"] = t2d
  config = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": D,
    "intermediate_size": F,
    "num_attention_heads": H,
    "num_key_value_heads": KV,
    "num_hidden_layers": 1,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "vocab_size": V,
    "draft_vocab_size": VD,
  }  # No rope_theta: EAGLE-3's 10000.
  return tensors, config, used


def _write(directory, tensors, config, torch_format=False):
  directory.mkdir(parents=True, exist_ok=True)
  (directory / "config.json").write_text(json.dumps(config))
  if torch_format:
    import torch

    torch.save(
      {k: torch.from_numpy(np.asarray(v)) for k, v in tensors.items()},
      directory / "pytorch_model.bin",
    )
  else:
    write_file(str(directory / "model.safetensors"), tensors)
  return str(directory)


def _reference(tensors, embedded, fused_input, theta=10_000.0, eps=1e-5):
  """The EAGLE-3 layer in NumPy float64, over a sequence at positions 0..T-1 (causal):
  x = [input_layernorm(e) | hidden_norm(g)], residual g, q/k/v [out, in], rotate-half RoPE."""
  t = {k: np.asarray(v, np.float64) for k, v in tensors.items()}
  norm = lambda x, w: x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w  # noqa: E731
  g = fused_input @ t["fc.weight"].T
  x = np.concatenate(
    [
      norm(embedded, t["midlayer.input_layernorm.weight"]),
      norm(g, t["midlayer.hidden_norm.weight"]),
    ],
    -1,
  )
  length = x.shape[0]
  q = (x @ t["midlayer.self_attn.q_proj.weight"].T).reshape(length, H, HD)
  k = (x @ t["midlayer.self_attn.k_proj.weight"].T).reshape(length, KV, HD)
  v = (x @ t["midlayer.self_attn.v_proj.weight"].T).reshape(length, KV, HD)
  inv = 1.0 / theta ** (np.arange(0, HD, 2) / HD)
  angles = np.arange(length)[:, None] * inv
  cos, sin = (
    np.cos(np.concatenate([angles, angles], -1)),
    np.sin(np.concatenate([angles, angles], -1)),
  )
  rotate = lambda a: np.concatenate([-a[..., HD // 2 :], a[..., : HD // 2]], -1)  # noqa: E731
  q = q * cos[:, None] + rotate(q) * sin[:, None]
  k = k * cos[:, None] + rotate(k) * sin[:, None]
  k, v = np.repeat(k, H // KV, axis=1), np.repeat(v, H // KV, axis=1)
  scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(HD)
  scores = np.where(np.tril(np.ones((length, length), bool)), scores, -np.inf)
  weights = np.exp(scores - scores.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  attended = np.einsum("hts,shd->thd", weights, v).reshape(length, H * HD)
  h = g + attended @ t["midlayer.self_attn.o_proj.weight"].T
  m = norm(h, t["midlayer.post_attention_layernorm.weight"])
  gate, up = m @ t["midlayer.mlp.gate_proj.weight"].T, m @ t["midlayer.mlp.up_proj.weight"].T
  h = h + (gate / (1 + np.exp(-gate)) * up) @ t["midlayer.mlp.down_proj.weight"].T
  logits = norm(h, t["norm.weight"]) @ t["lm_head.weight"].T
  return h, logits


@nnx.jit
def _head_forward(target, model, tokens):
  """The target's features on ``tokens``, the embedded following tokens, and the imported
  head's hidden states and logits from them: one program (eagerly, 144 small compiles)."""
  features = target(tokens, capture_layers=model.feature_layers).features
  following = jnp.roll(tokens, -1, axis=1)
  h, _ = model.hidden(
    following, model.head.fuse(features), jnp.arange(7)[None], model.init_cache(1, 8)
  )
  return features, target.embedder.encode(following), h, model.logits(h)


@pytest.mark.parametrize("torch_format", [False, True])
def test_an_eagle3_head_imports_and_matches_the_reference_forward(target, tmp_path, torch_format):
  tensors, config, used = _hf_head()
  model = eagle.load_eagle3(_write(tmp_path / "head", tensors, config, torch_format), target)
  assert model.feature_layers == (2, N // 2, N - 3)  # EAGLE-3's layers for an 8-layer target.
  assert model.head.layer.rope_theta == 10_000.0 and model.head.layer.rope_scaling == "none"
  np.testing.assert_array_equal(model.head.draft_to_target[...], used)  # d2t offsets undone.
  tokens = jax.random.randint(jax.random.key(0), (1, 7), 0, V)
  features, embedded, h, logits = _head_forward(target, model, tokens)
  expected_h, expected_logits = _reference(
    tensors, np.asarray(embedded[0], np.float64), np.asarray(features[0], np.float64)
  )
  np.testing.assert_allclose(h[0], expected_h, atol=2e-4, rtol=2e-4)
  logits = np.asarray(logits)[0]
  np.testing.assert_allclose(logits[:, used], expected_logits, atol=2e-4, rtol=2e-4)
  assert np.all(np.isneginf(np.delete(logits, used, axis=1)))  # q = 0 off the draft vocabulary.


def test_save_and_load_round_trip_and_sampling_with_an_imported_head(target, tmp_path):
  tensors, config, _ = _hf_head(seed=1)
  model = eagle.load_eagle3(_write(tmp_path / "a", tensors, config), target)
  eagle.save_eagle3(model, str(tmp_path / "b"))
  again = eagle.load_eagle3(str(tmp_path / "b"), target)
  for name in ("fc_FD", "q_ENH", "o_NHD", "out_DW", "draft_to_target"):
    np.testing.assert_array_equal(getattr(again.head, name)[...], getattr(model.head, name)[...])
  prompts, lengths = jnp.asarray([[3, 9, 27, 1], [5, 0, 0, 0]], jnp.int32), jnp.asarray([4, 1])
  out = speculative.speculative_generate(
    target,
    FeatureDrafter(again),
    prompts,
    lengths,
    jax.random.key(0),
    max_new_tokens=10,
    num_draft_tokens=3,
    temperature=0.0,
  )
  expected = autoregressive.generate(
    target, prompts, lengths, jax.random.key(0), max_new_tokens=10, temperature=0.0
  )
  np.testing.assert_array_equal(out.tokens, expected.tokens)


@pytest.mark.parametrize(
  "change,message",
  [
    (dict(bias=True), "fc bias"),
    (dict(hidden_size=64), "hidden_size 64"),
    (dict(num_hidden_layers=2), "num_hidden_layers"),
    (dict(norm_before_residual=True), "norm_before_residual"),
    (dict(vocab_size=65), "vocab_size 65"),
    # Read with no error before the review of 2026-11-29, the head then ran at another RoPE.
    (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "RoPE scaling 'yarn'"),
    (dict(rope_scaling={"type": "linear", "factor": 2.0}), "RoPE scaling 'linear'"),
    (dict(attention_bias=True), "attention biases"),
    (dict(num_attention_heads=None), "lacks num_attention_heads"),
  ],
)
def test_what_the_head_cannot_be_is_refused_by_name(target, tmp_path, change, message):
  tensors, config, _ = _hf_head()
  changed = {k: v for k, v in dict(config, **change).items() if v is not None}
  with pytest.raises(eagle.EagleImportError, match=message):
    eagle.load_eagle3(_write(tmp_path / "h", tensors, changed), target)


def test_missing_or_misshaped_tensors_and_bad_maps_are_refused(target, tmp_path):
  tensors, config, _ = _hf_head()
  with pytest.raises(eagle.EagleImportError, match="lacks fc.weight"):
    eagle.load_eagle3(
      _write(tmp_path / "a", {k: v for k, v in tensors.items() if k != "fc.weight"}, config), target
    )
  with pytest.raises(eagle.EagleImportError, match="norm.weight has shape"):
    eagle.load_eagle3(
      _write(tmp_path / "b", dict(tensors, **{"norm.weight": np.ones(5, np.float32)}), config),
      target,
    )
  bad = dict(tensors, d2t=np.zeros(VD, np.int64) + V)
  with pytest.raises(eagle.EagleImportError, match="outside"):
    eagle.load_eagle3(_write(tmp_path / "c", bad, config), target)
  with pytest.raises(FileNotFoundError, match="config.json"):
    eagle.load_eagle3(str(tmp_path / "nothing"), target)
  extra = dict(tensors, **{"fc.bias": np.zeros(tensors["fc.weight"].shape[0], np.float32)})
  with pytest.raises(eagle.EagleImportError, match=r"no place for: \['fc.bias'\]"):
    eagle.load_eagle3(_write(tmp_path / "d", extra, config), target)
  # A RoPE buffer some modelling code saves is ignored, as the HF import ignores it.
  buffer = {"midlayer.self_attn.rotary_emb.inv_freq": np.ones(4, np.float32)}
  eagle.load_eagle3(_write(tmp_path / "e", dict(tensors, **buffer), config), target)


def test_the_rope_base_of_transformers_5s_config_form_is_read(target):
  tensors, config, _ = _hf_head()
  config = {k: v for k, v in config.items() if k != "rope_theta"}
  form = dict(config, rope_parameters={"rope_type": "default", "rope_theta": 5e5})
  assert eagle.head_config(form, target).rope_theta == 5e5


def test_a_published_eagle3_head_is_refused_as_a_parallel_head(tmp_path):
  """--config.feature.parallel_checkpoint naming an EAGLE-3 folder loaded a sequential head
  under the parallel head's name (it drafted K calls, benchmarks labelled it parallel)."""
  import ml_collections
  from conftest import tiny_config

  from specsamp.experiments.jobs import pair as pair_lib
  from specsamp.models import feature_head

  target = transformer.create(tiny_config(mlp_activation="swiglu"), seed=0)
  head = feature_head.create(
    feature_head.FeatureHeadConfig(draft_vocab_size=64), target.config, seed=1
  )
  folder = str(tmp_path / "eagle")
  eagle.save_eagle3(feature_head.FeatureDraftModel(head, target), folder)
  section = ml_collections.ConfigDict(dict(checkpoint=folder, head=dict(parallel=True)))
  with pytest.raises(ValueError, match="parallel feature head needs one trained for it"):
    pair_lib._train_feature_head(section, target, None, None, None, str(tmp_path / "x"), 0, {})
  section.head.parallel = False  # As the sequential head it is: loaded.
  loaded = pair_lib._train_feature_head(section, target, None, None, None, str(tmp_path), 0, {})
  assert not loaded.head.config.parallel


def test_a_head_the_eagle3_format_cannot_hold_is_refused_and_a_saved_one_reads_as_llama(
  tmp_path,
):
  """save_eagle3 wrote a head on the target's llama3-scaled RoPE as unscaled (reloaded, its
  hidden states moved by 0.26 of 5.8), failed with an AttributeError over a GELU target, and
  wrote no model_type, which AutoConfig (vLLM, SGLang) reads (the review of 2026-11-30)."""
  from conftest import tiny_config
  from transformers import AutoConfig

  from specsamp.models import feature_head

  def saved(folder, **target_changes):
    changes = {"mlp_activation": "swiglu", **target_changes}
    target = transformer.create(tiny_config(**changes), seed=0)
    config = feature_head.FeatureHeadConfig(draft_vocab_size=64)
    head = feature_head.create(config, target.config, seed=1)
    eagle.save_eagle3(feature_head.FeatureDraftModel(head, target), str(tmp_path / folder))

  saved("plain")
  assert AutoConfig.from_pretrained(str(tmp_path / "plain")).model_type == "llama"
  with pytest.raises(eagle.EagleImportError, match="'llama3'-scaled RoPE"):
    saved("scaled", rope_scaling="llama3", rope_scaling_factor=8.0)
  with pytest.raises(eagle.EagleImportError, match="runs the target's 'gelu' MLP"):
    saved("gelu", mlp_activation="gelu")
