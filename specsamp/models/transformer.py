"""The decoder-only Transformer; it satisfies specsamp's decode protocol.

Decode protocol (what the samplers need from a target or draft model):

  model.vocab_size                          -> V
  model.init_cache(batch_size, max_length)  -> cache (a pytree with ``lengths``)
  model(tokens_BT, positions_BT, cache)     -> (logits_BTV float32, cache)
                                               (a ``ModelOutput``: unpacks as this pair;
                                               ``.features`` with ``capture_layers``)

``positions_BT`` are absolute per-row positions (consecutive within a row); the
call writes those positions into the cache and sets ``cache.lengths`` to one
past each row's last position. With ``positions_BT=None`` a call continues
every row from ``cache.lengths``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specsamp import sharding
from specsamp.models import kv_cache, moe, tensor_parallel
from specsamp.models.attention import Attention, TreeCall
from specsamp.models.config import TransformerConfig
from specsamp.models.kv_cache import KVCache
from specsamp.models.layers import MLP, Embedder, OutputHead, RMSNorm, softcap
from specsamp.models.output import ModelOutput

_RESIDUAL_AXES = ("act_batch", "act_length", "act_embed")


def create(
  config: TransformerConfig, mesh: jax.sharding.Mesh | None = None, seed: int = 0
) -> Transformer:
  """A Transformer with initialised parameters, born sharded on ``mesh`` when given."""
  if mesh is None:
    return Transformer(config, rngs=nnx.Rngs(seed))
  return sharding.create_sharded(lambda rngs: Transformer(config, rngs=rngs), mesh, seed)


class Block(nnx.Module):
  """Pre-norm Transformer block: x + attn(norm(x)), then x + mlp(norm(x)); with
  ``post_norms`` (Gemma 2) each branch output is normed again before the add. The
  Transformer holds ONE Block whose parameters are stacked over the layers
  (``stacked_blocks``); a layer's sliding window comes in as an argument."""

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
    self.attn_norm = RMSNorm(config, rngs=rngs)
    self.attn = Attention(config, rngs=rngs)
    self.mlp_norm = RMSNorm(config, rngs=rngs)
    self.mlp = MLP(config, rngs=rngs)
    if config.post_norms:
      self.attn_post_norm = RMSNorm(config, rngs=rngs)
      self.mlp_post_norm = RMSNorm(config, rngs=rngs)
    self.post_norms = config.post_norms

  def __call__(
    self,
    x_BTD: jax.Array,
    positions_BT: jax.Array,
    keys_LBSKH: jax.Array,
    values_LBSKH: jax.Array,
    layer: jax.Array | int,
    window: jax.Array | None = None,
    tree: TreeCall | None = None,
  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One layer; writes its slots of the stacked cache in place and returns the cache."""
    x_BTD, keys_LBSKH, values_LBSKH = self.attention_residual(
      x_BTD, positions_BT, keys_LBSKH, values_LBSKH, layer, window, tree
    )
    return self.mlp_residual(x_BTD, layer), keys_LBSKH, values_LBSKH

  def attention_residual(
    self,
    x_BTD: jax.Array,
    positions_BT: jax.Array,
    keys_LBSKH: jax.Array,
    values_LBSKH: jax.Array,
    layer: jax.Array | int,
    window: jax.Array | None = None,
    tree: TreeCall | None = None,
  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The layer's first half: x + attn(norm(x)) (the MLP's input stream), and the cache."""
    with jax.named_scope("attention"):
      h_BTD, keys_LBSKH, values_LBSKH = tensor_parallel.attention_block(
        self.attn,
        self.attn_norm(x_BTD),
        positions_BT,
        keys_LBSKH,
        values_LBSKH,
        layer,
        window,
        tree,
      )
      if self.post_norms:
        h_BTD = self.attn_post_norm(h_BTD)
    return sharding.constrain(x_BTD + h_BTD, _RESIDUAL_AXES), keys_LBSKH, values_LBSKH

  def mlp_residual(self, x_BTD: jax.Array, layer: jax.Array | int | None = None) -> jax.Array:
    """The layer's second half: x + mlp(norm(x)). ``layer``: a mixture of experts' weights
    are every layer's, stacked (``run_blocks``); None: this layer's."""
    with jax.named_scope("mlp"):
      h_BTD = tensor_parallel.mlp_block(self.mlp, self.mlp_norm(x_BTD), layer)
      if self.post_norms:
        h_BTD = self.mlp_post_norm(h_BTD)
      x_BTD = x_BTD + h_BTD
    return sharding.constrain(x_BTD, _RESIDUAL_AXES)


def stacked_blocks(config: TransformerConfig, rngs: nnx.Rngs) -> Block:
  """``config.num_layers`` blocks as ONE Block whose every parameter has a leading layer axis
  (logical name 'layers'), each layer initialised from its own key."""

  @nnx.split_rngs(splits=config.num_layers)
  @nnx.vmap(in_axes=0, out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
  def make(rngs):
    return Block(config, rngs=rngs)

  return make(rngs)


def _stays_stacked(path) -> bool:
  """A mixture of experts' weights: read by (layer, expert) inside its expert loop, never
  sliced to a layer first (``moe.experts_forward``)."""
  return any(getattr(entry, "key", None) in moe.EXPERT_WEIGHTS for entry in path)


def _drop_layer_axis(variable: nnx.Variable) -> nnx.Variable:
  """A stacked parameter's metadata as one layer's (its logical axes without 'layers'); the
  value is sliced by the scan (or the unrolled loop)."""
  axes = variable.get_metadata().get("out_sharding")
  if axes and axes[0] == "layers":
    return variable.replace(out_sharding=tuple(axes[1:]))
  return variable


class LayerList(nnx.Module):
  """The blocks held one Block per layer, each with its own arrays (``unstack_layers``):
  what a model runs after ``unstack_layers``, in a Python loop over the layers."""

  def __init__(self, layers: list[Block]):
    self.layers = nnx.List(layers)


def layer_block(blocks: Block | LayerList, layer: int) -> Block:
  """Layer ``layer`` of the stacked blocks as a Block of its own, every weight sliced (the
  experts too): for running the layers one by one outside ``run_blocks``. Of unstacked
  blocks (``LayerList``): that layer's Block itself."""
  if isinstance(blocks, LayerList):
    return blocks.layers[layer]
  graphdef, state = nnx.split(blocks)
  state = jax.tree.map(_drop_layer_axis, state, is_leaf=lambda v: isinstance(v, nnx.Variable))
  return nnx.merge(graphdef, jax.tree.map(lambda a: a[layer], state))


def run_blocks(
  blocks: Block | LayerList,
  config: TransformerConfig,
  x_BTD: jax.Array,
  positions_BT: jax.Array,
  keys_LBSKH: jax.Array,
  values_LBSKH: jax.Array,
  num_layers: int,
  tree: TreeCall | None = None,
  start: int = 0,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Layers ``start`` .. ``num_layers - 1`` of the stacked ``blocks``: one ``lax.scan`` over
  them (``config.scan_layers``), or a Python loop over the same slices (the unrolled
  reference). Unstacked blocks (``unstack_layers``) run in a Python loop, each layer on its
  own arrays.

  Returns:
    (x_BTD, keys_LBSKH, values_LBSKH) with each layer's cache updated.
  """
  windows = config.layer_windows()
  carry = (x_BTD, keys_LBSKH, values_LBSKH)
  if isinstance(blocks, LayerList):  # One Block per layer: each reads its own arrays.
    for index in range(start, num_layers):
      with jax.named_scope(f"layer_{index}"):
        carry = _unstacked_layer(blocks.layers[index], carry, positions_BT, index, windows, tree)
    return _constrained(carry)
  graphdef, state = nnx.split(blocks)
  state = jax.tree_util.tree_map_with_path(
    lambda path, v: v if _stays_stacked(path) else _drop_layer_axis(v),
    state,
    is_leaf=lambda v: isinstance(v, nnx.Variable),
  )
  windows_L = None if windows is None else jnp.asarray(windows, jnp.int32)

  # The stacked weights are read one layer at a time by index, never sliced: a slice
  # [start:num_layers] of the stack (an early exit, a segment between captured layers) would
  # be materialised as a copy of those layers' weights at every call. The stacked cache is
  # carried (not scanned over): each layer writes its slots in place and reads its own layer,
  # so a step never copies the cache.
  def layer(carry, index):
    x_BTD, keys_LBSKH, values_LBSKH = carry

    def take(path, a):
      return a if _stays_stacked(path) else jax.lax.dynamic_index_in_dim(a, index, 0, False)

    layer_state = jax.tree_util.tree_map_with_path(take, state)
    window = None if windows_L is None else windows_L[index]
    block = nnx.merge(graphdef, layer_state)
    return block(x_BTD, positions_BT, keys_LBSKH, values_LBSKH, index, window, tree), None

  if config.scan_layers:
    carry, _ = jax.lax.scan(layer, carry, jnp.arange(start, num_layers, dtype=jnp.int32))
  else:
    for index in range(start, num_layers):
      with jax.named_scope(f"layer_{index}"):
        carry, _ = layer(carry, index)
  return _constrained(carry)


def _constrained(carry: tuple[jax.Array, jax.Array, jax.Array]):
  """The layers' result with the stacked cache's sharding."""
  x_BTD, keys_LBSKH, values_LBSKH = carry
  keys_LBSKH = sharding.constrain(keys_LBSKH, kv_cache.STACKED_CACHE_AXES)
  values_LBSKH = sharding.constrain(values_LBSKH, kv_cache.STACKED_CACHE_AXES)
  return x_BTD, keys_LBSKH, values_LBSKH


def _unstacked_layer(
  block: Block,
  carry: tuple[jax.Array, jax.Array, jax.Array],
  positions_BT: jax.Array,
  index: int,
  windows: list[int] | None,
  tree: TreeCall | None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Layer ``index`` of unstacked blocks: its own weights (a mixture of experts' too, so its
  MLP reads them as this layer's), its slots of the stacked cache."""
  x_BTD, keys_LBSKH, values_LBSKH = carry
  window = None if windows is None else jnp.int32(windows[index])
  x_BTD, keys_LBSKH, values_LBSKH = block.attention_residual(
    x_BTD, positions_BT, keys_LBSKH, values_LBSKH, index, window, tree
  )
  return block.mlp_residual(x_BTD, None), keys_LBSKH, values_LBSKH


def unstack_layers(model: Transformer) -> Transformer:
  """Holds ``model``'s layers one Block per layer, each with arrays of its own, in place (the
  stacked arrays are released once nothing else holds them), and returns ``model``.

  Why: inside a scan, XLA's CPU backend copies each layer's weights out of the stacked arrays
  before every product (a dynamic-slice fusion; the same for unrolled static slices of the
  stack), so a decode step reads the weights twice and writes them once. One array per layer
  is read in place. Measured on this 2-core CPU (2026-11-30): the default pair's target step
  4.09 -> 2.42 ms, SmolLM2's autoregressive loop 55.6 -> 43.3 ms a token (docs/benchmarks.md,
  "Unstacked layers on CPU"; ``scripts/benchmark_layers.py``). TPU fuses the slice into its
  consumer and reads each weight once either way (the HLO byte count), and compiles a scan in
  time independent of depth: keep the stack there.

  Same logits up to float rounding (the products are other kernels' calls); the same cache,
  trees, early exits and captured features. Checkpoints and training keep the stacked
  layout: convert a model for sampling, after it is saved."""
  if isinstance(model.blocks, LayerList):
    return model
  stacked = model.blocks
  model.blocks = LayerList([layer_block(stacked, i) for i in range(model.config.num_layers)])
  return model


def restacked(params: dict) -> dict:
  """A parameter dict (``nnx.to_pure_dict``) with every unstacked model's layers stacked
  again along a leading layer axis: the layout checkpoints, exports and training read,
  whichever way the model runs its layers. Nested models (a head holding its target) too."""
  if not isinstance(params, dict):
    return params
  out = {key: restacked(value) for key, value in params.items()}
  blocks = out.get("blocks")
  if isinstance(blocks, dict) and set(blocks) == {"layers"}:  # A LayerList's pure dict.
    ordered = [blocks["layers"][i] for i in sorted(blocks["layers"], key=int)]
    out["blocks"] = jax.tree.map(lambda *xs: jnp.stack(xs), *ordered)
  return out


def is_unstacked(model: object) -> bool:
  """Whether ``model`` (a Transformer) holds its layers unstacked (``unstack_layers``)."""
  return isinstance(getattr(model, "blocks", None), LayerList)


class Transformer(nnx.Module):
  """Decoder-only Transformer with a per-row KV cache (see the module docstring)."""

  accepts_logits_at = True  # The decode protocol's optional part (h).

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
    self.config = config
    self.embedder = Embedder(config, rngs=rngs)
    self.blocks = stacked_blocks(config, rngs)
    self.final_norm = RMSNorm(config, rngs=rngs)
    if not config.tie_embeddings:
      self.head = OutputHead(config, rngs=rngs)

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  def init_cache(self, batch_size: int, max_length: int, num_layers: int | None = None) -> KVCache:
    """An empty cache of ``max_length`` slots per row (for the first ``num_layers`` blocks)."""
    config = self.config
    return KVCache.create(
      num_layers or config.num_layers,
      batch_size,
      max_length,
      config.num_kv_heads,
      config.resolved_head_dim,
      config.activation_dtype,
    )

  def __call__(
    self,
    tokens_BT: jax.Array,
    positions_BT: jax.Array | None = None,
    cache: KVCache | None = None,
    *,
    num_layers: int | None = None,
    tree: TreeCall | None = None,
    capture_layers: tuple[int, ...] = (),
    logits_at: jax.Array | None = None,
    logits_from: int = 0,
  ) -> tuple[jax.Array, KVCache | None] | tuple[jax.Array, KVCache | None, jax.Array]:
    """Processes T >= 1 tokens per row; returns float32 logits and the updated cache (and the
    captured features when ``capture_layers`` is given).

    Args:
      tokens_BT: int token ids.
      positions_BT: absolute positions; None continues from ``cache.lengths``
        (or 0..T-1 without a cache).
      cache: the KV cache; None runs a plain forward pass over the T tokens and
        returns None in its place.
      num_layers: run only the first L blocks, then the final norm and head
        (early exit, for self-speculative drafting); the cache then holds L layers.
      tree: a tree call (tree speculative sampling, ``attention.TreeCall``): token t goes to
        slot ``tree.root_B + tree.offsets_T[t]`` while ``positions_BT`` (RoPE) give each
        node its depth, and sees the slots before the root and the tree slots
        ``tree.mask_TM[t]`` marks. ``cache.lengths`` becomes one past the tree's slots.
      capture_layers: ascending layer indices; the call then also returns the hidden states
        entering each of them (before its norm; layer 0's is the embedding, layer L's the
        last layer's output before the final norm), concatenated
        along the features: [B, T, len(capture_layers) * D] in the activation dtype. The
        decode protocol's part (g), which feature-level drafters read
        (``specsamp.sampling.model_protocol``). The layers run as one scan per segment
        between captures, so capturing costs no extra compute.
      logits_at: [B] token indices: the logits [B, 1, V] of token logits_at[b] of each row
        only (the prefill's last logits; the decode protocol's part (h)). The cache is
        written for every token.
      logits_from: a static index: the logits of tokens logits_from..T-1 only, [B, T - from,
        V] (a parallel draft reads only its last K positions' q). The cache is written for
        every token.
    """
    num_layers = self.config.num_layers if num_layers is None else num_layers
    if not 1 <= num_layers <= self.config.num_layers:
      raise ValueError(f"num_layers must be in [1, {self.config.num_layers}], got {num_layers}.")
    if tokens_BT.ndim != 2:
      raise ValueError(f"tokens must be [batch, length], got shape {tokens_BT.shape}.")
    batch, length = tokens_BT.shape
    had_cache = cache is not None
    if cache is None:
      cache = self.init_cache(batch, length, num_layers)
    if cache.batch_size != batch:
      raise ValueError(f"Cache holds {cache.batch_size} rows but tokens have {batch}.")
    if positions_BT is None:
      positions_BT = cache.lengths[:, None] + jnp.arange(length, dtype=jnp.int32)
    if positions_BT.shape != tokens_BT.shape:
      raise ValueError(f"positions {positions_BT.shape} must match tokens {tokens_BT.shape}.")
    positions_BT = positions_BT.astype(jnp.int32)
    _check_cache_room(cache, positions_BT, tree)

    if cache.num_layers != num_layers:
      raise ValueError(f"The cache holds {cache.num_layers} layers; this call runs {num_layers}.")
    x_BTD = self.embedder.encode(tokens_BT)
    if tree is not None:
      _check_tree_call(self.config, tree, length)
    check_capture_layers(capture_layers, num_layers)
    keys, values, captured, start = cache.keys, cache.values, [], 0
    for stop in (*capture_layers, num_layers):
      if stop > start:
        x_BTD, keys, values = run_blocks(
          self.blocks, self.config, x_BTD, positions_BT, keys, values, stop, tree, start
        )
      captured.append(x_BTD)
      start = stop
    if logits_from:
      x_BTD = x_BTD[:, logits_from:]
    if logits_at is not None:  # One token per row through the final norm and the head.
      index_B11 = jnp.asarray(logits_at, jnp.int32)[:, None, None]
      x_BTD = jnp.take_along_axis(x_BTD, index_B11, axis=1)
    with jax.named_scope("logits"):
      logits_BTV = self.output(x_BTD)
      logits_BTV = sharding.constrain(logits_BTV, ("act_batch", "act_length", "act_vocab"))
    if tree is None:
      lengths_B = positions_BT[:, -1] + 1
    else:
      lengths_B = tree.root_B + tree.num_slots
    new_cache = KVCache(keys=keys, values=values, lengths=lengths_B)
    features_BTF = jnp.concatenate(captured[:-1], -1) if capture_layers else None
    return ModelOutput(logits_BTV, new_cache if had_cache else None, features_BTF)

  def output(self, x_BTD: jax.Array, vocab_ids: jax.Array | None = None) -> jax.Array:
    """The final norm, the output head (or tied embedding) and the logit softcap on hidden
    states leaving the last layer: float32 logits [B, T, V], or [B, T, len(vocab_ids)] over
    those ids only (a reduced draft vocabulary's teacher costs its columns, not V)."""
    x_BTD = self.final_norm(x_BTD)
    if self.config.tie_embeddings:
      logits_BTV = self.embedder.decode(x_BTD, vocab_ids)
    else:
      logits_BTV = self.head(x_BTD, vocab_ids)
    return softcap(logits_BTV.astype(jnp.float32), self.config.final_logit_softcap)

  def compact_cache(self, cache: KVCache, source_BD: jax.Array, start_B: jax.Array) -> KVCache:
    """After a tree call: copies slots ``source_BD[b, j]`` to ``start_B[b] + j`` (the accepted
    path to the row's contiguous positions); the decode protocol's tree compaction."""
    return kv_cache.compact(cache, source_BD, start_B)


def check_capture_layers(capture_layers: tuple[int, ...], num_layers: int) -> None:
  """Raises a clear error unless ``capture_layers`` are ascending layers of the model."""
  layers = tuple(capture_layers)
  if any(not isinstance(i, int) for i in layers) or list(layers) != sorted(set(layers)):
    raise ValueError(f"capture_layers must be distinct ascending ints, got {capture_layers}.")
  if layers and not 0 <= layers[0] <= layers[-1] <= num_layers:
    raise ValueError(
      f"capture_layers must lie in [0, {num_layers}] (the hidden states entering those "
      f"layers of a {num_layers}-layer model; {num_layers}: the last layer's output, before "
      f"the final norm), got {capture_layers}."
    )


def _check_cache_room(cache: KVCache, positions_BT: jax.Array, tree: TreeCall | None) -> None:
  """Refuses a call that writes past the cache's last slot where it can be told before running:
  from the shapes, or from positions known outside a trace. Such a write was dropped and the
  query still read the slots before it, so its logits were wrong with no error (2026-11-30's
  review). Traced positions past the end are the caller's to prevent, as the samplers do (their
  cache length is checked, ``speculative.check_buffers_fit``)."""
  slots = positions_BT.shape[1] if tree is None else tree.num_slots
  furthest = None
  if (
    tree is None
    and not isinstance(positions_BT, jax.core.Tracer)
    and getattr(positions_BT, "is_fully_addressable", True)  # Not another host's rows.
  ):
    furthest = int(np.max(np.asarray(positions_BT))) + 1
  if slots > cache.max_length or (furthest is not None and furthest > cache.max_length):
    raise ValueError(
      f"The call writes {slots} tokens"
      + (f" up to position {furthest - 1}" if furthest is not None else "")
      + f" into a KV cache of {cache.max_length} slots: its writes past the last slot would be "
      "dropped and its logits wrong. Allocate a longer cache (init_cache)."
    )


def _check_tree_call(config: TransformerConfig, tree: TreeCall, length: int) -> None:
  if tree.offsets_T.shape != (length,) or tree.mask_TM.shape[-2] != length:
    raise ValueError(
      f"A tree call of {length} tokens needs offsets [{length}] and a mask [{length}, M] (or "
      f"[B, {length}, M]), got {tree.offsets_T.shape} and {tree.mask_TM.shape}."
    )
  windows = [w for w in (config.layer_windows() or ()) if w is not None]
  tree_slots = tree.num_slots
  if windows and min(windows) < tree_slots and not tree.packed:
    raise ValueError(
      f"A tree of {tree_slots} slots needs sliding windows of at least {tree_slots} slots "
      f"(the smallest is {min(windows)}): a node's window is applied to its position (root "
      "+ depth), and this check, which keeps every ancestor of a node inside it, is made on "
      "the tree's slots (safe, not the least it could ask)."
    )


class EarlyExit(nnx.Module):
  """The first ``num_layers`` blocks of a Transformer, then its final norm and head: a draft
  model that shares every parameter with its target (self-speculative decoding, as in
  LayerSkip / Draft & Verify). It follows the decode protocol with its own L-layer cache."""

  def __init__(self, model: Transformer, num_layers: int):
    if not 1 <= num_layers < model.config.num_layers:
      raise ValueError(
        f"An early exit needs 1 <= num_layers < {model.config.num_layers} (the "
        f"target's depth), got {num_layers}."
      )
    self.model = model
    self.num_layers = num_layers

  @property
  def vocab_size(self) -> int:
    return self.model.vocab_size

  @property
  def config(self) -> TransformerConfig:
    return self.model.config.replace(num_layers=self.num_layers)

  def init_cache(self, batch_size: int, max_length: int) -> KVCache:
    return self.model.init_cache(batch_size, max_length, self.num_layers)

  def __call__(
    self,
    tokens_BT: jax.Array,
    positions_BT: jax.Array | None = None,
    cache: KVCache | None = None,
    *,
    tree: TreeCall | None = None,
  ) -> tuple[jax.Array, KVCache | None]:
    return self.model(tokens_BT, positions_BT, cache, num_layers=self.num_layers, tree=tree)

  def compact_cache(self, cache: KVCache, source_BD: jax.Array, start_B: jax.Array) -> KVCache:
    return kv_cache.compact(cache, source_BD, start_B)
