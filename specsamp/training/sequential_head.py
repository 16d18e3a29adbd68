"""Training a sequential head (``models/sequential_head.py``) over a frozen parallel draft.

Every query (m, j) of the parallel training layout (``training/parallel.py``) is draft
position k = m + 1 of a call after x_{j-m}; one tree call of the frozen draft gives its hidden
state h(m, j), and the head, under teacher forcing, steps its recurrence over the drafts
x_{j-m+1}..x_j that query would have drawn (``sequential_head.teacher_forced_logits``). The
teacher is the target's distribution after x_<=j, as for the parallel draft itself; the loss is
the parallel draft's, KL(teacher || head) weighted exp(-(k-1)/gamma) over positions
(``parallel.parallel_kl``). Only the head's parameters train.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from specsamp.models.sequential_head import SequentialHead, teacher_forced_logits
from specsamp.training import parallel


def make_step(num_draft_tokens: int, mask_token_id: int, gamma: float, temperature: float):
  """One jitted optimizer step: (head, optimizer, draft, target, tokens_BL) -> (loss, kl_K)."""
  weights_K = parallel.position_weights(num_draft_tokens, gamma)

  @nnx.jit
  def step(head, optimizer, draft, target, tokens_BL):
    h_BKLD = jax.lax.stop_gradient(
      parallel.parallel_hidden(draft, tokens_BL, num_draft_tokens, mask_token_id)
    )
    teacher_BLV = jax.lax.stop_gradient(target(tokens_BL)[0])

    def loss_fn(head):
      student_BKLV = teacher_forced_logits(head, draft, h_BKLD, tokens_BL)
      return parallel.parallel_kl(student_BKLV, teacher_BLV, weights_K, temperature)

    (loss, kl_K), grads = nnx.value_and_grad(loss_fn, has_aux=True)(head)
    optimizer.update(head, grads)
    return loss, kl_K

  return step


def train(
  draft: Any,
  target: Any,
  batches: Any,
  *,
  steps: int,
  learning_rate: float,
  num_draft_tokens: int,
  mask_token_id: int,
  gamma: float = 4.0,
  temperature: float = 1.0,
  seed: int = 0,
  log: Callable[[str], None] = print,
) -> SequentialHead:
  """A head trained ``steps`` steps on ``batches`` (``data.Batches``: packed token rows, the
  first ``seq_len`` of each used) over the frozen parallel ``draft``, the ``target`` teaching."""
  head = SequentialHead(draft.config.d_model, rngs=nnx.Rngs(seed))
  schedule = optax.warmup_cosine_decay_schedule(
    0.0, learning_rate, max(steps // 20, 1), steps, learning_rate * 0.1
  )
  optimizer = nnx.Optimizer(
    head, optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule)), wrt=nnx.Param
  )
  step = make_step(num_draft_tokens, mask_token_id, gamma, temperature)
  start = time.perf_counter()
  for i in range(steps):
    tokens_BL = jnp.asarray(batches.at(i)[:, :-1])
    loss, kl_K = step(head, optimizer, draft, target, tokens_BL)
    if (i + 1) % max(steps // 10, 1) == 0 or i == 0:
      kls = " ".join(f"{float(k):.3f}" for k in kl_K)
      log(
        f"sequential head step {i + 1:5d}/{steps}  loss {float(loss):.4f}  kl by position "
        f"{kls}  {time.perf_counter() - start:.0f} s"
      )
  return head
