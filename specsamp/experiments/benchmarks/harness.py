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
  bench.step_costs(draft, batch, k)        the ``speedup.StepCosts`` of one setting
  bench.choose_draft_length(...)           the automatic K (below) and why

The automatic draft length (``specsamp/sampling/draft_length.py``) picks K in 0..K_max with
the best predicted speedup. It probes the loop at K_max and about half of it (a few calls of
each, one per batch of the workload's first batches, interleaved with the autoregressive loop,
with keys no timed call uses), fits seconds per iteration = a + b K to those loops, models
every K from it and the measured acceptance, and scales the model to the probes' measured speedups
(``draft_length.choose_from_probes``). K = 0 (autoregressive) when no K is predicted 1.05x. The
choice looks only at costs and at calls that are not among the calls it is made for, so those
stay exact.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from specsamp import multihost, sharding
from specsamp.experiments.benchmarks import speedup, timing
from specsamp.sampling import draft_length, drafters
from specsamp.sampling import statistics as sampling_statistics
from specsamp.sampling.sampler import Sampler

TARGET = "target"
"""The name of the pair's target among a Bench's models."""


def step_model(model: Any) -> Any:
  """What a step's cost is timed on: a decode-protocol model as it is, a drafter's
  ``step_model()`` (None for prompt lookup, which calls no model)."""
  return model.step_model() if isinstance(model, drafters.Drafter) else model


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
    eos_id: int | Sequence[int] | None = None,
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
      called = step_model(self.models[model])
      self._seconds[key] = (  # A drafter that calls no model has no step to time.
        0.0
        if called is None
        else self.call(timing.time_calls, called, batch_size, tokens, self.cache_slots)
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
    self, draft: str, batches: Sequence[Any], largest: int, probe_calls: int = 5, **kwargs
  ) -> dict[str, Any]:
    """The automatic draft length for ``draft`` at the size of ``batches``' first batch
    (``draft_length.py``); ``kwargs`` are the sampling arguments (``max_new_tokens`` among
    them).

    Measured: ``probe_calls`` calls each of the autoregressive loop and of the speculative
    loop at each of ``draft_length.probe_lengths(largest)`` (the largest K and about half of
    it), interleaved, with keys from index ``timing.WARMUP_INDEX + 1`` on (which no timed call
    uses). Call i runs on the i-th of ``batches``' first batches of the first one's shape
    (cycled when there are fewer): the workload's prompts, not its first prompt probed again.
    On SmolLM2 the first HumanEval prompt read 1.06-1.08x at T=0 where the 8 read 1.27x, so
    probing it alone chose short drafts, or none, for the whole workload (2026-12-02). Each
    loop's seconds and iterations are its means over those calls (a ratio of sums, as the job
    measures its speedup; a median of calls on different prompts would pair one prompt's
    autoregressive call with another's speculative one). Fitted: seconds per loop iteration =
    a + b K (``draft_length.IterationCost``) from the probes' seconds and iterations per call.
    Modelled for every K in 1..largest: the measured autoregressive call over the slowest
    row's expected iterations times a + b K, each row's tokens per iteration at K read from
    its accepted counts at the largest K (``draft_length.truncated``). Predicted: the model
    scaled to the probes' measured speedups (``draft_length.calibrated``), which the choice
    reads.

    Returns:
      {'num_draft_tokens': K (0: autoregressive), 'alpha', 'row_alphas', 'probe_tokens',
      'largest', 'probes': [{'num_draft_tokens', 'seconds', 'iterations', 'measured'}],
      'iteration_ms': {'fixed', 'per_draft_token'}, 'predicted': {K: speedup},
      'modelled': {K: speedup before the scaling}}.
    """
    lengths = draft_length.probe_lengths(largest)
    max_new_tokens = int(kwargs["max_new_tokens"])
    # One shape: a batch with fewer rows (the last) would not sum with the others' histograms.
    shape = timing.input_shape(batches[0])
    inputs = [b for b in batches if timing.input_shape(b) == shape][:probe_calls]
    timed = timing.time_interleaved(
      {
        "autoregressive": self.sample(None, num_draft_tokens=0, **kwargs),
        **{k: self.sample(draft, num_draft_tokens=k, **kwargs) for k in lengths},
      },
      inputs,
      calls=probe_calls,
      first_index=timing.WARMUP_INDEX + 1,
    )
    # Process 0's seconds on every process of a multi-host run: the K chosen from them picks
    # the loop every process then runs (multihost.agreed). The outputs are the same everywhere.
    ar_s, *probe_s = multihost.agreed(
      [statistics.fmean(timed[name].seconds) for name in ("autoregressive", *lengths)]
    )
    outputs = [o for k in lengths for o in timed[k].outputs]
    pooled = lambda name: sum(np.asarray(getattr(o, name)).sum(-1) for o in outputs)
    probes = [
      draft_length.Probe(
        k, seconds, statistics.fmean(int(o.target_calls) - 1 for o in timed[k].outputs)
      )
      for k, seconds in zip(lengths, probe_s)
    ]
    # Each row's accepted counts at the largest K, over its probe calls: what every K <= it
    # predicts from (draft_length.truncated). Only the iterations max_new_tokens did not cut
    # short: the prediction applies that cap itself (iterations_until_done). A row that
    # max_new_tokens cut every time (N <= K + 1) keeps all its counts: nothing else is known.
    histogram = lambda name: sum(np.asarray(getattr(o, name)) for o in timed[largest].outputs)
    uncapped = histogram("uncapped_histogram")
    row_histograms = np.where(
      uncapped.sum(-1, keepdims=True) > 0, uncapped, histogram("accepted_histogram")
    )
    # Modelled, then scaled to what the probes measured: no prediction overrules a loop that ran.
    choice = draft_length.choose_from_probes(ar_s, probes, row_histograms, max_new_tokens, largest)
    # No draft verified (max_new_tokens 1: the first token is the prefill's): nothing says a K
    # pays, and the probes' timing difference is noise (it chose K=1 at "alpha nan").
    verified = int(pooled("verified_at_position").sum())
    return {
      "num_draft_tokens": choice.num_draft_tokens if verified else 0,
      "verified": verified,
      # Pooled over both probes' positions (summarize pools one K's outputs only).
      "alpha": float(pooled("accepted_at_position").sum() / max(verified, 1)),
      "row_alphas": sampling_statistics.row_alphas(outputs),
      "probe_tokens": int(sum(np.asarray(o.num_generated).sum() for o in outputs)),
      "probe_batches": len(inputs),
      "largest": largest,
      "probes": [{**dataclasses.asdict(p), "measured": ar_s / p.seconds} for p in probes],
      "iteration_ms": {
        "fixed": choice.cost.fixed_s * 1e3,
        "per_draft_token": choice.cost.per_draft_token_s * 1e3,
      },
      "predicted": choice.predicted,
      "modelled": choice.modelled,
    }


def format_choice(choice: dict[str, Any]) -> str:
  """The automatic draft length's choice, and why, in one line."""
  chosen = choice["num_draft_tokens"]
  options = ", ".join(f"K={k} {v:.2f}x" for k, v in choice["predicted"].items())
  why = (
    f"predicted {choice['predicted'][chosen]:.2f}x"
    if chosen
    else "autoregressive: the probes verified no draft"
    if choice.get("verified") == 0
    else "autoregressive: no K is predicted to pay"
  )
  rows = choice["row_alphas"]
  probes = ", ".join(f"K={p['num_draft_tokens']} {p['measured']:.2f}x" for p in choice["probes"])
  cost = choice["iteration_ms"]
  count = choice.get("probe_batches", 1)
  where = "on the first batch" if count == 1 else f"on the first {count} batches"
  return (
    f"K={chosen} chosen automatically ({why}; {options}): probed {probes} {where} "
    f"({choice['probe_tokens']} tokens in untimed calls), an iteration {cost['fixed']:.3f} + "
    f"{cost['per_draft_token']:.3f} x K ms, alpha {choice['alpha']:.3f} (rows {min(rows):.2f}-"
    f"{max(rows):.2f})"
  )
