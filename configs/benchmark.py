"""The benchmark sweep (scripts/benchmark.py) over the default pair.

Launch:
  python scripts/benchmark.py --config=configs/benchmark.py                # the full CPU sweep
  python scripts/benchmark.py --config=configs/benchmark.py:quick          # K=2,4,8, batch 1
  python scripts/benchmark.py --config=configs/benchmark.py:auto           # K=auto vs 4, batch 1-16
  python scripts/benchmark.py --config=configs/benchmark.py \
      --config.modes=nucleus --config.batch_sizes=1 --config.num_draft_tokens=1,2,3,4

Arguments:
  (none)  every K in 1..8, the three sampling modes, batch 1, 4 and 16, both
          verifiers, the trained drafts (token distillation and from scratch)
          and the synthetic drafter: about 300 settings, over an hour on a
          2-core CPU (batch 16 dominates). Resumable: settings already in
          results.json are skipped, so it runs in pieces (docs/benchmarks.md
          gives the pieces its tables were measured with).
  quick   K in {2, 4, 8}, batch 1, the distilled draft and synthetic: ~3 minutes.
  auto    the automatic draft length against K=4, greedy and nucleus, batch 1, 4, 8 and 16,
          the distilled draft: is speculative sampling ever slower than autoregressive?
  test    the micro pair of configs/code_pair.py:test, for the test suite.
"""

import ml_collections

from specsamp.experiments import config_files

code_pair = config_files.sibling(__file__, "code_pair")

VARIANTS = ("full", "quick", "auto", "test")


def get_config(arg=None):
  # 'VARIANT[,PAIR]': PAIR a variant of configs/code_pair.py to time (e.g. 'quick,large' on a
  # TPU VM whose workdir holds the large pair); default: the CPU-sized pair, 'test' for 'test'.
  variant, _, pair_variant = (arg or "").partition(",")
  variant = variant or "full"
  if variant not in VARIANTS:
    raise ValueError(f"configs/benchmark.py: unknown variant {arg!r}; use one of {VARIANTS}.")
  config = ml_collections.ConfigDict()
  config.pair = code_pair.get_config(  # The pair to time.
    pair_variant or ("test" if variant == "test" else None)
  )
  config.seed = 0  # Sampling seeds: call i uses fold_in(seed, i).
  config.output_dir = f"benchmark_results/{variant}"  # results.json, results.csv, *.png.
  config.resume = True  # Keep (and skip) settings already in output_dir/results.json.

  config.modes = "greedy,nucleus,sample"  # greedy; T=0.8 top-p 0.95 (HumanEval); T=1.
  # K values, and 'auto': the automatic draft length (the sample job's default), choosing K
  # in 0..the largest K listed from measured costs and an untimed call's acceptance.
  config.num_draft_tokens = "1,2,3,4,5,6,7,8,auto"
  config.batch_sizes = "1,4,16"  # Rows per call; each must divide num_prompts.
  config.verifiers = "token,block"  # Greedy verifies by argmax: it runs once, as 'token'.
  config.drafters = "token,none,synthetic"  # Draft distillation modes, and 'synthetic'.
  config.synthetic_acceptance = 0.8  # The synthetic drafter's acceptance probability.

  # 'held_out' (num_prompts windows of prompt_tokens), 'text:TEXT', 'file:PATH' or 'humaneval':
  # as code_pair's sampling.prompt_source (flags --prompt, --prompts_file, --humaneval).
  config.prompt_source = "held_out"
  config.num_prompts = 16  # Held-out prompts; calls cycle through them in batches.
  config.prompt_tokens = 32  # Tokens per prompt.
  config.max_new_tokens = 64  # Tokens generated per row and call.
  config.calls = 8  # Timed calls per setting (after one compile-and-warm-up call); median.

  # Roofline: single calls of these models (random weights) against the memory floor.
  config.roofline_models = ml_collections.ConfigDict()
  config.roofline_models.target = config.pair.target.model
  config.roofline_models.draft = config.pair.draft.model
  config.roofline_models.large_target = code_pair.get_config("large").target.model
  config.roofline_batch_sizes = "1,4,16"  # Batch sizes of the roofline calls.
  config.roofline_tokens = "1,2,5,9"  # Tokens per row: a decode step, and scoring K+1.

  if variant == "quick":
    config.num_draft_tokens = "2,4,8,auto"
    config.batch_sizes = "1"
    config.drafters = "token,synthetic"
    config.roofline_batch_sizes = "1"
    config.roofline_tokens = "1,5"
  elif variant == "auto":
    config.modes = "greedy,nucleus"
    config.num_draft_tokens = "4,auto"
    config.batch_sizes = "1,4,8,16"
    config.drafters = "token"
    config.roofline_models = ml_collections.ConfigDict()
  elif variant == "test":
    config.modes = "sample"
    config.num_draft_tokens = "2,auto"
    config.batch_sizes = "1"
    config.drafters = "token,synthetic"
    config.num_prompts = 2
    config.prompt_tokens = 8
    config.max_new_tokens = 8
    config.calls = 2
    del config.roofline_models["large_target"]
    config.roofline_batch_sizes = "1"
    config.roofline_tokens = "1,3"
  return config
