"""The routed (mixture-of-experts) MLP: top-k softmax routing over E gated experts.

Routing (Qwen3-MoE, Mixtral): router logits x @ W_r in the activation dtype, a softmax over
the E experts in float32, the k largest probabilities kept (renormalised to sum to one when
``config.normalize_expert_weights``, as ``norm_topk_prob`` / Mixtral do) and cast back to the
activation dtype. Token n's output is the sum over its k experts e of w[n, e] * expert_e(x_n),
each expert a gated MLP down(act(gate(x)) * up(x)) of width ``config.ffn_dim``.

Two ways to compute it, equal up to float rounding (a test holds them to each other and to
transformers):

* ``sparse`` (the default): a ``while_loop`` over the experts that at least one of the call's
  tokens selected, in ascending order, each reading its three matrices once with a
  ``dynamic_index`` of the stacked weights and applying them to every token of the call
  (tokens that did not select it weigh 0). A decode step reads k experts per layer, a K+1
  scoring call at most (K+1) x k: the weight bytes a step moves grow with the distinct
  experts the call activates, never with E. A long prefill activates most experts and then
  costs what the dense path costs.
* ``dense``: every expert on every token, weighted by the (mostly zero) routing matrix. It
  reads all E experts; it is the reference, and the path jit's partitioner runs when the
  experts are split over the ``expert`` mesh axis in ``tensor_parallel='auto'`` mode (the
  sparse loop's data-dependent index into a sharded axis would gather every expert).

Under ``tensor_parallel='shard_map'`` (``tensor_parallel.mlp_block``) each device holds E/ep
experts (the rules table's ``expert`` axis) and an F/tp slice of each; it runs the sparse loop
over the activated experts of its own shard and one ``psum`` over the expert and tensor axes
adds the partial outputs: expert parallelism with each token's activations replicated over
the expert axis.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from specsamp.models.config import MOE_COMPUTE, TransformerConfig

EXPERT_WEIGHTS = ("gate_EDF", "up_EDF", "down_EFD")
"""The experts' weights: the scan over layers leaves them stacked (``experts_forward``)."""


def route(
  x_ND: jax.Array, router_DE: jax.Array, config: TransformerConfig
) -> tuple[jax.Array, jax.Array]:
  """(weights_NE, selected_NE): each token's routing weight on each of the E experts (zero
  outside its top k) and which experts it selected."""
  logits_NE = jnp.einsum("ND,DE->NE", x_ND, router_DE.astype(x_ND.dtype))
  probs_NE = jax.nn.softmax(logits_NE.astype(jnp.float32), axis=-1)
  top_Nk, index_Nk = jax.lax.top_k(probs_NE, config.experts_per_token)
  if config.normalize_expert_weights:
    top_Nk = top_Nk / jnp.sum(top_Nk, axis=-1, keepdims=True)
  top_Nk = top_Nk.astype(x_ND.dtype)
  one_hot_NkE = jax.nn.one_hot(index_Nk, config.num_experts, dtype=x_ND.dtype)
  weights_NE = jnp.einsum("Nk,NkE->NE", top_Nk, one_hot_NkE)
  selected_NE = jnp.any(one_hot_NkE > 0, axis=1)
  return weights_NE, selected_NE


def _expert(x_ND, gate_DF, up_DF, down_FD, act):
  dtype = x_ND.dtype
  hidden_NF = act(x_ND @ gate_DF.astype(dtype)) * (x_ND @ up_DF.astype(dtype))
  return hidden_NF @ down_FD.astype(dtype)


def experts_forward(
  x_ND: jax.Array,
  weights_NE: jax.Array,
  selected_NE: jax.Array,
  experts: dict[str, jax.Array],
  act,
  compute: str = "sparse",
  layer: jax.Array | int | None = None,
) -> jax.Array:
  """sum_e weights_NE[:, e] * expert_e(x) over the experts in ``experts`` (gate_EDF, up_EDF,
  down_EFD: all E, or one device's shard, with the matching columns of weights_NE).

  With ``layer``, the experts are every layer's, stacked [L, E, ...]: the sparse loop reads
  expert e of that layer with one slice. (Slicing the layer first, as the scan does for the
  other weights, made the TPU compiler copy all the layer's experts before the loop in every
  layer: a call then read every expert, which is what the sparse path exists to avoid.)"""
  if layer is not None and compute == "dense":
    experts = {k: jax.lax.dynamic_index_in_dim(v, layer, 0, False) for k, v in experts.items()}
  if compute == "dense":
    dtype = x_ND.dtype
    gate_NEF = jnp.einsum("ND,EDF->NEF", x_ND, experts["gate_EDF"].astype(dtype))
    up_NEF = jnp.einsum("ND,EDF->NEF", x_ND, experts["up_EDF"].astype(dtype))
    out_NED = jnp.einsum("NEF,EFD->NED", act(gate_NEF) * up_NEF, experts["down_EFD"].astype(dtype))
    # Selected by a select, not by a weight of 0: an expert a token did not choose may
    # overflow on it (float16), and 0 x inf would make that token's output NaN.
    out_NED = jnp.where(selected_NE[:, :, None], out_NED, 0)
    return jnp.einsum("NED,NE->ND", out_NED, weights_NE)
  if compute != "sparse":
    raise ValueError(f"moe_compute must be one of {MOE_COMPUTE}, got {compute!r}.")
  active_E = jnp.any(selected_NE, axis=0)
  count = jnp.sum(active_E, dtype=jnp.int32)
  # The active experts first, in ascending order (a stable sort of 'not active').
  order_E = jnp.argsort(~active_E, stable=True).astype(jnp.int32)

  def contribution(index):
    expert = order_E[index]

    def take(name):
      if layer is None:
        return jax.lax.dynamic_index_in_dim(experts[name], expert, keepdims=False)
      stacked = experts[name]
      start = (layer, expert, *([0] * (stacked.ndim - 2)))
      return jax.lax.dynamic_slice(stacked, start, (1, 1, *stacked.shape[2:]))[0, 0]

    y_ND = _expert(x_ND, take("gate_EDF"), take("up_EDF"), take("down_EFD"), act)
    # Every token runs through every expert any token of the call chose: one that did not
    # choose it adds nothing by a select (0 x an overflowed inf would be NaN, so a token's
    # output would depend on its batch mates').
    chose_N1 = jax.lax.dynamic_slice_in_dim(selected_NE, expert, 1, axis=1)
    weight_N1 = jax.lax.dynamic_slice_in_dim(weights_NE, expert, 1, axis=1)
    return jnp.where(chose_N1, weight_N1 * y_ND, 0)

  def body(carry):
    index, out_ND = carry
    return index + 1, out_ND + contribution(index)

  # The first expert is peeled off the loop: its output types the carry (inside shard_map it
  # varies over the mesh axes the weights do). A shard whose experts no token selected
  # (count 0) reads one expert and adds nothing.
  first_ND = jnp.where(count > 0, contribution(0), 0)
  return jax.lax.while_loop(lambda c: c[0] < count, body, (jnp.int32(1), first_ND))[1]


def moe_forward(
  x_BTD: jax.Array,
  weights: dict[str, jax.Array],
  config: TransformerConfig,
  act,
  compute: str | None = None,
  expert_offset: jax.Array | int = 0,
  layer: jax.Array | int | None = None,
) -> jax.Array:
  """The routed MLP on arrays (module docstring). ``weights``: router_DE (all E experts) and
  gate_EDF, up_EDF, down_EFD (all E, or E_local experts starting at ``expert_offset``; with
  ``layer``, every layer's, stacked [L, E, ...]: ``experts_forward``)."""
  batch, length, d_model = x_BTD.shape
  x_ND = x_BTD.reshape(batch * length, d_model)
  weights_NE, selected_NE = route(x_ND, weights["router_DE"], config)
  local = weights["gate_EDF"].shape[0 if layer is None else 1]
  if local != config.num_experts:  # One device's shard of the experts.
    weights_NE = jax.lax.dynamic_slice_in_dim(weights_NE, expert_offset, local, axis=1)
    selected_NE = jax.lax.dynamic_slice_in_dim(selected_NE, expert_offset, local, axis=1)
  experts = {name: weights[name] for name in EXPERT_WEIGHTS}
  out_ND = experts_forward(
    x_ND, weights_NE, selected_NE, experts, act, compute or config.moe_compute, layer
  )
  return out_ND.reshape(batch, length, d_model)
