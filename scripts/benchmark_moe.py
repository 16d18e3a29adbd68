r"""Scoring K+1 tokens on a mixture-of-experts target, against one decode step: measured on a
small MoE on this machine, and predicted by the performance model for a published MoE target.

  python scripts/benchmark_moe.py                       # 16 experts, top 4; Qwen3-30B-A3B
  python scripts/benchmark_moe.py --experts=64 --per_token=8 --json=docs/benchmarks/moe.json

A dense target's scoring call costs about one step (every weight is read once either way); an
MoE target's step reads the k experts its token selected, its scoring call the union of the
experts of K+1 tokens (specsamp/experiments/benchmarks/moe_scoring.py).
"""

import json

from absl import flags

from specsamp import files
from specsamp.experiments import cli
from specsamp.experiments.benchmarks import moe_scoring, perf_model
from specsamp.hf import architectures
from specsamp.models.config import TransformerConfig

_EXPERTS = flags.DEFINE_integer("experts", 16, "Experts of the measured MoE (E).")
_PER_TOKEN = flags.DEFINE_integer("per_token", 4, "Experts per token (k).")
_D_MODEL = flags.DEFINE_integer("d_model", 256, "Width of the measured MoE.")
_FFN = flags.DEFINE_integer("expert_width", 512, "Each expert's hidden width.")
_LAYERS = flags.DEFINE_integer("layers", 4, "Layers of the measured MoE.")
_K = flags.DEFINE_integer("num_draft_tokens", 4, "K: the scoring call takes K + 1 tokens.")
_ROUNDS = flags.DEFINE_integer("rounds", 7, "Interleaved timing rounds (medians).")
_PREDICT = flags.DEFINE_string(
  "predict_hf_config",
  "configs/hf/qwen3-30b-a3b/config.json",
  "The published MoE target the performance model predicts (an HF config.json).",
)
_HARDWARE = flags.DEFINE_enum(
  "hardware", "tpu_v5e", sorted(perf_model.PRESETS), "Hardware of the prediction."
)
_EXPERT_AXIS = flags.DEFINE_integer("expert_parallel", 8, "Chips the experts are split over.")
_JSON = flags.DEFINE_string("json", None, "Also write the tables as JSON here.")

flags.adopt_module_key_flags(cli)


def main(argv):
  cli.start(argv)
  k = _K.value
  tokens = [1, 2, k + 1]
  config = TransformerConfig(
    vocab_size=512,
    num_layers=_LAYERS.value,
    d_model=_D_MODEL.value,
    num_heads=4,
    num_kv_heads=2,
    ffn_dim=_FFN.value,
    num_experts=_EXPERTS.value,
    experts_per_token=_PER_TOKEN.value,
    normalize_expert_weights=True,
    qk_norm=True,
  )
  measured = moe_scoring.measure(config, tokens, rounds=_ROUNDS.value)
  step = {row["compute"]: row["ms"] for row in measured if row["tokens"] == 1}
  for row in measured:
    row["x_step"] = row["ms"] / step[row["compute"]]
    row["expected_experts"] = perf_model.expected_experts(config, row["tokens"])
  print(
    f"## Measured on this machine: {config.num_layers} layers x {config.d_model}, "
    f"{config.num_experts} experts of width {config.ffn_dim}, top {config.experts_per_token}\n"
  )
  print(
    perf_model.format_table(
      measured, ["compute", "tokens", "ms", "x_step", "experts", "expected_experts"]
    )
  )

  with open(_PREDICT.value) as f:
    target = architectures.from_hf(json.load(f), param_dtype="bfloat16")
  hardware = perf_model.PRESETS[_HARDWARE.value]
  mesh = perf_model.MeshShape(expert=_EXPERT_AXIS.value)
  predicted = moe_scoring.predict(target, hardware, mesh, tokens, cache_length=2048)
  for row in predicted:
    row["x_step"] = row["ms"] / predicted[0]["ms"]
    row["experts"] = perf_model.expected_experts(target, row["tokens"])
  print(
    f"\n## Predicted: {_PREDICT.value} ({target.num_experts} experts, top "
    f"{target.experts_per_token}) on {_EXPERT_AXIS.value} x {hardware.name}, experts split "
    "over the chips, batch 1, 2048 cache slots (memory floor)\n"
  )
  print(perf_model.format_table(predicted, ["tokens", "ms", "x_step", "weight_gb", "experts"]))
  if _JSON.value:
    files.write_json(_JSON.value, {"measured": measured, "predicted": predicted}, indent=2)


if __name__ == "__main__":
  cli.run(main)
