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
(``speedup.choose_draft_length``). It measures the speedup at K_max on the first batch (a few
probe calls of both samplers, interleaved, with keys no timed call uses), each row's
acceptance and the loop's cost per iteration beyond its models there, and predicts every other
K from them: the slowest row's iterations (``speedup.slowest_row_iterations``) times the
models' time per iteration (measured scoring costs for every K, the draft step as the loop
pays it) plus that measured overhead.
K = 0 (autoregressive) when no K is predicted 1.05x. The choice looks only at costs and at
calls that are not among the calls it is made for, so those stay exact.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from specsamp import sharding
from specsamp.experiments.benchmarks import speedup, timing
from specsamp.sampling import drafters, speculative
from specsamp.sampling.feature_drafter import FeatureDrafter
from specsamp.sampling.sampler import Sampler

TARGET = "target"
"""The name of the pair's target among a Bench's models."""


def step_model(model: Any) -> Any:
  """What a draft step's cost is timed on: a decode-protocol model as it is, a model
  drafter's model, a feature drafter's head as a step model (``FeatureStep``)."""
  if isinstance(model, FeatureDrafter):
    return model.model.as_step_model()
  if isinstance(model, drafters.ModelDrafter):
    return model.model
  return model


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
        timing.time_calls, step_model(self.models[model]), batch_size, tokens, self.cache_slots
      )
    return self._seconds[key]

  def draft_in_loop_s(self, draft: str, batch_size: int, num_draft_tokens: int) -> float:
    """Seconds per draft step after a scoring call (``timing.time_draft_in_loop``), kept."""
    key = ("in_loop", draft, batch_size, num_draft_tokens)
    if key not in self._seconds:
      self._seconds[key] = self.call(
        timing.time_draft_in_loop,
        self.pair.target,
        step_model(self.models[draft]),
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

  def choose_draft_length(
    self, draft: str, batch: Any, largest: int, probe_calls: int = 3, **kwargs
  ) -> dict[str, Any]:
    """The automatic draft length for ``draft`` at ``batch``'s size (module docstring);
    ``kwargs`` are the sampling arguments (``max_new_tokens`` among them).

    Measured: ``probe_calls`` untimed-for-the-job calls of the autoregressive and of the K =
    ``largest`` sampler on ``batch``, interleaved, with keys from index
    ``timing.WARMUP_INDEX + 1`` on (which no timed call uses): their speedup, and each row's
    acceptance. Predicted for every K: the slowest row's iterations
    (``speedup.slowest_row_iterations``, each row at its own alpha) times an iteration's cost:
    its models (K draft steps as the loop pays them, the measured scoring call of K + 1
    tokens) plus the overhead per iteration the probe measured beyond its own models (per-row
    work in the loop, which grows with the batch; what the plain model misses), relative to
    the measured K = ``largest`` call; the speedup is the measured autoregressive call over
    that. ``modelled`` keeps the plain model's prediction (``predicted_batch_speedup``).

    Returns:
      {'num_draft_tokens': K (0: autoregressive), 'alpha', 'row_alphas', 'probe_tokens',
      'largest', 'measured_at_largest', 'overhead_per_iteration_ms', 'modelled': {K: speedup},
      'predicted': {K: speedup},
      'target_step_ms', 'draft_step_in_loop_ms', 'score_ms'}.
    """
    if largest < 1:
      raise ValueError(f"The automatic draft length needs a largest K >= 1, got {largest}.")
    batch_size = int(np.shape(batch[0])[0])
    max_new_tokens = int(kwargs["max_new_tokens"])
    timed = timing.time_interleaved(
      {
        "autoregressive": self.sample(None, num_draft_tokens=0, **kwargs),
        "speculative": self.sample(draft, num_draft_tokens=largest, **kwargs),
      },
      [batch],
      calls=probe_calls,
      first_index=timing.WARMUP_INDEX + 1,
    )
    probes = timed["speculative"].outputs
    ar_s = statistics.median(timed["autoregressive"].seconds)
    spec_s = statistics.median(timed["speculative"].seconds)
    pooled = lambda name: sum(np.asarray(getattr(o, name)).sum(-1) for o in probes)
    row_alphas = pooled("accepted_at_position") / np.maximum(pooled("verified_at_position"), 1)
    target_step_s = self.step_s(TARGET, batch_size, 1)
    draft_step_s = self.draft_in_loop_s(draft, batch_size, largest)
    score_s = {k: self.step_s(TARGET, batch_size, k + 1) for k in range(1, largest + 1)}
    models_s = {k: k * draft_step_s + score_s[k] for k in score_s}  # The models per iteration.
    iterations = {k: speedup.slowest_row_iterations(row_alphas, k, max_new_tokens) for k in score_s}
    # What an iteration costs beyond its models, measured: the probe's seconds over its loop
    # iterations (target calls less the prefill), less the models' time.
    measured_iterations = statistics.median(int(o.target_calls) - 1 for o in probes)
    overhead_s = max(spec_s / max(measured_iterations, 1) - models_s[largest], 0.0)
    modelled = {
      k: speedup.predicted_batch_speedup(
        row_alphas, k, max_new_tokens, target_step_s, draft_step_s, score_s[k]
      )
      for k in score_s
    }
    # Every K's call, relative to the measured one: its iterations at its models' time plus
    # the measured overhead.
    call_s = {
      k: spec_s
      * iterations[k]
      * (models_s[k] + overhead_s)
      / (iterations[largest] * (models_s[largest] + overhead_s))
      for k in score_s
    }
    predicted = {0: 1.0, **{k: ar_s / v for k, v in call_s.items()}}
    return {
      "num_draft_tokens": speedup.choose_draft_length(predicted),
      "alpha": float(speculative.summarize(probes)["alpha"]),
      "row_alphas": [float(a) for a in row_alphas],
      "probe_tokens": int(sum(np.asarray(o.num_generated).sum() for o in probes)),
      "largest": largest,
      "measured_at_largest": predicted[largest],
      "overhead_per_iteration_ms": overhead_s * 1e3,
      "modelled": modelled,
      "predicted": predicted,
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
  rows = choice["row_alphas"]
  return (
    f"K={chosen} chosen automatically ({why}; {options}): K={choice['largest']} measured "
    f"{choice['measured_at_largest']:.2f}x on the first batch ({choice['probe_tokens']} tokens "
    f"in untimed probe calls), alpha {choice['alpha']:.3f} (rows {min(rows):.2f}-"
    f"{max(rows):.2f}), a target step {choice['target_step_ms']:.3f} ms, a draft step in the "
    f"loop {choice['draft_step_in_loop_ms']:.3f} ms"
  )
