"""Tiny random Hugging Face models of each supported architecture, built offline with
transformers (the `hf` extra) and saved as safetensors directories."""

from __future__ import annotations

import copy

import torch
import transformers

VOCAB = 97

# Each architecture with the features that make it differ from plain Llama switched on,
# at sizes small enough to matter: a window of 4 < the test sequences, a RoPE scaling
# ramp inside the head's frequencies, soft-caps the logits reach.
ARCHITECTURES = {
  "llama": (
    transformers.LlamaConfig,
    dict(
      rope_parameters={
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
      }
    ),
  ),
  "mistral": (transformers.MistralConfig, dict(sliding_window=4)),
  "qwen2": (transformers.Qwen2Config, dict(tie_word_embeddings=True)),
  "arcee": (transformers.ArceeConfig, dict(hidden_act="gelu_pytorch_tanh")),
  "gemma": (transformers.GemmaConfig, dict()),
  "gemma2": (
    transformers.Gemma2Config,
    dict(
      sliding_window=4,
      query_pre_attn_scalar=16,
      attn_logit_softcapping=8.0,
      final_logit_softcapping=6.0,
    ),
  ),
  "qwen3": (transformers.Qwen3Config, dict()),
  # Sliding layers 0 and 2 with a RoPE base of their own; the global layer 1 with another
  # base and linear RoPE scaling (Gemma 3 scales only its global layers).
  "gemma3_text": (
    transformers.Gemma3TextConfig,
    dict(
      sliding_window=4,
      query_pre_attn_scalar=16,
      layer_types=["sliding_attention", "full_attention", "sliding_attention"],
      rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "rope_theta": 100.0, "factor": 4.0},
      },
    ),
  ),
  "phi3": (transformers.Phi3Config, dict(sliding_window=5)),
  "qwen3_moe": (
    transformers.Qwen3MoeConfig,
    dict(moe_intermediate_size=16, num_experts=6, num_experts_per_tok=2, norm_topk_prob=True),
  ),
}


def config(kind: str, **changes) -> transformers.PretrainedConfig:
  cls, extra = ARCHITECTURES[kind]
  fields = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=128,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
  )
  fields.update(extra)
  fields.update(changes)
  return cls(**fields)


def build(kind: str, seed: int = 0, **changes) -> torch.nn.Module:
  """A random model whose every tensor (norm scales and biases too) is far from its init,
  so that a wrongly mapped tensor cannot go unnoticed."""
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(
    config(kind, **changes), attn_implementation="eager"
  ).eval()
  gemma = kind.startswith("gemma")
  # Gemma norms scale by (1 + w). Its sqrt(d)-scaled tied embeddings at the other tensors'
  # scale make a random model repeat one token forever, which would test little.
  base, norm_noise, embed_std = (0.0, 1.0, 0.1) if gemma else (1.0, 0.2, 0.3)
  with torch.no_grad():
    for name, param in model.named_parameters():
      if "norm" in name:
        param.copy_(base + norm_noise * torch.randn_like(param))
      else:
        param.normal_(0.0, embed_std if "embed" in name else 0.3)
  return model


def perturbed(model: torch.nn.Module, scale: float, seed: int) -> torch.nn.Module:
  """A copy with noise of ``scale`` x each tensor's std: a draft that often agrees."""
  torch.manual_seed(seed)
  draft = copy.deepcopy(model)
  with torch.no_grad():
    for param in draft.parameters():
      param.add_(scale * param.std() * torch.randn_like(param))
  return draft


def generate(model: torch.nn.Module, prompt: torch.Tensor, max_new_tokens: int, **options):
  """transformers' generate for exactly ``max_new_tokens`` (no EOS stop); new tokens only."""
  model.generation_config.eos_token_id = None
  model.generation_config.pad_token_id = 0
  with torch.no_grad():
    out = model.generate(
      prompt, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, **options
    )
  return out[:, prompt.shape[1] :].numpy()
