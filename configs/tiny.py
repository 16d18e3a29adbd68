"""Tiny Transformers of each architecture family, for the model and sampler tests.

tests/conftest.py builds its models from this config; the trained pair behind
the main command is configs/code_pair.py.

The optional argument is "FAMILY" or "FAMILY,draft" (or just "draft"). ",draft"
makes the wide, shallow draft of that family: one layer instead of two, the
same width and vocabulary. FAMILY picks an architecture at the same tiny size:
  chinchilla (default): RMSNorm, plain GELU MLP, untied embeddings, MHA.
  llama:  SwiGLU, grouped-query attention (2 kv heads for 4 query heads).
  qwen2:  as llama, with q/k/v biases.
  gemma:  GeGLU, tied and scaled embeddings, RMSNorm (1 + w), multi-query
          attention, head_dim independent of d_model, logit soft-capping.
"""

import ml_collections
from ml_collections.config_dict import placeholder

FAMILIES = ("chinchilla", "llama", "qwen2", "gemma")


def get_config(arg=None):
  parts = [part for part in (arg or "").split(",") if part]
  is_draft = "draft" in parts
  family = ([part for part in parts if part != "draft"] or ["chinchilla"])[0]
  if family not in FAMILIES or len(parts) > 1 + is_draft:
    raise ValueError(
      f"configs/tiny.py: bad argument {arg!r}; use FAMILY, FAMILY,draft or draft "
      f"with FAMILY one of {FAMILIES} (unknown family)."
    )
  config = ml_collections.ConfigDict()
  config.seed = 0  # Parameter init and sampling seed.

  config.model = ml_collections.ConfigDict()
  m = config.model
  m.vocab_size = 264  # Byte tokenizer's 259 ids, padded to a multiple of 8.
  m.num_layers = 2  # Transformer blocks.
  m.d_model = 64  # Residual stream width.
  m.num_heads = 4  # Query heads.
  m.num_kv_heads = 4  # Key/value heads (4: MHA).
  m.head_dim = placeholder(int)  # None: d_model // num_heads.
  m.ffn_dim = 256  # MLP hidden width (4 x d_model).
  m.mlp_activation = "gelu"  # Plain GELU MLP, as Chinchilla.
  m.rope_theta = 10_000.0  # RoPE base frequency.
  m.norm_eps = 1e-6  # RMSNorm epsilon.
  m.norm_plus_one = False  # RMSNorm scale w (False) or 1 + w (Gemma).
  m.qkv_bias = False  # Biases on q/k/v projections (Qwen2).
  m.tie_embeddings = False  # Output head = transposed input embedding.
  m.scale_embeddings = False  # Multiply embeddings by sqrt(d_model) (Gemma).
  m.attn_logit_softcap = placeholder(float)  # cap * tanh(x / cap) on attention logits (Gemma 2).
  m.final_logit_softcap = placeholder(float)  # The same on output logits (Gemma 2).
  m.dtype = "float32"  # Activations; float32 on CPU.
  m.param_dtype = "float32"  # Stored parameters.
  m.tensor_parallel = "auto"  # 'auto' (jit partitions) or 'shard_map' (explicit psums).
  if family in ("llama", "qwen2"):
    m.num_kv_heads = 2
    m.mlp_activation = "swiglu"
    m.ffn_dim = 172
    m.rope_theta = 500_000.0
    m.qkv_bias = family == "qwen2"
  elif family == "gemma":
    m.num_kv_heads = 1
    m.head_dim = 32
    m.mlp_activation = "geglu"
    m.norm_plus_one = True
    m.tie_embeddings = True
    m.scale_embeddings = True
    m.attn_logit_softcap = 50.0
    m.final_logit_softcap = 30.0
  if is_draft:
    m.num_layers = 1  # Shallow: the draft's cost is dominated by sequential layers.

  config.mesh = ml_collections.ConfigDict()
  config.mesh.data = -1  # Batch parallelism; -1 takes the remaining devices.
  config.mesh.fsdp = 1  # Batch for activations, parameters sharded along d_model.
  config.mesh.expert = 1  # Expert parallelism: a mixture of experts' experts.
  config.mesh.tensor = 1  # Megatron tensor parallelism over heads / MLP / vocab.
  config.mesh.rules = ""  # Sharding rule overrides, e.g. "embed=none" (sharding.parse_rules).

  config.sampling = ml_collections.ConfigDict()
  config.sampling.max_new_tokens = 32  # Tokens generated per prompt.
  config.sampling.temperature = 1.0  # 0 is greedy; 1 samples the model as it is.
  config.sampling.top_k = 0  # 0 keeps every token.
  config.sampling.top_p = 1.0  # Nucleus mass, in (0, 1].
  config.sampling.use_eos = True  # Stop a row at the tokenizer's EOS id.

  config.speculative = ml_collections.ConfigDict()
  config.speculative.num_draft_tokens = 4  # K, draft tokens per target call.
  config.speculative.verifier = "token"  # 'token' (Chen et al.) or 'block' (Sun et al.).
  return config
