r"""A feature-level draft head (EAGLE / EAGLE-3): one decoder layer that reads the target's own
hidden features.

At head position p the head consumes the pair (f_p, x_{p+1}): f_p, the target's features at
position p (the hidden states entering ``feature_layers``, before their norm, concatenated:
``Transformer(..., capture_layers=...)``), and x_{p+1}, the token that followed. It predicts
x_{p+2}:

  fused_p  = f_p @ fc                                   [C*D] -> [D]  (C = len(feature_layers))
  a_p      = concat(norm_e(embed(x_{p+1})), norm_f(fused_p))           [2D]
  r_p      = fused_p + attention(a_p)        (q/k/v read 2D; own KV cache; RoPE at position p)
  h_p      = r_p + mlp(norm_m(r_p))                                     the head's hidden state
  logits_p = head(norm_o(h_p))

When drafting past the last known feature, the head's own h_p stands in for fused_{p+1}
(no fc: it already lives in the fused space), as EAGLE does.

The embedding is always the target's (shared, never copied). The output is either
  * the target's final norm and head, shared (EAGLE-1/2; ``draft_vocab_size = 0``), or
  * a norm and head of its own over a reduced draft vocabulary of V_d tokens, with
    ``draft_to_target`` [V_d] mapping each draft id to a target id (EAGLE-3). Its logits are
    scattered into the target's vocabulary with -inf elsewhere, so q is 0 outside the draft
    vocabulary and the speculative sampler stays exact; the head's matmul costs V_d / V of
    the target's.

The head holds only its own parameters; ``FeatureDraftModel`` pairs it with the target it
reads (as ``EarlyExit`` shares the target's weights), so a checkpoint of the head never
carries the target.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from specsamp import sharding
from specsamp.config_fields import ConfigFields
from specsamp.models import kv_cache
from specsamp.models.attention import (
  TreeCall,
  attention_forward,
  output_projection,
  segment_positions,
)
from specsamp.models.config import TransformerConfig
from specsamp.models.kv_cache import KVCache
from specsamp.models.layers import (
  MLP,
  RMSNorm,
  apply_rope,
  make_param,
  mlp_forward,
  rope_frequencies,
  softcap,
)


@dataclasses.dataclass(frozen=True)
class FeatureHeadConfig(ConfigFields):
  """A feature head's shape; what it does not set it takes from its target's config.

  Attributes:
    feature_layers: the target layers whose entering hidden states are fused, ascending
      (EAGLE-3: a low, a middle and a high one; ``default_feature_layers``). Empty: the
      default for the target's depth.
    num_heads, num_kv_heads, head_dim, ffn_dim: the decoder layer's (0: the target's).
    draft_vocab_size: 0 shares the target's final norm and output head (EAGLE-1/2); V_d > 0
      gives the head its own norm and head over V_d draft tokens (EAGLE-3).
    rope_theta: the head's RoPE base, unscaled (published EAGLE-3 heads use 10000 whatever
      their target's); 0 takes the target's base and scaling.
    norm_eps: the head's RMSNorm epsilon; 0 takes the target's.
    parallel: a parallel head (DFlash / PARD style, ``feature_drafter``): it drafts K tokens
      from ONE call, the positions after the last committed pair fed a learned placeholder
      pair (``placeholder_2D``: the token embedding's and the fused feature's stand-ins)
      instead of its own drafts; trained so (``unrolled(..., parallel=True)``).
  """

  feature_layers: tuple[int, ...] = ()
  num_heads: int = 0
  num_kv_heads: int = 0
  head_dim: int = 0
  ffn_dim: int = 0
  draft_vocab_size: int = 0
  rope_theta: float = 0.0
  norm_eps: float = 0.0
  parallel: bool = False

  def __post_init__(self):
    object.__setattr__(self, "feature_layers", tuple(int(i) for i in self.feature_layers))
    for name in ("num_heads", "num_kv_heads", "head_dim", "ffn_dim", "draft_vocab_size"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 0:
        raise ValueError(f"FeatureHeadConfig.{name} must be an int >= 0, got {value!r}.")
    for name in ("rope_theta", "norm_eps"):
      if not getattr(self, name) >= 0:
        raise ValueError(f"FeatureHeadConfig.{name} must be >= 0, got {getattr(self, name)!r}.")

  def resolve(self, target: TransformerConfig) -> FeatureHeadConfig:
    """This config with the target's defaults filled in, checked against the target."""
    layers = self.feature_layers or default_feature_layers(target.num_layers)
    if list(layers) != sorted(set(layers)) or not 0 <= layers[0] <= layers[-1] <= target.num_layers:
      raise ValueError(
        f"feature_layers must be distinct ascending layers in [0, {target.num_layers}] of the "
        f"{target.num_layers}-layer target (the hidden states entering them; "
        f"{target.num_layers}: its last layer's output), got {layers}."
      )
    if self.draft_vocab_size > target.vocab_size:
      raise ValueError(
        f"draft_vocab_size={self.draft_vocab_size} exceeds the target's vocabulary "
        f"({target.vocab_size}); the draft vocabulary is a subset of the target's."
      )
    return self.replace(
      feature_layers=layers,
      num_heads=self.num_heads or target.num_heads,
      num_kv_heads=self.num_kv_heads or target.num_kv_heads,
      head_dim=self.head_dim or target.resolved_head_dim,
      ffn_dim=self.ffn_dim or target.ffn_dim,
      norm_eps=self.norm_eps or target.norm_eps,
    )

  def layer_config(self, target: TransformerConfig) -> TransformerConfig:
    """The head's decoder layer as a one-layer TransformerConfig (attention, MLP, norms and
    RoPE as the target's, its own widths)."""
    resolved = self.resolve(target)
    rope = {}
    if resolved.rope_theta:
      rope = dict(
        rope_theta=float(resolved.rope_theta), rope_scaling="none", rope_scaling_factor=1.0
      )
    return target.replace(
      **rope,
      num_layers=1,
      num_heads=resolved.num_heads,
      num_kv_heads=resolved.num_kv_heads,
      head_dim=resolved.head_dim,
      ffn_dim=resolved.ffn_dim,
      norm_eps=resolved.norm_eps,
      sliding_window=None,
      sliding_window_pattern=1,
      rope_local_theta=None,
      post_norms=False,
      qk_norm=False,  # EAGLE's head is a Llama layer, whatever the target's family.
      num_experts=0,
      experts_per_token=0,
      tensor_parallel="auto",
      scan_layers=True,
    )


def default_feature_layers(num_layers: int) -> tuple[int, ...]:
  """EAGLE-3's low, middle and high layers: 2, N // 2 and N - 3 (distinct, clipped for
  shallow targets)."""
  picks = (min(2, num_layers - 1), num_layers // 2, max(num_layers - 3, 0))
  return tuple(sorted(set(picks)))


class FeatureHead(nnx.Module):
  """The head's own parameters (module docstring); sharded by the rules table's names."""

  def __init__(self, config: FeatureHeadConfig, target: TransformerConfig, *, rngs: nnx.Rngs):
    self.config = config.resolve(target)
    self.layer = config.layer_config(target)
    layer = self.layer
    d, n, k, h = layer.d_model, layer.num_heads, layer.num_kv_heads, layer.resolved_head_dim
    dtype, init = layer.weight_dtype, nnx.initializers.lecun_normal()
    width = len(self.config.feature_layers) * d
    self.fc_FD = make_param(rngs, init, (width, d), (None, "embed"), dtype)
    self.embed_norm = RMSNorm(layer, rngs=rngs)
    self.feature_norm = RMSNorm(layer, rngs=rngs)
    self.q_ENH = make_param(rngs, init, (2 * d, n, h), ("embed", "heads", "head_dim"), dtype)
    self.k_EKH = make_param(rngs, init, (2 * d, k, h), ("embed", "kv_heads", "head_dim"), dtype)
    self.v_EKH = make_param(rngs, init, (2 * d, k, h), ("embed", "kv_heads", "head_dim"), dtype)
    self.o_NHD = make_param(
      rngs,
      nnx.initializers.lecun_normal(in_axis=(0, 1), out_axis=2),
      (n, h, d),
      ("heads", "head_dim", "embed"),
      dtype,
    )
    self.mlp_norm = RMSNorm(layer, rngs=rngs)
    self.mlp = MLP(layer, rngs=rngs)
    if self.config.parallel:  # The placeholder pair: (embedding, fused feature) stand-ins.
      self.placeholder_2D = make_param(
        rngs, nnx.initializers.normal(0.02), (2, d), (None, "embed"), dtype
      )
    if self.config.draft_vocab_size:
      vocab = self.config.draft_vocab_size
      self.out_norm = RMSNorm(layer, rngs=rngs)
      self.out_DW = make_param(rngs, init, (d, vocab), ("embed", "vocab"), dtype)
      # Draft id -> target id; the first V_d ids until a map is chosen or imported. An int
      # parameter: saved, loaded and sharded with the rest, never trained (``feature_train``).
      self.draft_to_target = nnx.Param(
        jnp.arange(vocab, dtype=jnp.int32), out_sharding=(None,), eager_sharding=False
      )

  def fuse(self, features_BTF: jax.Array) -> jax.Array:
    """The target's concatenated features -> the head's D-wide input."""
    fused = jnp.einsum("BTF,FD->BTD", features_BTF, self.fc_FD[...].astype(features_BTF.dtype))
    return sharding.constrain(fused, ("act_batch", "act_length", "act_embed"))

  def init_cache(self, batch_size: int, max_length: int) -> KVCache:
    layer = self.layer
    return KVCache.create(
      1,
      batch_size,
      max_length,
      layer.num_kv_heads,
      layer.resolved_head_dim,
      layer.activation_dtype,
    )

  def hidden(
    self,
    embedded_BTD: jax.Array,
    fused_BTD: jax.Array,
    positions_BT: jax.Array,
    cache: KVCache,
    tree: TreeCall | None = None,
  ) -> tuple[jax.Array, KVCache]:
    """h (module docstring) for T pairs at ``positions_BT``; writes the head's cache."""
    a_BTE = self._inputs(embedded_BTD, fused_BTD)
    weights = {
      "q_DNH": self.q_ENH[...],
      "k_DKH": self.k_EKH[...],
      "v_DKH": self.v_EKH[...],
      "o_NHD": self.o_NHD[...],
    }
    out_BTD, keys, values = attention_forward(
      a_BTE, positions_BT, cache.keys, cache.values, 0, weights, config=self.layer, tree=tree
    )
    h_BTD = self._finish(fused_BTD, out_BTD)
    keys = sharding.constrain(keys, kv_cache.STACKED_CACHE_AXES)
    values = sharding.constrain(values, kv_cache.STACKED_CACHE_AXES)
    if tree is None:
      lengths_B = positions_BT[:, -1] + 1
    else:
      lengths_B = tree.root_B + tree.num_slots
    return h_BTD, KVCache(keys=keys, values=values, lengths=lengths_B)

  def _inputs(self, embedded_BTD: jax.Array, fused_BTD: jax.Array) -> jax.Array:
    return jnp.concatenate([self.embed_norm(embedded_BTD), self.feature_norm(fused_BTD)], -1)

  def _finish(self, fused_BTD: jax.Array, attended_BTD: jax.Array) -> jax.Array:
    """The residual from the fused input, then the MLP: h."""
    r_BTD = fused_BTD + attended_BTD
    weights = {name: param[...] for name, param in self.mlp.weights().items()}
    h_BTD = r_BTD + mlp_forward(self.mlp_norm(r_BTD), weights, self.layer)
    return sharding.constrain(h_BTD, ("act_batch", "act_length", "act_embed"))

  def placeholders(self, batch: int, length: int, dtype) -> tuple[jax.Array, jax.Array]:
    """(embedded_BTD, fused_BTD): the parallel head's placeholder pair, T times per row."""
    pair_2D = self.placeholder_2D[...].astype(dtype)
    shape = (batch, length, pair_2D.shape[-1])
    return jnp.broadcast_to(pair_2D[0], shape), jnp.broadcast_to(pair_2D[1], shape)

  def unrolled(
    self,
    embedded_KBSD: jax.Array,
    fused_BSD: jax.Array,
    steps: int,
    parallel: bool = False,
    segments_BS: jax.Array | None = None,
  ) -> list[jax.Array]:
    """Training-time test (EAGLE-3): ``steps`` unrolled passes over a whole sequence, no cache.
    ``parallel``: steps k >= 1 take the placeholder pair instead of (h^{k-1}, the next token):
    what a parallel head's k-th placeholder sees after the pair at p.

    Row p of step k is the chain that starts from the target's feature at p and has drafted k
    tokens: its input is (h^{k-1}_p, the token embedding ``embedded_KBSD[k]`` at row p) (step 0:
    the fused target feature), at RoPE position p + k, and it attends to step 0's keys at rows
    <= p (the true context) and to its own chain's keys of steps 1..k (row p only): exactly
    what the head sees at inference after k draft steps from position p.

    ``segments_BS``: which sequence each row belongs to, for rows that hold several back to
    back (packed training rows, ``training.answers``): row p then attends only to the rows
    <= p of its own sequence, at RoPE positions counted from that sequence's start.

    Returns:
      [h^0, ..., h^{steps-1}], each [B, S, D].
    """
    layer = self.layer
    batch, length, _ = fused_BSD.shape
    kv_heads, head_dim = layer.num_kv_heads, layer.resolved_head_dim
    groups = layer.num_heads // kv_heads
    inv_freq = rope_frequencies(layer)
    scale = (layer.query_pre_attn_scalar or head_dim) ** -0.5
    causal_SS = jnp.tril(jnp.ones((length, length), bool))
    within_BS = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    if segments_BS is not None:  # One sequence's rows only, positions from its start.
      causal_SS = causal_SS[None] & (segments_BS[:, :, None] == segments_BS[:, None, :])
      causal_SS = causal_SS[:, None, None]  # [B, 1, 1, S, T] against the scores' [B, K, R, S, T].
      within_BS = segment_positions(segments_BS)
    outputs, chain_keys, chain_values, x_BSD = [], [], [], fused_BSD
    for k in range(steps):
      embedded_BSD = embedded_KBSD[k]
      if parallel and k >= 1:
        embedded_BSD, x_BSD = self.placeholders(batch, length, fused_BSD.dtype)
      a_BSE = self._inputs(embedded_BSD, x_BSD)
      positions_BS = within_BS + k
      dtype = a_BSE.dtype
      q_BSNH = apply_rope(
        jnp.einsum("BSE,ENH->BSNH", a_BSE, self.q_ENH[...].astype(dtype)), positions_BS, inv_freq
      )
      k_BSKH = apply_rope(
        jnp.einsum("BSE,EKH->BSKH", a_BSE, self.k_EKH[...].astype(dtype)), positions_BS, inv_freq
      )
      v_BSKH = jnp.einsum("BSE,EKH->BSKH", a_BSE, self.v_EKH[...].astype(dtype))
      q_BSKRH = (q_BSNH * scale).reshape(batch, length, kv_heads, groups, head_dim)
      if k == 0:
        context_keys, context_values = k_BSKH, v_BSKH
      else:
        chain_keys.append(k_BSKH)
        chain_values.append(v_BSKH)
      scores_BKRST = jnp.einsum(
        "BSKRH,BTKH->BKRST", q_BSKRH, context_keys, preferred_element_type=jnp.float32
      )
      scores_BKRST = softcap(scores_BKRST, layer.attn_logit_softcap)
      scores_BKRST = jnp.where(causal_SS, scores_BKRST, -jnp.inf)
      own_BKRSC = (
        jnp.stack(
          [
            jnp.einsum("BSKRH,BSKH->BKRS", q_BSKRH, key, preferred_element_type=jnp.float32)
            for key in chain_keys
          ],
          axis=-1,
        )
        if chain_keys
        else jnp.zeros((batch, kv_heads, groups, length, 0), jnp.float32)
      )
      own_BKRSC = softcap(own_BKRSC, layer.attn_logit_softcap)
      weights = jax.nn.softmax(jnp.concatenate([scores_BKRST, own_BKRSC], axis=-1), axis=-1)
      out_BSKRH = jnp.einsum(
        "BKRST,BTKH->BSKRH", weights[..., :length].astype(dtype), context_values
      )
      for i, value in enumerate(chain_values):
        out_BSKRH = out_BSKRH + jnp.einsum(
          "BKRS,BSKH->BSKRH", weights[..., length + i].astype(dtype), value
        )
      out_BSNH = out_BSKRH.reshape(batch, length, layer.num_heads, head_dim)
      attended_BSD = output_projection(out_BSNH, self.o_NHD[...].astype(dtype))
      x_BSD = self._finish(x_BSD, attended_BSD)
      outputs.append(x_BSD)
    return outputs

  def small_logits(self, h_BTD: jax.Array) -> jax.Array:
    """The reduced-vocabulary head's logits over its V_d draft tokens."""
    return jnp.einsum("BTD,DW->BTW", self.out_norm(h_BTD), self.out_DW[...].astype(h_BTD.dtype))

  def own_logits(self, h_BTD: jax.Array, target_vocab: int) -> jax.Array:
    """The reduced-vocabulary head's float32 logits over the TARGET's vocabulary: -inf outside
    the draft vocabulary."""
    small_BTW = self.small_logits(h_BTD)
    full = jnp.full((*small_BTW.shape[:-1], target_vocab), -jnp.inf, jnp.float32)
    return full.at[..., self.draft_to_target[...]].set(small_BTW.astype(jnp.float32))


class FeatureDraftModel(nnx.Module):
  """A feature head paired with the target it reads: the target's embedding and (without a
  draft vocabulary) its final norm and head are shared, never copied."""

  def __init__(self, head: FeatureHead, target):
    if not hasattr(target, "config") or not hasattr(target, "embedder"):
      raise TypeError(
        f"A feature head reads a specsamp Transformer's features, embedding and head; got "
        f"{type(target).__name__}."
      )
    self.head = head
    self.target = target

  @property
  def vocab_size(self) -> int:
    return self.target.vocab_size

  @property
  def feature_layers(self) -> tuple[int, ...]:
    return self.head.config.feature_layers

  def init_cache(self, batch_size: int, max_length: int) -> KVCache:
    return self.head.init_cache(batch_size, max_length)

  def __call__(
    self,
    tokens_BT: jax.Array,
    fused_BTD: jax.Array,
    positions_BT: jax.Array,
    cache: KVCache,
    tree: TreeCall | None = None,
  ) -> tuple[jax.Array, jax.Array, KVCache]:
    """(logits_BTV float32 over the target's vocabulary, h_BTD, cache) for T pairs of (token,
    fused feature): ``fused`` is ``head.fuse`` of the target's features, or the head's own
    earlier h."""
    h_BTD, cache = self.hidden(tokens_BT, fused_BTD, positions_BT, cache, tree)
    return self.logits(h_BTD), h_BTD, cache

  def hidden(
    self,
    tokens_BT: jax.Array,
    fused_BTD: jax.Array,
    positions_BT: jax.Array,
    cache: KVCache,
    tree: TreeCall | None = None,
  ) -> tuple[jax.Array, KVCache]:
    """The head's h_BTD and cache, without logits (``logits`` maps the h that are needed)."""
    embedded_BTD = self.target.embedder.encode(tokens_BT).astype(fused_BTD.dtype)
    return self.head.hidden(embedded_BTD, fused_BTD, positions_BT, cache, tree)

  def logits(self, h_BTD: jax.Array) -> jax.Array:
    if self.head.config.draft_vocab_size:
      return self.head.own_logits(h_BTD, self.vocab_size)
    return self.target.output(h_BTD)

  def compact_cache(self, cache: KVCache, source_BD: jax.Array, start_B: jax.Array) -> KVCache:
    return kv_cache.compact(cache, source_BD, start_B)

  def as_step_model(self) -> FeatureStep:
    return FeatureStep(self)


class FeatureStep(nnx.Module):
  """The head as a plain decode-protocol model, for the cost model's timing only: one call
  costs one draft step (the decoder layer on a D-wide feature, then the output head). The
  feature is zeros: its tokens are meaningless, its cost is the drafting step's."""

  def __init__(self, model: FeatureDraftModel):
    self.model = model

  @property
  def vocab_size(self) -> int:
    return self.model.vocab_size

  def init_cache(self, batch_size: int, max_length: int) -> KVCache:
    return self.model.init_cache(batch_size, max_length)

  def __call__(self, tokens_BT, positions_BT=None, cache=None):
    if positions_BT is None:
      positions_BT = cache.lengths[:, None] + jnp.arange(tokens_BT.shape[1], dtype=jnp.int32)
    config = self.model.head.layer
    fused = jnp.zeros((*tokens_BT.shape, config.d_model), config.activation_dtype)
    logits, _, cache = self.model(tokens_BT, fused, positions_BT, cache)
    return logits, cache


def create(
  config: FeatureHeadConfig,
  target: TransformerConfig,
  mesh: jax.sharding.Mesh | None = None,
  seed: int = 0,
) -> FeatureHead:
  """A feature head with initialised parameters, born sharded on ``mesh`` when given."""
  if mesh is None:
    return FeatureHead(config, target, rngs=nnx.Rngs(seed))
  return sharding.create_sharded(lambda rngs: FeatureHead(config, target, rngs=rngs), mesh, seed)
