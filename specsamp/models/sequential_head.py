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


class SequentialHead(nnx.Module):
  """The GRU over drafted tokens and the correction of h_k (module docstring)."""

  def __init__(self, d_model: int, *, rngs: nnx.Rngs):
    self.d_model = d_model
    self.gru_x = nnx.Linear(d_model, 3 * d_model, rngs=rngs)
    self.gru_r = nnx.Linear(d_model, 3 * d_model, use_bias=False, rngs=rngs)
    self.up = nnx.Linear(2 * d_model, d_model, rngs=rngs)
    self.down = nnx.Linear(d_model, d_model, kernel_init=nnx.initializers.zeros, rngs=rngs)

  def recur(self, r_BD: jax.Array, embedded_BD: jax.Array) -> jax.Array:
    """r_k from r_{k-1} and embed(x~_k): one GRU step."""
    reset_x, update_x, new_x = jnp.split(self.gru_x(embedded_BD), 3, axis=-1)
    reset_r, update_r, new_r = jnp.split(self.gru_r(r_BD), 3, axis=-1)
    reset = jax.nn.sigmoid(reset_x + reset_r)
    update = jax.nn.sigmoid(update_x + update_r)
    candidate = jnp.tanh(new_x + reset * new_r)
    return (1.0 - update) * candidate + update * r_BD

  def correct(self, h_BD: jax.Array, r_BD: jax.Array) -> jax.Array:
    """h_k + down(gelu(up([h_k; r_{k-1}]))): the hidden state q_k is read from."""
    return h_BD + self.down(jax.nn.gelu(self.up(jnp.concatenate([h_BD, r_BD], axis=-1))))


def output_logits(draft, x: jax.Array) -> jax.Array:
  """The parallel draft's own final norm and output head (or tied embedding) on hidden
  states [B, D] or [B, T, D]: float32 logits of the same leading shape."""
  x_BTD = draft.final_norm(x if x.ndim == 3 else x[:, None])
  logits = draft.embedder.decode(x_BTD) if draft.config.tie_embeddings else draft.head(x_BTD)
  return logits.astype(jnp.float32) if x.ndim == 3 else logits[:, 0].astype(jnp.float32)


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
