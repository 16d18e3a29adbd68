r"""A sequential head over a parallel draft's one pass (Hydra style: Ankner et al. 2024,
"Sequentially-dependent draft heads", arXiv 2402.05109).

A parallel draft (``sampling/parallel_drafter.py``) computes the hidden states h_1..h_K of
its K draft positions in one call, from the committed tokens and K - 1 placeholders: q_k
cannot see the drafts before position k, and trained against the target it tends to the
target's marginal at k (docs/benchmarks.md, "What a parallel drafter can reach"). This head
runs after the pass, once per draft position, and lets q_k see them:

  r_0 = 0,   r_k = GRU(r_{k-1}, embed(x~_k))                    a D-wide recurrence
  q_1 = softmax(out(h_1))                                       the pass's own first position
  q_k = softmax(out(h_k + down(gelu(up([h_k; r_{k-1}])))))      k >= 2

``embed`` and ``out`` (final norm, then the output head) are the parallel draft's own,
shared and never copied; the head holds only the GRU and the two projections. ``down``
starts at zero, so an untrained head proposes exactly the parallel draft's q_k.

Exactness: q_k is a function of the context and x~_1..x~_{k-1}, all drawn before x~_k, so
the proposal's law is prod_k q_k(x~_k | x~_<k), as for any chain drafter; the verifiers get
q_k as drawn from (``parallel_drafter.ParallelDrafter`` with ``head``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from specsamp.models.layers import make_param


class SequentialHead(nnx.Module):
  """The GRU over drafted tokens and the correction of h_k (module docstring). Its
  parameters are small and replicated (logical axes None, ``layers.make_param``)."""

  def __init__(self, d_model: int, *, rngs: nnx.Rngs, dtype=jnp.float32):
    self.d_model = d = d_model
    init, zeros = nnx.initializers.lecun_normal(), nnx.initializers.zeros
    self.gru_x_DG = make_param(rngs, init, (d, 3 * d), (None, None), dtype)
    self.gru_bias_G = make_param(rngs, zeros, (3 * d,), (None,), dtype)
    self.gru_r_DG = make_param(rngs, init, (d, 3 * d), (None, None), dtype)
    self.up_ED = make_param(rngs, init, (2 * d, d), (None, None), dtype)
    self.up_bias_D = make_param(rngs, zeros, (d,), (None,), dtype)
    self.down_DD = make_param(rngs, zeros, (d, d), (None, None), dtype)  # zero: no correction
    self.down_bias_D = make_param(rngs, zeros, (d,), (None,), dtype)

  def recur(self, r_BD: jax.Array, embedded_BD: jax.Array) -> jax.Array:
    """r_k from r_{k-1} and embed(x~_k): one GRU step."""
    gates_x = embedded_BD @ self.gru_x_DG[...] + self.gru_bias_G[...]
    reset_x, update_x, new_x = jnp.split(gates_x, 3, axis=-1)
    reset_r, update_r, new_r = jnp.split(r_BD @ self.gru_r_DG[...], 3, axis=-1)
    reset = jax.nn.sigmoid(reset_x + reset_r)
    update = jax.nn.sigmoid(update_x + update_r)
    candidate = jnp.tanh(new_x + reset * new_r)
    return (1.0 - update) * candidate + update * r_BD

  def correct(self, h_BD: jax.Array, r_BD: jax.Array) -> jax.Array:
    """h_k + down(gelu(up([h_k; r_{k-1}]))): the hidden state q_k is read from."""
    hidden = jnp.concatenate([h_BD, r_BD], axis=-1) @ self.up_ED[...] + self.up_bias_D[...]
    return h_BD + jax.nn.gelu(hidden) @ self.down_DD[...] + self.down_bias_D[...]


def output_logits(draft, x: jax.Array) -> jax.Array:
  """The parallel draft's own final norm, output head (or tied embedding) and softcap on hidden
  states [B, D] or [B, T, D]: float32 logits of the same leading shape."""
  logits = draft.output(x if x.ndim == 3 else x[:, None])
  return logits if x.ndim == 3 else logits[:, 0]


def draft_step(head: SequentialHead, draft, h_BD: jax.Array, r_BD: jax.Array, token_B: jax.Array):
  """(logits of q_k [B, V], r_{k-1}): one drafting step after x~_{k-1} = ``token_B`` was
  drawn, from the pass's h_k and r_{k-2} (module docstring)."""
  r_BD = head.recur(r_BD, draft.embedder.encode(token_B[:, None])[:, 0].astype(h_BD.dtype))
  return output_logits(draft, head.correct(h_BD, r_BD)), r_BD


def teacher_forced_logits(head: SequentialHead, draft, h_BKLD: jax.Array, tokens_BL: jax.Array):
  """[B, K, L, V]: the head's logits for every query (m, j) of the parallel training layout
  (``training/parallel.py``): query (m, j) is draft position k = m + 1 of a call after
  x_{j-m}, whose drafts x~_1..x~_m are, under teacher forcing, x_{j-m+1}..x_j; r_m runs over
  them (positions before the sequence's start read token 0 and are never counted: only
  queries with j >= m are). Segment 0 is the pass's own q_1."""
  batch, segments, length, _ = h_BKLD.shape
  embedded_BLD = draft.embedder.encode(tokens_BL).astype(h_BKLD.dtype)
  logits = [output_logits(draft, h_BKLD[:, 0])]
  for m in range(1, segments):
    r_BLD = jnp.zeros_like(embedded_BLD)
    for i in range(1, m + 1):  # x~_i = x_{j-m+i}: the embedding shifted right by m - i.
      shift = m - i
      shifted = jnp.pad(embedded_BLD, ((0, 0), (shift, 0), (0, 0)))[:, :length]
      r_BLD = head.recur(r_BLD, shifted)
    logits.append(output_logits(draft, head.correct(h_BKLD[:, m], r_BLD)))
  return jnp.stack(logits, axis=1)
