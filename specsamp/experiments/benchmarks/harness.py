"""The one benchmark harness: what every timed comparison of a prepared pair shares.

The sample job, the sweep (benchmark.py), the tree and drafter comparisons and the loop
benchmark all time samplers of one pair the same way; a ``Bench`` is that way, once:

  bench.call(fn, ...)              fn under the pair's mesh (every timed call runs there;
                                   bench.mesh() is that mesh as a context)
  bench.sample(draft, **kwargs)    a ``(batch, index) -> output`` function for
                                   ``timing.time_interleaved``: call ``index`` samples with
                                   ``fold_in(key, index)`` through one kept-cache ``Sampler``
                                   per draft (sampling/sampler.py), so no call allocates or
                                   zeroes a cache; ``num_draft_tokens=0`` (or draft None) is
                                   autoregressive sampling
  bench.step_s(model, batch, tokens)       seconds per model call (``timing.time_calls``),
                                           measured once per (model, batch, tokens)
  bench.draft_in_loop_s(draft, batch, k)   a draft step as the loop pays it, measured once
  bench.step_costs(draft, batch, k)        the ``speedup.StepCosts`` of one setting
  bench.choose_draft_length(...)           the automatic K (below) and why

The automatic draft length picks K in 0..K_max with the best predicted speedup
(``speedup.choose_draft_length``) from alpha measured by one untimed call at K_max on the
first batch, with a key no timed call uses, and the measured costs: a target step, the target
scoring K + 1 tokens for every K, and a draft step as the loop pays it. The choice looks only
at costs and at a call that is not among the calls it is made for, so those stay exact.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from specsamp import sharding
from specsamp.experiments.benchmarks import speedup, timing
from specsamp.sampling.sampler import Sampler

TARGET = "target"
"""The name of the pair's target among a Bench's models."""


class Bench:
  """A prepared pair's timing harness.

  Args:
    pair: a ``jobs.pair.Pair`` (tokenizer, target, drafts, mesh).
    cache_slots: KV cache slots of every sampled call (the longest prompt, the new tokens
      and the largest scoring call).
    seed: call ``index`` samples with ``fold_in(key(seed), index)``.
    drafters: more drafts by name (e.g. prompt lookup), beside the pair's trained ones.
    eos_id: rows stop after it (None: every row generates max_new_tokens).
  """

  def __init__(
    self,
    pair: Any,
    cache_slots: int,
    seed: int = 0,
    drafters: dict[str, Any] | None = None,
    eos_id: int | None = None,
  ):
    self.pair = pair
    self.cache_slots = int(cache_slots)
    self.key = jax.random.key(seed)
    self.eos_id = eos_id
    self.models = {TARGET: pair.target, **pair.drafts, **(drafters or {})}
    self._samplers: dict[str | None, Sampler] = {}
    self._seconds: dict[tuple, float] = {}

  def mesh(self) -> contextlib.AbstractContextManager:
    """The pair's mesh, as a context: every timed call runs under it."""
    return sharding.use_mesh(self.pair.mesh)

  def call(self, fn: Callable, *args, **kwargs) -> Any:
    """``fn(*args, **kwargs)`` under the pair's mesh."""
    with self.mesh():
      return fn(*args, **kwargs)

  def sampler(self, draft: str | None) -> Sampler:
    """The kept-cache sampler of the target with ``draft`` (None: autoregressive only)."""
    if draft not in self._samplers:
      self._samplers[draft] = Sampler(
        self.pair.target,
        None if draft is None else self.models[draft],
        eos_id=self.eos_id,
        pad_id=self.pair.tokenizer.pad_id,
      )
    return self._samplers[draft]

  def sample(self, draft: str | None, **kwargs) -> Callable[[Any, int], Any]:
    """``(batch, index) -> output``: ``Sampler.generate(*batch, fold_in(key, index),
    **kwargs)`` with ``draft``, under the mesh, on this bench's cache slots."""
    sampler = self.sampler(draft if kwargs.get("num_draft_tokens", 0) else None)

    def run(batch: Any, index: int) -> Any:
      rng = jax.random.fold_in(self.key, index)
      return self.call(sampler.generate, *batch, rng, cache_length=self.cache_slots, **kwargs)

    return run

  def step_s(self, model: str, batch_size: int, tokens: int) -> float:
    """Seconds per call of ``model`` on ``tokens`` per row (measured once, then kept)."""
    key = ("call", model, batch_size, tokens)
    if key not in self._seconds:
      self._seconds[key] = self.call(
        timing.time_calls, self.models[model], batch_size, tokens, self.cache_slots
      )
    return self._seconds[key]

  def draft_in_loop_s(self, draft: str, batch_size: int, num_draft_tokens: int) -> float:
    """Seconds per draft step after a scoring call (``timing.time_draft_in_loop``), kept."""
    key = ("in_loop", draft, batch_size, num_draft_tokens)
    if key not in self._seconds:
      self._seconds[key] = self.call(
        timing.time_draft_in_loop,
        self.pair.target,
        self.models[draft],
        batch_size,
        num_draft_tokens,
        self.cache_slots,
      )
    return self._seconds[key]

  def step_costs(
    self, draft: str, batch_size: int, num_draft_tokens: int, score_tokens: int | None = None
  ) -> speedup.StepCosts:
    """A target step, a draft step and the scoring call (``score_tokens``, default K + 1)."""
    score_tokens = score_tokens or num_draft_tokens + 1
    return speedup.StepCosts(
      target_step_s=self.step_s(TARGET, batch_size, 1),
      draft_step_s=self.step_s(draft, batch_size, 1),
      target_score_s=self.step_s(TARGET, batch_size, score_tokens),
      num_draft_tokens=num_draft_tokens,
      score_tokens=score_tokens,
    )

  def choose_draft_length(self, draft: str, batch: Any, largest: int, **kwargs) -> dict[str, Any]:
    """The automatic draft length for ``draft`` at ``batch``'s size, from one untimed probe
    call at K = ``largest`` on ``batch`` (key index ``timing.WARMUP_INDEX + 1``, which no
    timed call uses) and the measured costs; ``kwargs`` are the sampling arguments.

    Returns:
      {'num_draft_tokens': K (0: autoregressive), 'alpha', 'probe_tokens', 'largest',
      'predicted': {K: speedup}, 'target_step_ms', 'draft_step_in_loop_ms', 'score_ms'}.
    """
    if largest < 1:
      raise ValueError(f"The automatic draft length needs a largest K >= 1, got {largest}.")
    batch_size = int(np.shape(batch[0])[0])
    probe = self.sample(draft, num_draft_tokens=largest, **kwargs)(batch, timing.WARMUP_INDEX + 1)
    alpha = float(probe.summary()["alpha"])
    target_step_s = self.step_s(TARGET, batch_size, 1)
    draft_step_s = self.draft_in_loop_s(draft, batch_size, largest)
    score_s = {k: self.step_s(TARGET, batch_size, k + 1) for k in range(1, largest + 1)}
    chosen, predictions = speedup.choose_draft_length(alpha, target_step_s, draft_step_s, score_s)
    return {
      "num_draft_tokens": chosen,
      "alpha": alpha,
      "probe_tokens": int(np.asarray(probe.num_generated).sum()),
      "largest": largest,
      "predicted": predictions,
      "target_step_ms": target_step_s * 1e3,
      "draft_step_in_loop_ms": draft_step_s * 1e3,
      "score_ms": {k: v * 1e3 for k, v in score_s.items()},
    }


def format_choice(choice: dict[str, Any]) -> str:
  """The automatic draft length's choice, and why, in one line."""
  chosen = choice["num_draft_tokens"]
  options = ", ".join(f"K={k} {v:.2f}x" for k, v in choice["predicted"].items())
  why = (
    "autoregressive: no K is predicted to pay"
    if chosen == 0
    else f"predicted {choice['predicted'][chosen]:.2f}x"
  )
  return (
    f"K={chosen} chosen automatically ({why}; {options}), from alpha "
    f"{choice['alpha']:.3f} over {choice['probe_tokens']} tokens of an untimed call at "
    f"K={choice['largest']}, a target step {choice['target_step_ms']:.3f} ms and a draft step in "
    f"the loop {choice['draft_step_in_loop_ms']:.3f} ms"
  )
