"""The frozen Transformer config, built from an ``ml_collections.ConfigDict``.

One dataclass covers the three families specsamp has to load:

* Chinchilla-style (the paper's 70B target and its 4B draft): RMSNorm, a plain
  (non-gated) GELU MLP of width 4 x d_model, untied embeddings. Chinchilla used
  Transformer-XL relative positions; specsamp uses RoPE in their place (the
  position scheme does not change speculative sampling, only the scores).
* Llama / Mistral / Qwen2: RMSNorm, RoPE with configurable theta, grouped- or
  multi-query attention (``num_kv_heads``), SwiGLU, untied embeddings, optional
  q/k/v biases (Qwen2).
* Gemma: GeGLU, tied embeddings scaled by sqrt(d_model), RMSNorm with (1 + w),
  head_dim independent of d_model, optional logit soft-capping (Gemma 2).
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp

from specsamp.config_fields import ConfigFields

# How a model runs, not what it computes from its weights: a checkpoint trained with one value
# loads with another (checkpoint identity checks leave these out).
EXECUTION_FIELDS = (
  "dtype",
  "tensor_parallel",
  "scan_layers",
  "attention_block_size",
  "moe_compute",
)
# What a model says about itself and computes nothing with: identity checks leave these out too.
DESCRIPTIVE_FIELDS = ("max_position",)
# What a model's identity leaves out (checkpoint checks, a head's record of its target, the
# export's round trip): how it runs, and what it only says about itself.
NOT_IDENTITY_FIELDS = EXECUTION_FIELDS + DESCRIPTIVE_FIELDS
MLP_ACTIVATIONS = ("gelu", "relu", "relu2", "swiglu", "geglu")
ROPE_SCALINGS = ("none", "linear", "llama3")
TENSOR_PARALLEL_MODES = ("auto", "shard_map")
MOE_COMPUTE = ("sparse", "dense")
DTYPES = ("float32", "bfloat16", "float16", "float64")
NO_WINDOW = 2**30  # A layer's window when it has none: wider than any cache.


@dataclasses.dataclass(frozen=True)
class TransformerConfig(ConfigFields):
  """Architecture of a decoder-only Transformer. Hashable, so usable as a static arg.

  Attributes:
    vocab_size: V, number of token ids.
    num_layers: L, number of Transformer blocks.
    d_model: D, width of the residual stream.
    num_heads: N, query heads.
    num_kv_heads: K, key/value heads; must divide num_heads (GQA/MQA when < N).
    head_dim: H; None means d_model // num_heads (Gemma sets it independently).
    ffn_dim: F, hidden width of the MLP.
    mlp_activation: 'gelu', 'relu' or 'relu2' (relu squared) for a plain MLP,
      'swiglu' or 'geglu' for a gated one.
    gelu_approximate: GELU by its tanh approximation (Gemma's
      'gelu_pytorch_tanh', the default) or exactly with erf ('gelu').
    rope_theta: base of the rotary position embedding frequencies.
    norm_eps: epsilon of RMSNorm.
    norm_plus_one: scale RMSNorm by (1 + w) with w initialised at 0 (Gemma).
    qkv_bias: learnable biases on the q/k/v projections (Qwen2).
    tie_embeddings: the output head is the transposed input embedding.
    scale_embeddings: multiply input embeddings by sqrt(d_model) (Gemma).
    attn_logit_softcap: if set, attention logits -> cap * tanh(logits / cap).
    final_logit_softcap: if set, output logits -> cap * tanh(logits / cap).
    query_pre_attn_scalar: queries are scaled by this ** -0.5; None means
      head_dim ** -0.5 (Gemma 2 sets it).
    post_norms: RMSNorm also the outputs of attention and MLP before the
      residual add ("sandwich" norms, Gemma 2).
    sliding_window: if set, a query at position p attends only to positions
      (p - sliding_window, p] in the layers that use it.
    sliding_window_pattern: which layers use the window: 1 means every layer
      (Mistral); P > 1 means layer i does iff (i + 1) % P != 0 (Gemma 2: P=2,
      even layers local, odd layers global).
    qk_norm: RMSNorm (over head_dim, its own scale per layer, with (1 + w) under
      ``norm_plus_one``) on every query and key head after the projections, before RoPE
      (Qwen3, Gemma 3).
    rope_local_theta: the RoPE base of the sliding-window layers, which then take no RoPE
      scaling (Gemma 3's ``rope_local_base_freq``); None: every layer uses ``rope_theta``
      and the scaling.
    num_experts: E > 0 replaces every layer's MLP by a routed mixture of E gated experts
      of width ``ffn_dim`` each (``models/moe.py``); 0: a dense MLP.
    experts_per_token: k, the experts each token is routed to (top-k of the router's
      softmax).
    normalize_expert_weights: renormalise the k routing weights to sum to one
      (Qwen3-MoE's ``norm_topk_prob``; Mixtral always does).
    moe_compute: 'sparse' (a loop over the experts the call's tokens selected: a step reads
      only those) or 'dense' (every expert on every token: the reference); see ``moe.py``.
    rope_scaling: 'none', 'linear' (positions / rope_scaling_factor) or
      'llama3' (Llama 3.1+: low frequencies divided by the factor, high ones
      kept, a smooth ramp between).
    rope_scaling_factor, rope_low_freq_factor, rope_high_freq_factor,
    rope_original_max_position: the scaling's parameters (as in HF configs).
    max_position: the context the model was made for (HF ``max_position_embeddings``: read on
      import, written back on export, where servers size their context from it); None when
      unknown. Nothing is computed with it.
    dtype: dtype of activations ('float32' on CPU, 'bfloat16' on accelerators).
    param_dtype: dtype parameters are stored in.
    tensor_parallel: 'auto' lets jit partition attention and MLP from the
      rules table; 'shard_map' runs them under ``jax.shard_map`` with explicit
      Megatron collectives (one psum after each output projection).
    scan_layers: run the blocks as ONE ``jax.lax.scan`` over their stacked parameters
      (compile time independent of depth); False unrolls them in a Python loop over the
      same stacked parameters (the reference the scan is tested against).
    attention_block_size: read a KV cache longer than this in blocks of this many slots, only
      up to the furthest position in the batch (``attention.attend_blocked``); 0 reads every
      allocated slot in one einsum.
  """

  vocab_size: int
  num_layers: int
  d_model: int
  num_heads: int
  num_kv_heads: int
  ffn_dim: int
  head_dim: int | None = None
  mlp_activation: str = "swiglu"
  gelu_approximate: bool = True
  rope_theta: float = 10_000.0
  norm_eps: float = 1e-6
  norm_plus_one: bool = False
  qkv_bias: bool = False
  tie_embeddings: bool = False
  scale_embeddings: bool = False
  attn_logit_softcap: float | None = None
  final_logit_softcap: float | None = None
  query_pre_attn_scalar: float | None = None
  post_norms: bool = False
  sliding_window: int | None = None
  sliding_window_pattern: int = 1
  qk_norm: bool = False
  rope_local_theta: float | None = None
  num_experts: int = 0
  experts_per_token: int = 0
  normalize_expert_weights: bool = False
  moe_compute: str = "sparse"
  rope_scaling: str = "none"
  rope_scaling_factor: float = 1.0
  rope_low_freq_factor: float = 1.0
  rope_high_freq_factor: float = 4.0
  rope_original_max_position: int = 8192
  max_position: int | None = None
  dtype: str = "float32"
  param_dtype: str = "float32"
  tensor_parallel: str = "auto"
  scan_layers: bool = True
  attention_block_size: int = 256

  def __post_init__(self):
    for name in ("vocab_size", "num_layers", "d_model", "num_heads", "num_kv_heads", "ffn_dim"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"TransformerConfig.{name} must be a positive int, got {value!r}.")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
        f"num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}: "
        "each key/value head serves a whole group of query heads."
      )
    if self.head_dim is None and self.d_model % self.num_heads:
      raise ValueError(
        f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}; "
        "set head_dim explicitly."
      )
    if self.resolved_head_dim < 2 or self.resolved_head_dim % 2:
      raise ValueError(f"head_dim must be even for RoPE, got {self.resolved_head_dim}.")
    if self.mlp_activation not in MLP_ACTIVATIONS:
      raise ValueError(
        f"mlp_activation must be one of {MLP_ACTIVATIONS}, got {self.mlp_activation!r}."
      )
    if self.max_position is not None and (
      not isinstance(self.max_position, int) or self.max_position < 1
    ):
      raise ValueError(f"max_position must be None or an int >= 1, got {self.max_position!r}.")
    if not isinstance(self.attention_block_size, int) or self.attention_block_size < 0:
      raise ValueError(
        f"attention_block_size must be an int >= 0, got {self.attention_block_size!r}."
      )
    if not isinstance(self.scan_layers, bool):
      raise ValueError(f"scan_layers must be True or False, got {self.scan_layers!r}.")
    if self.tensor_parallel not in TENSOR_PARALLEL_MODES:
      raise ValueError(
        f"tensor_parallel must be one of {TENSOR_PARALLEL_MODES}, got {self.tensor_parallel!r}."
      )
    for name in ("dtype", "param_dtype"):
      if getattr(self, name) not in DTYPES:
        raise ValueError(f"{name} must be one of {DTYPES}, got {getattr(self, name)!r}.")
    for name in ("attn_logit_softcap", "final_logit_softcap", "query_pre_attn_scalar"):
      value = getattr(self, name)
      if value is not None and value <= 0:
        raise ValueError(f"{name} must be positive or None, got {value}.")
    if self.sliding_window is not None and (
      not isinstance(self.sliding_window, int) or self.sliding_window < 1
    ):
      raise ValueError(
        f"sliding_window must be a positive int or None, got {self.sliding_window!r}."
      )
    if not isinstance(self.sliding_window_pattern, int) or self.sliding_window_pattern < 1:
      raise ValueError(
        f"sliding_window_pattern must be an int >= 1, got {self.sliding_window_pattern!r}."
      )
    if not isinstance(self.num_experts, int) or self.num_experts < 0:
      raise ValueError(f"num_experts must be an int >= 0, got {self.num_experts!r}.")
    if self.num_experts:
      if not 1 <= self.experts_per_token <= self.num_experts:
        raise ValueError(
          f"experts_per_token must be in [1, num_experts={self.num_experts}], got "
          f"{self.experts_per_token!r}."
        )
      if not self.gated_mlp:
        raise ValueError(
          f"A mixture of experts needs gated experts (swiglu or geglu), got "
          f"mlp_activation={self.mlp_activation!r}."
        )
    if self.moe_compute not in MOE_COMPUTE:
      raise ValueError(f"moe_compute must be one of {MOE_COMPUTE}, got {self.moe_compute!r}.")
    # Settings that do nothing without another: a typo's likeliest sign (a review of
    # 2026-11-30 found them accepted silently).
    for setting, needs, idle in (
      ("experts_per_token", "num_experts", self.num_experts == 0 and self.experts_per_token != 0),
      (
        "sliding_window_pattern",
        "sliding_window",
        self.sliding_window is None and self.sliding_window_pattern != 1,
      ),
      (
        "rope_scaling_factor",
        "rope_scaling",
        self.rope_scaling == "none" and self.rope_scaling_factor != 1.0,
      ),
    ):
      if idle:
        raise ValueError(
          f"{setting}={getattr(self, setting)!r} does nothing without {needs} "
          f"(it is {getattr(self, needs)!r}): set {needs} too, or leave {setting} at its default."
        )
    try:  # A NumPy scalar (a GGUF file's float32) is a number too.
      rope_theta = float(self.rope_theta)
    except (TypeError, ValueError):
      rope_theta = math.nan
    if not (math.isfinite(rope_theta) and rope_theta > 0):
      raise ValueError(
        f"rope_theta must be a finite number > 0 (the RoPE base), got {self.rope_theta!r}; "
        "0 or less made every logit NaN."
      )
    if self.rope_local_theta is not None and (
      self.rope_local_theta <= 0 or self.sliding_window is None
    ):
      raise ValueError(
        f"rope_local_theta={self.rope_local_theta} needs to be positive and a sliding window "
        "(it is the RoPE base of the sliding-window layers)."
      )
    if self.rope_scaling not in ROPE_SCALINGS:
      raise ValueError(f"rope_scaling must be one of {ROPE_SCALINGS}, got {self.rope_scaling!r}.")
    if (
      self.rope_scaling_factor <= 0
      or self.rope_high_freq_factor <= self.rope_low_freq_factor
      and self.rope_scaling == "llama3"
    ):
      raise ValueError(
        f"rope scaling needs factor > 0 and (for llama3) high_freq_factor > low_freq_factor; got "
        f"factor={self.rope_scaling_factor}, low={self.rope_low_freq_factor}, "
        f"high={self.rope_high_freq_factor}."
      )

  @property
  def resolved_head_dim(self) -> int:
    return self.head_dim if self.head_dim is not None else self.d_model // self.num_heads

  def layer_window(self, layer: int) -> int | None:
    """The sliding window of ``layer`` (None: it attends to the whole cache)."""
    if self.sliding_window is None:
      return None
    pattern = self.sliding_window_pattern
    return self.sliding_window if pattern == 1 or (layer + 1) % pattern else None

  def layer_windows(self) -> tuple[int, ...] | None:
    """Every layer's sliding window, with ``NO_WINDOW`` for a layer without one; None when no
    layer has a window (attention then skips the window mask)."""
    windows = [self.layer_window(layer) for layer in range(self.num_layers)]
    if all(window is None for window in windows):
      return None
    return tuple(NO_WINDOW if window is None else window for window in windows)

  @property
  def gated_mlp(self) -> bool:
    return self.mlp_activation in ("swiglu", "geglu")

  @property
  def activation_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.dtype)

  @property
  def weight_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.param_dtype)
