r"""Tree and multi-draft proposals against the single chain, measured on the default pair and
predicted for the paper's 70B/4B pair on 16 TPU v4 chips.

  python scripts/benchmark_trees.py --config=configs/benchmark_trees.py
  python scripts/benchmark_trees.py --config=configs/benchmark_trees.py \
      --config.modes=sample --config.calls=2 --config.trees="chains:2x4;tree:2,2,1,1"
  python scripts/benchmark_trees.py --config=configs/benchmark_trees.py:test   # the tests'

Prepares (or loads) the pair, then at batch 1 for each mode times autoregressive
sampling, the chain of K draft tokens (token-wise and block verification) and
each tree of --config.trees (';'-separated; token-wise and traversal
verification), and prints per mode ms/token, speedup, tokens per target call,
alpha, nodes per call and the measured cost of scoring N+1, K+1 and 1 tokens;
then the speedup the performance model predicts for the same tokens per call
with Chinchilla 70B / 4B on 16 TPU v4 chips. Writes results.json (resumable) and
summary.md to --config.output_dir. --prompt, --prompts_file or --humaneval time
those prompts instead of held-out windows (config.prompt_source).
"""

from absl import flags

from specsamp.experiments import cli
from specsamp.experiments.benchmarks import benchmark_trees

_CONFIG = cli.define_config("config", "configs/benchmark_trees.py", "Tree benchmark config.")
_PROMPTS = cli.define_prompt_flags()
_WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoint cache; default workdir/<pair name>.")

flags.adopt_module_key_flags(cli)  # --help lists the shared flags too.


def main(argv):
  cli.start(argv)
  config = _CONFIG.value
  if _PROMPTS.source():
    config.prompt_source = _PROMPTS.source()
  benchmark_trees.run(config, _WORKDIR.value)


if __name__ == "__main__":
  cli.run(main)
