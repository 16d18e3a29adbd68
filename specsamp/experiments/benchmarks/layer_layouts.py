"""A model's call with its layers scanned, unrolled over the stack and unstacked, against the
weight-read floor: what ``layer_layout`` chooses between (``transformer.unstack_layers``).

``compare`` times each model's call at each token count in every layout of
``shaped_pair.LAYER_MODES``, interleaved in rounds (medians), each beside the memory-bandwidth
floor of ``perf_model.call_cost`` on this machine's measured bandwidth.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

import ml_collections

from specsamp.experiments.benchmarks import perf_model, shaped_pair, timing
from specsamp.experiments.benchmarks.harness import Bench
from specsamp.experiments.jobs import drafter_specs
from specsamp.experiments.jobs import prompts as prompts_lib
from specsamp.models import transformer
from specsamp.models.config import TransformerConfig


def compare(
  configs: dict[str, TransformerConfig],
  tokens: Sequence[int] = (1, 5, 9),
  cache_slots: int = 105,
  rounds: int = 3,
  log: Callable[[str], None] = print,
) -> dict[str, Any]:
  """{'machine': {'memory_bandwidth', 'matmul_flops'}, 'results': {'NAME/T': {'floor_ms',
  MODE + '_ms', MODE + '_of_floor' for each layout}}}: batch 1, random weights (only shapes
  matter), ``cache_slots`` slots half full."""
  bandwidth, flops = timing.measure_memory_bandwidth(), timing.measure_matmul_flops()
  hardware = perf_model.cpu_hardware(bandwidth, flops)
  results = {}
  for name, config in configs.items():
    stacked = transformer.create(config, seed=0)
    models = {mode: shaped_pair.with_layers(stacked, mode) for mode in shaped_pair.LAYER_MODES}
    for count in tokens:
      call = perf_model.call_cost(config, hardware, perf_model.MeshShape(), 1, count, cache_slots)
      seconds = {mode: [] for mode in models}
      for _ in range(rounds):
        for mode, model in models.items():
          seconds[mode].append(timing.time_calls(model, 1, count, cache_slots))
      record = {"floor_ms": call.memory_s * 1e3}
      for mode, values in seconds.items():
        ms = statistics.median(values) * 1e3
        record[f"{mode}_ms"] = ms
        record[f"{mode}_of_floor"] = record["floor_ms"] / ms
      results[f"{name}/{count}"] = record
      log(
        f"{name}, {count} token(s): floor {record['floor_ms']:.3f} ms; "
        + ", ".join(
          f"{mode} {record[f'{mode}_ms']:.3f} ms ({record[f'{mode}_of_floor']:.0%})"
          for mode in models
        )
      )
  return {"machine": {"memory_bandwidth": bandwidth, "matmul_flops": flops}, "results": results}


def compare_loops(
  config: ml_collections.ConfigDict,
  workdir: str | None = None,
  calls: int = 16,
  log: Callable[[str], None] = print,
) -> dict[str, Any]:
  """The pair config's autoregressive and speculative loops (its drafter, K =
  ``speculative.num_draft_tokens`` fixed, its sampling settings and prompts) with the models
  stacked and unstacked, all four samplers interleaved in one process (``calls`` calls each,
  the prompts cycled): {'ms_per_token': {'autoregressive'|'speculative': {'stacked',
  'unstacked'}}, 'speedup': {layout: ...}, 'calls'}. ms per token: each call's seconds over
  its longest row's new tokens, medians."""
  s, spec = config.sampling, drafter_specs.parse(config.speculative.drafter)
  common = dict(
    max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p
  )
  if config.speculative.get("narrow_scoring", False):
    common["narrow_scoring"] = True
  k = config.speculative.num_draft_tokens
  samplers, batches = {}, None
  for layout in ("stacked", "unstacked"):
    layout_config = ml_collections.ConfigDict(config.to_dict())
    layout_config.layer_layout = layout
    pair = drafter_specs.prepare_pair(spec, layout_config, workdir, log)
    draft = drafter_specs.make(spec, pair, config.speculative.get("proposal", "sampled"))
    prompts = prompts_lib.of_pair(
      pair, s.prompt_source, chat=bool(s.get("chat_template", False)), limit=s.max_prompts
    )
    batches = prompts_lib.batches(prompts, s.batch_size)
    bench = Bench(
      pair, cache_slots=prompts.tokens.shape[1] + s.max_new_tokens + k + 1, seed=s.seed,
      drafters={"draft": draft},
    )  # fmt: skip
    samplers[("autoregressive", layout)] = bench.sample("draft", num_draft_tokens=0, **common)
    samplers[("speculative", layout)] = bench.sample("draft", num_draft_tokens=k, **common)
  timed = timing.time_interleaved(samplers, batches, calls=calls)
  ms = {"autoregressive": {}, "speculative": {}}
  for (loop, layout), t in timed.items():
    per_token = [sec / max(n, 1) for sec, n in zip(t.seconds, t.sequential_tokens)]
    ms[loop][layout] = statistics.median(per_token) * 1e3
  speedup = {lay: ms["autoregressive"][lay] / ms["speculative"][lay] for lay in ms["speculative"]}
  result = {"ms_per_token": ms, "speedup": speedup, "calls": calls}
  log(
    "; ".join(
      f"{lay}: autoregressive {ms['autoregressive'][lay]:.2f} ms/token, speculative "
      f"{ms['speculative'][lay]:.2f} ({speedup[lay]:.2f}x)"
      for lay in speedup
    )
  )
  return result
