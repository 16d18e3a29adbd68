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

from specsamp.models import attention
from specsamp.models.attention import TreeCall
from specsamp.training import answers


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


def parallel_logits(
  model,
  tokens_BL: jax.Array,
  num_draft_tokens: int,
  mask_token_id: int,
  weights_BL: jax.Array | None = None,
):
  """[B, K, L, V]: the logits of every query (m, j) of the layout in one tree call
  (``weights_BL``: see ``parallel_call``)."""
  batch, length = tokens_BL.shape
  out = parallel_call(model, tokens_BL, num_draft_tokens, mask_token_id, weights_BL=weights_BL)
  return out.logits.reshape(batch, num_draft_tokens, length, -1)


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
  weights_BL: jax.Array | None = None,
):
  """The model's output over the layout's K L tokens (``layout``) as one tree call. With the
  answer weights of packed rows' tokens (``answers``), query (m, j) sees only the real tokens
  of its anchor x_{j-m}'s own sequence, at positions counted from that sequence's start, as a
  sampler's row holds one prompt and its answer (``answers.packed_call``)."""
  batch, length = tokens_BL.shape
  mask_TT, positions_T = layout(length, num_draft_tokens)
  placeholders = jnp.full((batch, (num_draft_tokens - 1) * length), mask_token_id, tokens_BL.dtype)
  tokens_BT = jnp.concatenate([tokens_BL, placeholders], axis=1)
  total = tokens_BT.shape[1]
  mask = jnp.asarray(mask_TT)
  positions_BT = jnp.broadcast_to(jnp.asarray(positions_T), (batch, total))
  if weights_BL is not None:
    segments_BL = answers.segments(weights_BL)
    # Token t = (m, j): its anchor a = j - m (the query's last real token; a = j for a real one).
    m_T = jnp.repeat(jnp.arange(num_draft_tokens), length)
    has_anchor_T = jnp.asarray(positions_T) >= m_T
    anchor_T = jnp.maximum(jnp.asarray(positions_T) - m_T, 0)
    sequence_BT = segments_BL[:, anchor_T]
    # A real slot is seen only from its own sequence; placeholders as the layout has them.
    real_T = m_T == 0
    same_BTT = sequence_BT[:, :, None] == sequence_BT[:, None, :]
    mask = mask[None] & (same_BTT | ~real_T[None, None, :])
    # Placeholder (m, a + m) sits m past its anchor's position within the anchor's sequence.
    within_BL = attention.segment_positions(segments_BL)
    positions_BT = jnp.where(has_anchor_T[None], within_BL[:, anchor_T] + m_T, positions_BT)
  call = TreeCall(
    root_B=jnp.zeros((batch,), jnp.int32),
    offsets_T=jnp.arange(total, dtype=jnp.int32),
    mask_TM=mask,
  )
  cache = model.init_cache(batch, total)
  if capture_layers:
    return model(tokens_BT, positions_BT, cache, tree=call, capture_layers=capture_layers)
  return model(tokens_BT, positions_BT, cache, tree=call)


def position_weights(num_draft_tokens: int, gamma: float) -> np.ndarray:
  """[K]: w_k = exp(-(k - 1) / gamma), draft position k = 1..K."""
  return np.exp(-np.arange(num_draft_tokens) / gamma).astype(np.float32)


def query_weights(weights_BL1: jax.Array | None, num_draft_tokens: int) -> jax.Array | None:
  """[B, K, L] the weight of query (m, j) of packed answer rows, from the weights of a row's
  L + 1 tokens: the weight of the token it predicts, x_{j+1}, and 0 where that token lies in
  another sequence than its anchor x_{j-m} (``answers``; None: unweighted)."""
  if weights_BL1 is None:
    return None
  segments_BL1 = answers.segments(weights_BL1)
  length = weights_BL1.shape[1] - 1
  anchor_KL = jnp.maximum(jnp.arange(length)[None, :] - jnp.arange(num_draft_tokens)[:, None], 0)
  same_BKL = segments_BL1[:, anchor_KL] == segments_BL1[:, None, 1:]
  return jnp.where(same_BKL, weights_BL1[:, None, 1:], 0.0)


def _weighted_position_mean(
  loss_BKL: jax.Array, weights_K: jax.Array, token_weights_BL: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
  """(weighted mean, per-position mean [K]) of a per-query loss, each segment m over its
  queries j >= m (the ones with a real token visible). ``token_weights_BL``: the weight of the
  token query (m, j) predicts, x_{j+1} (on regenerated answers, 1 on answer tokens and 0 on
  the prompt), or [B, K, L] per query (``query_weights``); None counts every query alike."""
  segments, length = loss_BKL.shape[1], loss_BKL.shape[2]
  valid_KL = jnp.arange(length)[None, :] >= jnp.arange(segments)[:, None]
  counted_BKL = jnp.broadcast_to(valid_KL[None], loss_BKL.shape).astype(loss_BKL.dtype)
  if token_weights_BL is not None:
    if token_weights_BL.ndim == 2:
      token_weights_BL = token_weights_BL[:, None, :]
    counted_BKL = counted_BKL * token_weights_BL.astype(loss_BKL.dtype)
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
