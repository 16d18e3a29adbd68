r"""Drafters (trained draft, confidence stop, prompt lookup, self-speculative) and fixed vs
adaptive draft length, on held-out code and on an input-grounded task.

  python scripts/benchmark_drafters.py --config=configs/benchmark_drafters.py
  python scripts/benchmark_drafters.py --config=configs/benchmark_drafters.py \
      --config.tasks=grounded --config.drafters=lookup,model --config.num_draft_tokens=4,8

Prepares (or loads) the pair, then for each setting times autoregressive and
speculative sampling at batch 1 and prints speedup, tokens per target call,
mean draft length and acceptance; writes results.json (resumable) and
summary.md to --config.output_dir. --prompt, --prompts_file or --humaneval sample those
prompts instead of held-out windows (config.prompt_source).
"""

from absl import flags

from specsamp.experiments import cli
from specsamp.experiments.benchmarks import benchmark_drafters

_CONFIG = cli.define_config("config", "configs/benchmark_drafters.py", "Comparison config.")
_PROMPTS = cli.define_prompt_flags()
_WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoint cache; default workdir/<pair name>.")

flags.adopt_module_key_flags(cli)  # --help lists the shared flags too.


def main(argv):
  cli.start(argv)
  config = _CONFIG.value
  if _PROMPTS.source():
    config.prompt_source = _PROMPTS.source()
  benchmark_drafters.run(config, _WORKDIR.value)


if __name__ == "__main__":
  cli.run(main)
