r"""The analytic performance model: the paper's check, this machine's calibration, a K advisor.

  python scripts/perf_model.py                        # the paper's 70B/4B on 16 TPU v4
  python scripts/perf_model.py --results=benchmark_results/full/results.json   # + this CPU
  python scripts/perf_model.py --hardware=h100 --target=configs/chinchilla_70b.py \
      --draft=configs/chinchilla_4b.py --tensor=8 --alpha=0.8    # recommend K elsewhere
  # The paper's 70B target with a feature head (EAGLE-3: 3 fused layers, a 32k shared head)
  # in place of the 4B draft, at a measured acceptance:
  python scripts/perf_model.py --hardware=tpu_v4 --tensor=16 --feature_head_layers=3 --alpha=0.8

Prints Markdown tables (docs/benchmarks.md quotes them). The model and its
assumptions: specsamp/experiments/benchmarks/perf_model.py.
"""

import json

from absl import flags

from specsamp import files
from specsamp.experiments import cli
from specsamp.experiments.benchmarks import perf_model, perf_report
from specsamp.models.config import TransformerConfig

_TARGET = cli.define_config("target", "configs/chinchilla_70b.py", "Target config.")
_DRAFT = cli.define_config("draft", "configs/chinchilla_4b.py", "Draft config.")
_RESULTS = flags.DEFINE_string("results", None, "A benchmark results.json to calibrate on.")
_HARDWARE = flags.DEFINE_enum(
  "hardware", None, sorted(perf_model.PRESETS), "Recommend K for the target/draft on this hardware."
)
_TENSOR = flags.DEFINE_integer("tensor", 1, "Tensor-parallel chips (with --hardware).")
_BATCH = flags.DEFINE_integer("batch_size", 1, "Rows per call (with --hardware).")
_ALPHA = flags.DEFINE_float("alpha", 0.8, "Measured acceptance (with --hardware).")
_CACHE = flags.DEFINE_integer("cache_length", 1024, "KV cache slots (with --hardware).")
_ETA = flags.DEFINE_float("eta", None, "Roofline efficiency; default: the paper calibration's.")
_TAU = flags.DEFINE_float("tau_ms", None, "Per-call overhead; default: the paper calibration's.")
_HEAD_LAYERS = flags.DEFINE_integer(
  "feature_head_layers",
  0,
  "With --hardware: draft with a feature head fusing this many target layers instead of "
  "--draft (perf_model.feature_head_equivalent); 0 uses --draft.",
)
_HEAD_VOCAB = flags.DEFINE_integer(
  "draft_vocab_size", 0, "The feature head's own vocabulary (0: the target's head, shared)."
)
_JSON = flags.DEFINE_string("json", None, "Also write everything printed as JSON here.")

flags.adopt_module_key_flags(cli)  # --help lists the shared flags too.


def main(argv):
  cli.start(argv)
  target = TransformerConfig.from_config(_TARGET.value.model)
  draft = TransformerConfig.from_config(_DRAFT.value.model)
  output = {}
  if _HARDWARE.value is None:
    check = output["paper"] = perf_model.paper_check(target, draft)
    print("## The paper's setting\n")
    print(perf_report.format_paper_check(check))
  else:
    fit = perf_model.paper_check(target, draft)["fit"]
    efficiency = perf_model.Efficiency(
      eta=_ETA.value if _ETA.value is not None else fit["eta"],
      tau_s=(_TAU.value if _TAU.value is not None else fit["tau_ms"]) / 1e3,
    )
    drafting = draft
    if _HEAD_LAYERS.value:
      drafting = perf_model.feature_head_equivalent(target, _HEAD_LAYERS.value, _HEAD_VOCAB.value)
    choices = perf_model.speedup_by_k(
      target,
      drafting,
      _ALPHA.value,
      perf_model.PRESETS[_HARDWARE.value],
      perf_model.MeshShape(tensor=_TENSOR.value),
      efficiency,
      batch_size=_BATCH.value,
      cache_length=_CACHE.value,
      name="feature head" if _HEAD_LAYERS.value else "draft",
    )
    output["recommendation"] = [vars(c) for c in choices]
    title = f"{perf_model.PRESETS[_HARDWARE.value].name} x {_TENSOR.value}, batch {_BATCH.value}"
    print(perf_report.format_recommendation(choices, title, _ALPHA.value, efficiency))
  if _RESULTS.value:
    with open(_RESULTS.value) as f:
      report = output["cpu"] = perf_report.cpu_report(json.load(f))
    print(f"\n## This machine ({_RESULTS.value})\n")
    print(perf_report.format_cpu_report(report))
  if _JSON.value:
    files.write_atomically(_JSON.value, json.dumps(output, indent=1, default=str))


if __name__ == "__main__":
  cli.run(main)
