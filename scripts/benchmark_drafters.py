r"""Drafters (trained draft, confidence stop, prompt lookup, self-speculative) and fixed vs
adaptive draft length, on held-out code and on an input-grounded task.

  python scripts/benchmark_drafters.py --config=configs/benchmark_drafters.py
  python scripts/benchmark_drafters.py --config=configs/benchmark_drafters.py \
      --config.tasks=grounded --config.drafters=lookup,model --config.num_draft_tokens=4,8

Prepares (or loads) the pair, then for each setting times autoregressive and
speculative sampling at batch 1 and prints speedup, tokens per target call,
mean draft length and acceptance; writes results.json (resumable) and
summary.md to --config.output_dir.
"""

from absl import flags
from ml_collections import config_flags

from specsamp.experiments import benchmark_drafters, cli

_CONFIG = config_flags.DEFINE_config_file(
  "config", "configs/benchmark_drafters.py", "Comparison config."
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoint cache; default workdir/<pair name>.")


def main(argv):
  cli.start(argv)
  benchmark_drafters.run(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  cli.run(main)
