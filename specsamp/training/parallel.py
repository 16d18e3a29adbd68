r"""Training a parallel draft model (PARD style, ``sampling/parallel_drafter.py``): every draft
position of one call, for every place in a sequence, in one forward pass.

A training sequence x_0..x_{L-1} is laid out as K segments of L tokens (T = K L):

  segment 0      x_0   x_1   ...  x_{L-1}       the real tokens, position j
  segment m >= 1 MASK  MASK  ...  MASK          placeholders, position j

Query (m, j) sees the real tokens 0..j-m and the placeholders (i, j-m+i) for 1 <= i <= m: exactly
what the m-th placeholder sees at inference after a row whose last committed token is x_{j-m}.
So it predicts x_{j+1}, m + 1 tokens past what it knows: draft position k = m + 1 of a call made
after x_{j-m}. Segment 0 is the ordinary next-token prediction (draft position 1). One call of
the model over the T tokens as a tree call (``attention.TreeCall``: slot t holds token t,
the mask above says what it sees, positions give RoPE) computes all of them.

The teacher is the target's distribution after x_0..x_j, the same for every segment: the draft's
q_k is trained toward the target's next-token law averaged over the tokens it cannot see, which
is what the best parallel proposal for position k is when the training text is the target's own
(KL to p(. | x_<=j) equals, in expectation over the unseen x_{j-m+1..j}, the KL to that
average plus a constant). Segment m's loss is weighted w_{m+1} = exp(-m / gamma) (DFlash's
decay over positions; a later position is accepted only after the earlier ones), and only
queries with at least one real token visible (j >= m) count.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from specsamp.models.attention import TreeCall


def layout(seq_len: int, num_draft_tokens: int) -> tuple[np.ndarray, np.ndarray]:
  """(mask_TT, positions_T) of the K segments of ``seq_len`` tokens (module docstring): token
  t = m L + j of segment m at position j; mask_TT[t, s] says whether t sees slot s."""
  length, segments = seq_len, num_draft_tokens
  total = segments * length
  segment_T = np.repeat(np.arange(segments), length)
  position_T = np.tile(np.arange(length), segments)
  m, j = segment_T[:, None], position_T[:, None]  # the query
  n, i = segment_T[None, :], position_T[None, :]  # the slot it may see
  # The real tokens up to its anchor a = j - m, and the placeholders (n, a + n) for 1 <= n <= m.
  sees_real = (n == 0) & (i <= j - m)
  sees_placeholder = (n >= 1) & (n <= m) & (i == j - m + n)
  mask = (sees_real | sees_placeholder) & (j - m >= 0)
  mask |= np.eye(total, dtype=bool)  # every query sees itself (a query with no anchor too)
  return mask, position_T.astype(np.int32)


def parallel_logits(model, tokens_BL: jax.Array, num_draft_tokens: int, mask_token_id: int):
  """[B, K, L, V]: the logits of every query (m, j) of the layout in one tree call."""
  batch, length = tokens_BL.shape
  logits_BTV = parallel_call(model, tokens_BL, num_draft_tokens, mask_token_id).logits
  return logits_BTV.reshape(batch, num_draft_tokens, length, -1)


def parallel_hidden(model, tokens_BL: jax.Array, num_draft_tokens: int, mask_token_id: int):
  """[B, K, L, D]: the last layer's hidden state (before the final norm) of every query
  (m, j) of the layout, from the same tree call (a sequential head reads them)."""
  batch, length = tokens_BL.shape
  out = parallel_call(model, tokens_BL, num_draft_tokens, mask_token_id, (model.config.num_layers,))
  return out.features.reshape(batch, num_draft_tokens, length, -1)


def parallel_call(
  model,
  tokens_BL: jax.Array,
  num_draft_tokens: int,
  mask_token_id: int,
  capture_layers: tuple[int, ...] = (),
):
  """The model's output over the layout's K L tokens (``layout``) as one tree call."""
  batch, length = tokens_BL.shape
  mask_TT, positions_T = layout(length, num_draft_tokens)
  placeholders = jnp.full((batch, (num_draft_tokens - 1) * length), mask_token_id, tokens_BL.dtype)
  tokens_BT = jnp.concatenate([tokens_BL, placeholders], axis=1)
  total = tokens_BT.shape[1]
  call = TreeCall(
    root_B=jnp.zeros((batch,), jnp.int32),
    offsets_T=jnp.arange(total, dtype=jnp.int32),
    mask_TM=jnp.asarray(mask_TT),
  )
  positions_BT = jnp.broadcast_to(jnp.asarray(positions_T), (batch, total))
  cache = model.init_cache(batch, total)
  if capture_layers:
    return model(tokens_BT, positions_BT, cache, tree=call, capture_layers=capture_layers)
  return model(tokens_BT, positions_BT, cache, tree=call)


def position_weights(num_draft_tokens: int, gamma: float) -> np.ndarray:
  """[K]: w_k = exp(-(k - 1) / gamma), draft position k = 1..K."""
  return np.exp(-np.arange(num_draft_tokens) / gamma).astype(np.float32)


def _weighted_position_mean(
  loss_BKL: jax.Array, weights_K: jax.Array, token_weights_BL: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
  """(weighted mean, per-position mean [K]) of a per-query loss, each segment m over its
  queries j >= m (the ones with a real token visible). ``token_weights_BL``: the weight of the
  token query (m, j) predicts, x_{j+1} (on regenerated answers, 1 on answer tokens and 0 on
  the prompt); None counts every query alike."""
  segments, length = loss_BKL.shape[1], loss_BKL.shape[2]
  valid_KL = jnp.arange(length)[None, :] >= jnp.arange(segments)[:, None]
  counted_BKL = jnp.broadcast_to(valid_KL[None], loss_BKL.shape).astype(loss_BKL.dtype)
  if token_weights_BL is not None:
    counted_BKL = counted_BKL * token_weights_BL[:, None, :].astype(loss_BKL.dtype)
  loss_K = (counted_BKL * loss_BKL).sum((0, 2)) / jnp.maximum(counted_BKL.sum((0, 2)), 1e-9)
  weights_K = jnp.asarray(weights_K)
  return (weights_K * loss_K).sum() / weights_K.sum(), loss_K


def parallel_kl(
  student_BKLV: jax.Array,
  teacher_BLV: jax.Array,
  weights_K: jax.Array,
  temperature: float,
  token_weights_BL: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
  """(loss, kl_K): the weighted mean over draft positions of KL(teacher || student) at
  ``temperature``, each segment m over its queries j >= m (module docstring), and the
  per-position KL; ``token_weights_BL`` as in ``_weighted_position_mean``."""
  teacher_logp = jax.nn.log_softmax(teacher_BLV / temperature, axis=-1)[:, None]
  student_logp = jax.nn.log_softmax(student_BKLV / temperature, axis=-1)
  kl_BKL = (jnp.exp(teacher_logp) * (teacher_logp - student_logp)).sum(-1)
  return _weighted_position_mean(kl_BKL, weights_K, token_weights_BL)


def parallel_cross_entropy(
  student_BKLV: jax.Array,
  targets_BL: jax.Array,
  weights_K: jax.Array,
  token_weights_BL: jax.Array | None = None,
) -> jax.Array:
  """The weighted mean over draft positions of the cross-entropy of each query (m, j), j >= m,
  against the text's next token x_{j+1} (``targets_BL[:, j]``)."""
  logp_BKLV = jax.nn.log_softmax(student_BKLV, axis=-1)
  picked_BKL = jnp.take_along_axis(logp_BKLV, targets_BL[:, None, :, None], axis=-1)[..., 0]
  return _weighted_position_mean(-picked_BKL, weights_K, token_weights_BL)[0]


def greedy_correct(student_BKLV: jax.Array, targets_BL: jax.Array) -> jax.Array:
  """[K, B, L]: whether query (m, j)'s argmax is x_{j+1}, the token it predicts. A chain the
  parallel draft proposes after x_<=a drafts its k-th token from query (k - 1, a + k - 1)
  (``answers.accepted_parallel`` counts the run)."""
  return jnp.moveaxis(student_BKLV.argmax(-1) == targets_BL[:, None, :], 1, 0)
