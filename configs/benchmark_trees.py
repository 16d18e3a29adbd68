"""Tree and multi-draft proposals against the single chain (scripts/benchmark_trees.py).

Launch:
  python scripts/benchmark_trees.py --config=configs/benchmark_trees.py
  python scripts/benchmark_trees.py --config=configs/benchmark_trees.py \
      --config.modes=sample --config.calls=2 --config.trees="chains:2x4;tree:2,2,1,1"
  # the test suite's:
  python scripts/benchmark_trees.py --config=configs/benchmark_trees.py:test

Variants:
  (none)  full: the default pair (configs/code_pair.py), greedy, sample and
          nucleus, the chain at K=4 (token-wise and block verification) and
          four depth-4 trees of up to 16 nodes (token-wise and traversal
          verification), 16 held-out prompts of 32 tokens, 64 new tokens, 8 timed
          calls per setting: 28 settings, resumable.
  test    the micro pair of configs/code_pair.py:test, one mode, one tree: for the tests.
"""

import ml_collections

from specsamp.experiments import config_files

VARIANTS = ("full", "test")


def get_config(arg=None):
  variant = arg or "full"
  if variant not in VARIANTS:
    raise ValueError(f"configs/benchmark_trees.py: unknown variant {arg!r}; use one of {VARIANTS}.")
  code_pair = config_files.sibling(__file__, "code_pair")
  config = ml_collections.ConfigDict()
  config.pair = code_pair.get_config("test" if variant == "test" else None)  # The pair to time.
  config.seed = 0  # Sampling seeds: call i uses fold_in(seed, i).
  config.output_dir = f"benchmark_results/trees_{variant}"  # results.json, summary.md.
  config.resume = True  # Keep (and skip) settings already in output_dir/results.json.

  config.modes = "greedy,sample,nucleus"  # greedy; T=1; T=0.8 top-p 0.95 (HumanEval).
  config.num_draft_tokens = 4  # D: the chain's K and every tree's depth.
  config.chain_verifiers = "token,block"  # The single chain's verifiers (greedy: argmax, once).
  config.tree_verifiers = "token,traversal"  # The trees' verifiers (greedy: argmax, once).
  # Tree shapes, ';'-separated (specsamp/sampling/tree.py): K chains of D tokens, or branching
  # factors per depth (siblings drawn without replacement). Each depth must be num_draft_tokens.
  config.trees = "chains:2x4;chains:4x4;tree:2,2,1,1;tree:4,1,1,1"

  # 'held_out' (num_prompts windows of prompt_tokens), 'text:TEXT', 'file:PATH' or 'humaneval':
  # as code_pair's sampling.prompt_source (flags --prompt, --prompts_file, --humaneval).
  config.prompt_source = "held_out"
  config.num_prompts = 16  # Held-out prompts (batch 1, one per call).
  config.prompt_tokens = 32  # Tokens per prompt.
  config.max_new_tokens = 64  # Tokens generated per call.
  config.calls = 8  # Timed calls per setting (after one untimed warm-up); median.

  # The predicted section: the paper's 70B target and 4B draft on 16 chips of this hardware
  # (specsamp/experiments/benchmarks/perf_model.py PRESETS), calibrated to the paper's step times.
  config.predict_hardware = "tpu_v4"
  config.predict_target = config_files.sibling(__file__, "chinchilla_70b").get_config().model
  config.predict_draft = config_files.sibling(__file__, "chinchilla_4b").get_config().model

  if variant == "test":
    config.modes = "sample"
    config.num_draft_tokens = 2
    config.trees = "tree:2,1"
    config.chain_verifiers = "block"
    config.tree_verifiers = "traversal"
    config.num_prompts = 2
    config.prompt_tokens = 8
    config.max_new_tokens = 8
    config.calls = 1
  return config
