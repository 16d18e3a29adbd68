"""The paper's draft: a wide, shallow 4B Chinchilla-style model (Chen et al. 2023, sec. 4).

8 layers, d_model 6144, 48 heads of dim 128, FFN 4 x d_model, vocab 32k (the
target's tokenizer); about 4.0e9 parameters. Few layers mean few sequential
steps and few tensor-parallel reductions per token (2 per layer), which is why
the paper made the draft wide and shallow.

A model config, like chinchilla_70b.py: a pair config takes its ``model``
section as ``draft.model``.
"""

import ml_collections
from ml_collections.config_dict import placeholder


def get_config(arg=None):
  del arg
  config = ml_collections.ConfigDict()
  config.seed = 0  # Parameter init and sampling seed.

  config.model = ml_collections.ConfigDict()
  m = config.model
  m.vocab_size = 32_000  # Shared with the 70B target.
  m.num_layers = 8  # Shallow: 8 sequential blocks.
  m.d_model = 6144  # Wide residual stream.
  m.num_heads = 48  # Query heads.
  m.num_kv_heads = 48  # Key/value heads (MHA).
  m.head_dim = 128  # Head dim.
  m.ffn_dim = 4 * 6144  # MLP hidden width, 4 x d_model.
  m.mlp_activation = "gelu"  # Plain (non-gated) MLP.
  m.rope_theta = 10_000.0  # RoPE base.
  m.norm_eps = 1e-6  # RMSNorm epsilon.
  m.norm_plus_one = False  # RMSNorm scale w.
  m.qkv_bias = False  # No projection biases.
  m.tie_embeddings = False  # Separate output head.
  m.scale_embeddings = False  # No sqrt(d_model) embedding scale.
  m.attn_logit_softcap = placeholder(float)  # No soft-capping.
  m.final_logit_softcap = placeholder(float)  # No soft-capping.
  m.dtype = "bfloat16"  # Activations on accelerators.
  m.param_dtype = "bfloat16"  # Stored parameters.
  m.tensor_parallel = "shard_map"  # Explicit Megatron collectives: 2 psums per layer.
  m.scan_layers = True  # One lax.scan over the stacked layers: compile time independent of depth.
  m.attention_block_size = 256  # Read the KV cache in blocks up to the live position; 0: all.

  config.mesh = ml_collections.ConfigDict()
  config.mesh.data = 1  # Batch 1 decoding.
  config.mesh.fsdp = 1  # Parameters whole along d_model.
  config.mesh.expert = 1  # Expert parallelism: a mixture of experts' experts.
  config.mesh.tensor = -1  # All devices tensor parallel.
  config.mesh.rules = ""  # Sharding rule overrides, e.g. "embed=none" (sharding.parse_rules).

  config.sampling = ml_collections.ConfigDict()
  config.sampling.max_new_tokens = 128  # Tokens generated per prompt.
  config.sampling.temperature = 0.8  # Nucleus setting.
  config.sampling.top_k = 0  # No top-k.
  config.sampling.top_p = 0.95  # Nucleus mass.
  config.sampling.use_eos = True  # Stop a row at the tokenizer's EOS id.

  config.speculative = ml_collections.ConfigDict()
  config.speculative.num_draft_tokens = 4  # K (the paper: 4 for Chinchilla 70B).
  config.speculative.verifier = "token"  # 'token' (Chen et al.) or 'block' (Sun et al.).
  return config
