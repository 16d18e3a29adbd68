"""Multi-head / grouped-query / multi-query attention over a per-row KV cache.

One call takes T >= 1 new tokens per row at per-row positions (prefill,
single-step decode and scoring K+1 draft tokens are the same call): it
projects q, k, v, rotates q and k by their positions, writes k and v into the
cache slots of those positions, and attends each query at position p to the
cache slots s <= p. Slots beyond a query's position (the future, padding, or
entries left behind by a rollback) are masked out.

Tree calls (``tree``, a ``TreeCall``, for tree speculative sampling): a
draft tree's root and nodes occupy the M slots root..root+M-1 of a row (root =
the root token's position), in node order, while their positions (RoPE) are
the root's plus each node's depth, so siblings share a position. A call's
token t is written to slot root + offsets[t]; it sees every slot before the
root's and, among the tree's M slots, those ``mask[t]`` marks: its ancestors
and itself. The mask is one for every row ([T, M], a static tree) or one per row ([B, T, M],
a dynamic tree, whose parents differ between rows). Without a tree, slot = position.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx, struct

from specsamp import sharding
from specsamp.models import kv_cache
from specsamp.models.config import NO_WINDOW, TransformerConfig
from specsamp.models.layers import apply_rope, make_param, rms_norm, rope_frequencies, softcap

_MASKED = -1e30


@struct.dataclass
class TreeCall:
  """Where a tree call's tokens go and what they see (module docstring).

  Attributes:
    root_B: [B] int32, the slot (= position) of each row's tree root.
    offsets_T: [T] int32, each call token's slot after the root's (static per tree).
    mask_TM: [T, M] bool, token t sees tree slot root + m iff ``mask_TM[t, m]``; or
      [B, T, M], one mask per row (a dynamic tree).
    packed: sequences packed back to back in the call's slots (``segment_call``): a sliding
      window then counts slots (the distance within a sequence), not the positions, which
      restart at each sequence.
  """

  root_B: jax.Array
  offsets_T: jax.Array
  mask_TM: jax.Array
  packed: bool = struct.field(pytree_node=False, default=False)

  @property
  def num_slots(self) -> int:
    """M: the tree slots root..root+M-1 the call's tree occupies."""
    return self.mask_TM.shape[-1]

  def mask_BTM(self, batch: int) -> jax.Array:
    """[B, T, M]: the mask of every row."""
    if self.mask_TM.ndim == 3:
      return self.mask_TM
    return jnp.broadcast_to(self.mask_TM[None], (batch, *self.mask_TM.shape))


def segment_positions(segments_BL: jax.Array) -> jax.Array:
  """[B, L] each token's position within its segment of the row (rows that hold several
  sequences back to back, ``segments_BL`` their ids, equal along a sequence): 0 at a
  segment's first token, and at the row's first."""
  length = segments_BL.shape[1]
  index_L = jnp.arange(length, dtype=jnp.int32)
  first_B1 = jnp.ones_like(segments_BL[:, :1], bool)
  starts_BL = jnp.concatenate([first_B1, segments_BL[:, 1:] != segments_BL[:, :-1]], axis=1)
  return index_L - jax.lax.cummax(jnp.where(starts_BL, index_L, 0), axis=1)


def segment_call(segments_BL: jax.Array) -> tuple[jax.Array, TreeCall]:
  """(positions [B, L], tree call) of a pass with no cache over rows that hold several
  sequences back to back (``segments_BL``: their ids): token t sees the tokens of its own
  sequence up to itself, at positions counted from that sequence's start (as if each sequence
  were a row of its own: RoPE scores depend on distance, and a sequence sees nothing else)."""
  batch, length = segments_BL.shape
  index_L = jnp.arange(length, dtype=jnp.int32)
  causal_LL = index_L[:, None] >= index_L[None, :]
  mask_BLL = causal_LL[None] & (segments_BL[:, :, None] == segments_BL[:, None, :])
  call = TreeCall(
    root_B=jnp.zeros((batch,), jnp.int32), offsets_T=index_L, mask_TM=mask_BLL, packed=True
  )
  return segment_positions(segments_BL), call


def _visible(slots_S, positions_BT, window, tree: TreeCall | None = None):
  """[B, T, S]: slot s is visible to a query at position p iff s <= p (and s > p - window);
  in a tree call, iff s is before the root's slot, or a tree slot ``tree.mask_TM`` marks."""
  if tree is None:
    visible_BTS = slots_S[None, None, :] <= positions_BT[:, :, None]
  else:
    offset_BS = slots_S[None, :] - tree.root_B[:, None]
    tree_slots = tree.num_slots
    inside_BS = (offset_BS >= 0) & (offset_BS < tree_slots)
    clipped_BS = jnp.clip(offset_BS, 0, tree_slots - 1)
    if tree.mask_TM.ndim == 2:
      marked_TBS = jnp.take(tree.mask_TM, clipped_BS, axis=1)
      marked_BTS = jnp.transpose(marked_TBS, (1, 0, 2))
    else:  # One mask per row.
      marked_BTS = jnp.take_along_axis(tree.mask_TM, clipped_BS[:, None, :], axis=2)
    marked_BTS = marked_BTS & inside_BS[:, None, :]
    visible_BTS = (offset_BS < 0)[:, None, :] | marked_BTS
  if window is not None:
    # A packed call's query sits at its slot (the mask keeps it in its own sequence there).
    query_BT = write_slots(positions_BT, tree) if tree is not None and tree.packed else positions_BT
    visible_BTS = visible_BTS & (slots_S[None, None, :] > query_BT[:, :, None] - window)
  return visible_BTS


def write_slots(positions_BT: jax.Array, tree: TreeCall | None) -> jax.Array:
  """Where a call's tokens go in the cache: their positions, or a tree call's slots."""
  if tree is None:
    return positions_BT
  return tree.root_B[:, None] + tree.offsets_T[None, :].astype(positions_BT.dtype)


@dataclasses.dataclass(frozen=True)
class LayerCache:
  """One layer of the stacked KV cache, read in place: ``read`` slices that layer's slots
  straight out of the [L, B, S, K, H] arrays (nothing else of the cache is copied).

  Attributes:
    keys, values: [L, B, S, K, H], every layer's cache.
    layer: which layer (an int, or a traced scalar inside the scan over layers).
    kv_head: with tensor parallelism wider than K, the one kv head this device's query
      heads share (every device holds all K); None reads all K.
  """

  keys: jax.Array
  values: jax.Array
  layer: jax.Array | int
  kv_head: jax.Array | None = None

  @property
  def num_slots(self) -> int:
    return self.keys.shape[2]

  def read(self, start: jax.Array | int, size: int) -> tuple[jax.Array, jax.Array]:
    """Keys and values [B, size, K', H] of slots start..start+size-1 of the layer."""

    def one(cache_LBSKH):
      _, batch, _, kv_heads, head_dim = cache_LBSKH.shape
      start_index = (self.layer, 0, start, 0, 0)
      block = jax.lax.dynamic_slice(cache_LBSKH, start_index, (1, batch, size, kv_heads, head_dim))
      block_BsKH = block[0]
      if self.kv_head is not None:
        # The one head by a select and a sum over K (exact: every other term is 0), never a
        # dynamic slice along K: with one, the TPU compiler laid the whole stacked cache out
        # again for it and, since the slot writes want the other layout, copied all L layers'
        # cache in every layer (53.7 GB per Llama-3.1-70B step on 16 v5e chips, found by
        # experiments/proofs/hlo_bytes.py; tests/test_hlo_bytes.py keeps the control).
        heads_K = jnp.arange(kv_heads) == self.kv_head
        block_BsKH = jnp.where(heads_K[:, None], block_BsKH, 0).sum(axis=2, keepdims=True)
      return block_BsKH

    return one(self.keys), one(self.values)


def attend(
  q_BTNH: jax.Array,
  cache: LayerCache,
  positions_BT: jax.Array,
  logit_cap: float | None = None,
  window: jax.Array | int | None = None,
  block_size: int = 0,
  tree: TreeCall | None = None,
) -> jax.Array:
  """Causal attention of T queries over a layer's S cache slots; slot s is visible iff
  s <= position (and, with a sliding ``window``, s > position - window).

  Query head n uses key/value head n // R (R = N // K), so MHA, GQA and MQA
  share one einsum and the cache is never repeated to N heads.

  With 0 < ``block_size`` < S, the cache is read in blocks of that many slots, only up to
  the block holding the batch's furthest position (and from the first block a sliding window
  can see), with an online softmax across blocks (``attend_blocked``): a call reads the live
  part of the cache, not every allocated slot.

  ``tree``: a tree call (module docstring).
  """
  num_slots = cache.num_slots
  if 0 < block_size < num_slots:
    return attend_blocked(q_BTNH, cache, positions_BT, logit_cap, window, block_size, tree)
  k_BSKH, v_BSKH = cache.read(0, num_slots)
  batch, length, num_heads, head_dim = q_BTNH.shape
  num_kv_heads = k_BSKH.shape[2]
  q_BTKRH = q_BTNH.reshape(batch, length, num_kv_heads, num_heads // num_kv_heads, head_dim)
  logits_BKRTS = jnp.einsum(
    "BTKRH,BSKH->BKRTS", q_BTKRH, k_BSKH, preferred_element_type=jnp.float32
  )
  logits_BKRTS = softcap(logits_BKRTS, logit_cap)
  visible_BTS = _visible(jnp.arange(num_slots), positions_BT, window, tree)
  logits_BKRTS = jnp.where(visible_BTS[:, None, None], logits_BKRTS, _MASKED)
  probs_BKRTS = jax.nn.softmax(logits_BKRTS, axis=-1).astype(v_BSKH.dtype)
  out_BTKRH = jnp.einsum("BKRTS,BSKH->BTKRH", probs_BKRTS, v_BSKH)
  return out_BTKRH.reshape(batch, length, num_heads, head_dim)


def attend_blocked(
  q_BTNH: jax.Array,
  cache: LayerCache,
  positions_BT: jax.Array,
  logit_cap: float | None,
  window: jax.Array | int | None,
  block_size: int,
  tree: TreeCall | None = None,
) -> jax.Array:
  """``attend``, reading the cache block by block over the live blocks only.

  Blocks [first, last] are read, last = the block of the batch's largest position, first =
  the block of its smallest visible slot (0 without a window): a ``while_loop`` with a
  dynamic trip count, each step a ``dynamic_slice`` of ``block_size`` slots, combined with
  the online softmax of flash attention (a running max m, normaliser l and weighted sum).
  Every visible slot is read exactly once, so the result is ``attend``'s up to float
  rounding. A block with nothing visible to a row leaves m at the mask value; the row's
  first visible logit then scales what it summed by exp(mask - m) = 0.
  """
  batch, length, num_heads, head_dim = q_BTNH.shape
  num_kv_heads = 1 if cache.kv_head is not None else cache.keys.shape[3]
  groups = num_heads // num_kv_heads
  q_BTKRH = q_BTNH.reshape(batch, length, num_kv_heads, groups, head_dim)
  # Positions past the cache (writes there are dropped) must not re-read its last block.
  num_slots = cache.num_slots
  furthest = jnp.max(write_slots(positions_BT, tree))
  last = jnp.minimum(furthest // block_size, -(-num_slots // block_size) - 1)
  first = jnp.int32(0)
  if window is not None:
    first = jnp.maximum(jnp.min(positions_BT) - window + 1, 0) // block_size
  # Zeros derived from q, so that under shard_map they vary over the same mesh axes as the
  # values the loop body computes from q (a while_loop's carry types must match).
  zeros_BKRTH = jnp.einsum("BTKRH->BKRTH", q_BTKRH).astype(jnp.float32) * 0
  init = (
    first,
    zeros_BKRTH[..., 0] + _MASKED,  # m: running max of the logits.
    zeros_BKRTH[..., 0],  # l: running sum of exp(logit - m).
    zeros_BKRTH,  # Running sum of exp(logit - m) v.
  )

  def body(carry):
    index, m_BKRT, l_BKRT, acc_BKRTH = carry
    # The last block of a cache that block_size does not divide starts earlier, at S - b:
    # the slots it shares with the block before are masked, so each is counted once.
    start = jnp.minimum(index * block_size, num_slots - block_size)
    k_BbKH, v_BbKH = cache.read(start, block_size)
    slots_b = start + jnp.arange(block_size)
    logits_BKRTb = jnp.einsum(
      "BTKRH,BbKH->BKRTb", q_BTKRH, k_BbKH, preferred_element_type=jnp.float32
    )
    logits_BKRTb = softcap(logits_BKRTb, logit_cap)
    visible_BTb = _visible(slots_b, positions_BT, window, tree) & (slots_b >= index * block_size)
    logits_BKRTb = jnp.where(visible_BTb[:, None, None], logits_BKRTb, _MASKED)
    new_m = jnp.maximum(m_BKRT, logits_BKRTb.max(axis=-1))
    weights_BKRTb = jnp.exp(logits_BKRTb - new_m[..., None])
    correction = jnp.exp(m_BKRT - new_m)
    l_BKRT = l_BKRT * correction + weights_BKRTb.sum(axis=-1)
    acc_BKRTH = acc_BKRTH * correction[..., None] + jnp.einsum(
      "BKRTb,BbKH->BKRTH",
      weights_BKRTb.astype(v_BbKH.dtype),
      v_BbKH,
      preferred_element_type=jnp.float32,
    )
    return index + 1, new_m, l_BKRT, acc_BKRTH

  _, _, l_BKRT, acc_BKRTH = jax.lax.while_loop(lambda c: c[0] <= last, body, init)
  out_BKRTH = (acc_BKRTH / l_BKRT[..., None]).astype(cache.values.dtype)
  return jnp.einsum("BKRTH->BTKRH", out_BKRTH).reshape(batch, length, num_heads, head_dim)


def attention_forward(
  x_BTD: jax.Array,
  positions_BT: jax.Array,
  keys_LBSKH: jax.Array,
  values_LBSKH: jax.Array,
  layer: jax.Array | int,
  weights: dict[str, jax.Array],
  *,
  config: TransformerConfig,
  window: jax.Array | int | None = None,
  kv_head_offset: jax.Array | None = None,
  tree: TreeCall | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Attention on arrays: returns (out_BTD, keys_LBSKH, values_LBSKH) with ``layer``'s
  cache updated in place (the stacked cache is carried through the scan over layers, so a
  step writes its new slots and reads its layer without copying the cache).

  Under tensor parallelism the weights hold a slice of the heads and out_BTD is
  a partial sum over them, reduced once by the caller.

  Args:
    x_BTD: normalised inputs.
    positions_BT: absolute position of each input token.
    keys_LBSKH, values_LBSKH: every layer's cache.
    layer: this layer's index into them.
    weights: q_DNH, k_DKH, v_DKH, o_NHD and, with qkv_bias, q_NH, k_KH, v_KH; with qk_norm,
      q_norm_H and k_norm_H.
    config: the model config (RoPE, query scale, soft-cap, attention block size).
    window: this layer's sliding window (None: the whole cache).
    kv_head_offset: set when each device holds ALL K kv heads but only a slice
      of the query heads (tensor parallelism wider than K): the one kv head its
      query heads share is selected at this index.
    tree: a tree call (module docstring), or None.
  """
  dtype = x_BTD.dtype

  def project(name, bias_name):
    out = jnp.einsum("BTD,D...->BT...", x_BTD, weights[name].astype(dtype))
    if bias_name in weights:
      out = out + weights[bias_name].astype(dtype)
    return out

  q_BTNH, k_BTKH = project("q_DNH", "q_NH"), project("k_DKH", "k_KH")
  if config.qk_norm:
    q_BTNH = rms_norm(q_BTNH, weights["q_norm_H"], config.norm_eps, config.norm_plus_one)
    k_BTKH = rms_norm(k_BTKH, weights["k_norm_H"], config.norm_eps, config.norm_plus_one)
  inv_freq = rope_frequencies(config)
  if config.rope_local_theta is not None and window is not None:
    # Gemma 3: the sliding-window layers rotate by a base of their own (``window`` is traced
    # under the scan over layers; a layer without a window has NO_WINDOW).
    local = jnp.asarray(window) < NO_WINDOW
    inv_freq = jnp.where(local, rope_frequencies(config, local=True), inv_freq)
  q_BTNH = apply_rope(q_BTNH, positions_BT, inv_freq)
  k_BTKH = apply_rope(k_BTKH, positions_BT, inv_freq)
  v_BTKH = project("v_DKH", "v_KH")
  query_scalar = config.query_pre_attn_scalar or q_BTNH.shape[-1]
  q_BTNH = q_BTNH * jnp.asarray(query_scalar**-0.5, dtype)
  q_BTNH = sharding.constrain(q_BTNH, ("act_batch", "act_length", "act_heads", "act_head_dim"))

  slots_BT = write_slots(positions_BT, tree)
  keys_LBSKH = kv_cache.write(keys_LBSKH, layer, k_BTKH, slots_BT)
  values_LBSKH = kv_cache.write(values_LBSKH, layer, v_BTKH, slots_BT)
  keys_LBSKH = sharding.constrain(keys_LBSKH, kv_cache.STACKED_CACHE_AXES)
  values_LBSKH = sharding.constrain(values_LBSKH, kv_cache.STACKED_CACHE_AXES)

  out_BTNH = attend(
    q_BTNH,
    LayerCache(keys_LBSKH, values_LBSKH, layer, kv_head_offset),
    positions_BT,
    config.attn_logit_softcap,
    window,
    config.attention_block_size,
    tree,
  )
  return output_projection(out_BTNH, weights["o_NHD"].astype(dtype)), keys_LBSKH, values_LBSKH


def output_projection(out_BTNH: jax.Array, o_NHD: jax.Array) -> jax.Array:
  """The heads' outputs through o: one product over their flattened outputs E = N x H, both
  operands as they lie. As an einsum over (N, H), XLA's CPU backend laid o out again,
  [H, N, D], in every layer of every call (8-18% of a call; tests/test_models.py keeps it
  out)."""
  batch, length, num_heads, head_dim = out_BTNH.shape
  o_ED = o_NHD.reshape(num_heads * head_dim, o_NHD.shape[-1])
  return jnp.einsum("BTE,ED->BTD", out_BTNH.reshape(batch, length, num_heads * head_dim), o_ED)


class Attention(nnx.Module):
  """Attention parameters: q/k/v/o projections (and q/k/v biases for Qwen2, q/k norm scales
  for Qwen3 and Gemma 3)."""

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
    self.config = config
    d, n, k, h = config.d_model, config.num_heads, config.num_kv_heads, config.resolved_head_dim
    dtype = config.weight_dtype
    init = nnx.initializers.lecun_normal()
    self.q_DNH = make_param(rngs, init, (d, n, h), ("embed", "heads", "head_dim"), dtype)
    self.k_DKH = make_param(rngs, init, (d, k, h), ("embed", "kv_heads", "head_dim"), dtype)
    self.v_DKH = make_param(rngs, init, (d, k, h), ("embed", "kv_heads", "head_dim"), dtype)
    self.o_NHD = make_param(
      rngs,
      nnx.initializers.lecun_normal(in_axis=(0, 1), out_axis=2),
      (n, h, d),
      ("heads", "head_dim", "embed"),
      dtype,
    )
    if config.qkv_bias:
      zeros = nnx.initializers.zeros
      self.q_NH = make_param(rngs, zeros, (n, h), ("heads", "head_dim"), dtype)
      self.k_KH = make_param(rngs, zeros, (k, h), ("kv_heads", "head_dim"), dtype)
      self.v_KH = make_param(rngs, zeros, (k, h), ("kv_heads", "head_dim"), dtype)
    if config.qk_norm:  # One scale per head dimension, shared by every head of the layer.
      init = nnx.initializers.zeros if config.norm_plus_one else nnx.initializers.ones
      self.q_norm_H = make_param(rngs, init, (h,), ("head_dim",), dtype)
      self.k_norm_H = make_param(rngs, init, (h,), ("head_dim",), dtype)

  def weights(self) -> dict[str, nnx.Param]:
    names = ("q_DNH", "k_DKH", "v_DKH", "o_NHD")
    if self.config.qkv_bias:
      names += ("q_NH", "k_KH", "v_KH")
    if self.config.qk_norm:
      names += ("q_norm_H", "k_norm_H")
    return {name: getattr(self, name) for name in names}
