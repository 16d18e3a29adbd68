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

import math
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from specsamp.config_fields import is_int, is_real
from specsamp.models.sequential_head import SequentialHead, teacher_forced_logits
from specsamp.training import checkpoint, parallel
from specsamp.training import train as train_lib


def make_step(
  num_draft_tokens: int,
  mask_token_id: int,
  gamma: float,
  temperature: float,
  optimizer: optax.GradientTransformation,
  graphdef: Any,
):
  """One jitted optimizer step: (params, opt_state, draft, target, tokens_BL) -> (params,
  opt_state, loss, kl_K), the head's parameters and optimizer state explicit pytrees."""
  weights_K = parallel.position_weights(num_draft_tokens, gamma)

  @nnx.jit
  def step(params, opt_state, draft, target, tokens_BL):
    h_BKLD = jax.lax.stop_gradient(
      parallel.parallel_hidden(draft, tokens_BL, num_draft_tokens, mask_token_id)
    )
    teacher_BLV = jax.lax.stop_gradient(target(tokens_BL)[0])

    def loss_fn(params):
      head = nnx.merge(graphdef, params)
      student_BKLV = teacher_forced_logits(head, draft, h_BKLD, tokens_BL)
      return parallel.parallel_kl(student_BKLV, teacher_BLV, weights_K, temperature)

    (loss, kl_K), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, kl_K

  return step


def check_settings(section: Any) -> None:
  """Refuses a ``draft.sequential_head`` section that cannot train, before anything trains (a
  checkpoint_every of 0 was refused only after the parallel draft had trained)."""
  counts = {name: section.get(name) for name in ("steps", "batch_size", "seq_len")}
  counts["num_draft_tokens"] = section.get("num_draft_tokens")
  counts["checkpoint_every"] = section.get("checkpoint_every", 50)
  bad = [f"{k}={v!r}" for k, v in counts.items() if not is_int(v) or v < 1]
  rate = section.get("learning_rate")
  if not is_real(rate) or not 0 < rate < math.inf:
    bad.append(f"learning_rate={rate!r}")
  if bad or counts["seq_len"] < 2:
    raise ValueError(
      f"draft.sequential_head needs ints >= 1 (seq_len >= 2) and a learning rate > 0, got "
      f"{', '.join(bad) or 'seq_len=' + repr(counts['seq_len'])}."
    )


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
  checkpoints: checkpoint.Checkpoints | None = None,
  meta: dict[str, Any] | None = None,
  checkpoint_every: int = 50,
  stop_after: int | None = None,
  log: Callable[[str], None] = print,
) -> SequentialHead:
  """A head trained ``steps`` steps on ``batches`` (``data.Batches``: packed token rows, the
  first ``seq_len`` of each used) over the frozen parallel ``draft``, the ``target`` teaching.

  With ``checkpoints``, the parameters and optimizer state are saved every
  ``checkpoint_every`` steps and at the end (with ``meta``), and a run finds the newest step
  there and resumes from it: a stopped run (``stop_after`` steps in this call, a lost machine)
  loses at most ``checkpoint_every`` steps. The batches are a pure function of the step, so a
  resumed run trains on what an unbroken one would have."""
  if steps < 1 or checkpoint_every < 1:
    raise ValueError(
      f"The sequential head needs steps >= 1 and checkpoint_every >= 1, got {steps} and "
      f"{checkpoint_every}."
    )
  head = SequentialHead(draft.config.d_model, rngs=nnx.Rngs(seed))
  graphdef, params = nnx.split(head, nnx.Param)
  params = nnx.to_pure_dict(params)  # A plain dict: what optax and orbax see.
  warmup = max(steps // 20, 1) if steps > 1 else 0  # One step: no room to warm up in.
  schedule = optax.warmup_cosine_decay_schedule(
    0.0, learning_rate, warmup, steps, learning_rate * 0.1
  )
  optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule))
  opt_state = optimizer.init(params)
  start_step = 0
  if checkpoints is not None and checkpoints.latest_step() is not None:
    checkpoint.check_meta(checkpoints.read_meta(), meta or {}, checkpoints.directory)
    abstract = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
      {"params": params, "opt_state": opt_state},
    )
    restored, saved = checkpoints.restore(abstract)
    params, opt_state, start_step = restored["params"], restored["opt_state"], saved["step"]
    if start_step < steps:
      log(f"sequential head: resuming from step {start_step} in {checkpoints.directory}")
  end = steps if stop_after is None else min(steps, start_step + stop_after)
  step = make_step(num_draft_tokens, mask_token_id, gamma, temperature, optimizer, graphdef)
  start = time.perf_counter()
  for i in range(start_step, end):
    tokens_BL = jnp.asarray(batches.at(i)[:, :-1])
    params, opt_state, loss, kl_K = step(params, opt_state, draft, target, tokens_BL)
    if (i + 1) % max(steps // 10, 1) == 0 or i == start_step:
      kls = " ".join(f"{float(k):.3f}" for k in kl_K)
      log(
        f"sequential head step {i + 1:5d}/{steps}  loss {float(loss):.4f}  kl by position "
        f"{kls}  {time.perf_counter() - start:.0f} s"
      )
    if checkpoints is not None and ((i + 1) % checkpoint_every == 0 or i + 1 == end):
      # Never a diverged state: with max_to_keep=1 it pushed out the last good step, and a
      # finished run was then loaded as the head on every later run (2026-11-30).
      if not train_lib.finite(loss, params):
        raise FloatingPointError(
          f"sequential head: the loss or the parameters are not finite at step {i + 1}; lower "
          f"the learning rate. Step {i + 1} is not saved."
        )
      checkpoints.save(i + 1, {"params": params, "opt_state": opt_state}, meta or {})
  if checkpoints is not None:
    checkpoints.wait()
  return nnx.merge(graphdef, params)
