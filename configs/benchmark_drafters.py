"""Drafters and draft-length schedules compared (scripts/benchmark_drafters.py).

  python scripts/benchmark_drafters.py --config=configs/benchmark_drafters.py
  # the test suite's:
  python scripts/benchmark_drafters.py --config=configs/benchmark_drafters.py:test

  # SmolLM2-135M-Instruct (configs/smollm2_pair.py): every drafter at T=0, T=0.8 / top-p 0.95
  # and T=1, batch 1 and 8, on 8 HumanEval problems:
  python scripts/benchmark_drafters.py --config=configs/benchmark_drafters.py:smollm2
  # The feature head on the default pair against the distilled draft and prompt lookup:
  # chains (K=4) and static trees, sampled (real q) against greedy (one-hot q) proposals, at
  # T=0, 0.7, 1 and 0.8 / top-p 0.95 (docs/feature_head.md):
  python scripts/benchmark_drafters.py --config=configs/benchmark_drafters.py:feature
  # The parallel draft (PARD style) against the sequential draft and the feature head:
  python scripts/benchmark_drafters.py --config=configs/benchmark_drafters.py:parallel
  # Dynamic trees (EAGLE-2) of <= 32 nodes from the head (greedy proposals) and a Sequoia tree
  # shaped from measured acceptance per sibling rank, against chains of K=4 and 6 and the
  # distilled draft (docs/feature_head.md):
  python scripts/benchmark_drafters.py --config=configs/benchmark_drafters.py:dynamic

Variants: '' (the default pair), smollm2 (the real target), feature (the feature head's
chains and trees on the default pair), dynamic (dynamic trees on the default pair), parallel
(the parallel draft on the default pair), test (the micro pair, for the tests).
"""

import ml_collections

from specsamp.experiments import config_files

VARIANTS = ("full", "smollm2", "feature", "dynamic", "parallel", "test")


def get_config(arg=None):
  # 'VARIANT[,PAIR]': PAIR a variant of configs/code_pair.py (e.g. 'full,large'); not with
  # smollm2, whose pair is its own.
  variant, _, pair_variant = (arg or "").partition(",")
  variant = variant or "full"
  if variant not in VARIANTS or (pair_variant and variant == "smollm2"):
    raise ValueError(
      f"configs/benchmark_drafters.py: unknown variant {arg!r}; use one of {VARIANTS}, "
      "optionally ',PAIR' with a configs/code_pair.py variant (not with smollm2)."
    )
  config = ml_collections.ConfigDict()
  code_pair = config_files.sibling(__file__, "code_pair")
  config.pair = code_pair.get_config(pair_variant or ("test" if variant == "test" else None))
  config.seed = 0  # Call i samples with fold_in(seed, i).
  config.output_dir = f"benchmark_results/drafters_{variant}"  # results.json, summary.md.
  config.resume = True  # Skip settings already in output_dir/results.json.

  config.tasks = "continue,grounded"  # Held-out code; code that repeats what the prompt holds.
  config.modes = "greedy,sample"  # Greedy, and T=1 (the default pair's main setting).
  # model: the trained draft; model_confident: with a confidence stop; lookup: prompt lookup;
  # selfL: the target's first L layers (the default target has 6).
  config.drafters = "model,model_confident,lookup,self2,self4"
  config.schedules = "fixed,heuristic"  # Draft length: K always, or HF's +2/-1 rule.
  # The scoring call: 'full' (K + 1 positions) and/or 'narrow' (as wide as the longest
  # proposal + 1; chains only).
  config.scorings = "full"
  config.num_draft_tokens = "2,4,6"  # K (the most, for the heuristic schedule).
  # Proposals, ';'-separated: 'chain' (one chain at each K above) and tree shapes (their depth
  # is their K; fixed schedule, not prompt lookup; recursive rejection sampling).
  config.trees = "chain"
  config.chain_verifier = "token"  # A chain's verifier: 'token' (Chen et al.) or 'block'.
  # The confidence stop of model_confident (HF's default), feature_confident and
  # feature_lookup_confident.
  config.confidence_threshold = 0.4
  # feature_lookup*: the most tokens the head drafts (0: K; copies always take K).
  config.head_draft_tokens = 0
  config.lookup_max_ngram = 3  # Prompt lookup tries 3-, 2-, then 1-grams.

  # 'held_out' (num_prompts windows of prompt_tokens), 'text:TEXT', 'file:PATH' or 'humaneval':
  # as code_pair's sampling.prompt_source (flags --prompt, --prompts_file, --humaneval).
  config.prompt_source = "held_out"
  config.num_prompts = 8  # Held-out prompts (batch 1, one per call).
  config.prompt_tokens = 64  # Tokens per prompt.
  config.repeat_tokens = 8  # grounded: how much of the window's start is repeated.
  config.max_new_tokens = 64  # Tokens generated per call.
  config.calls = 8  # Timed calls per setting (after one untimed warm-up); median.
  config.batch_sizes = "1"  # Rows per call; the prompts are split into batches of each.
  config.max_prompts = 0  # A text source's first N prompts (0: all of them).
  config.chat_template = False  # Text prompts as user messages of the tokenizer's template.

  if variant == "smollm2":
    config.pair = config_files.sibling(__file__, "smollm2_pair").get_config()
    config.output_dir = "benchmark_results/drafters_smollm2"
    config.tasks = "continue"
    config.modes = "greedy,nucleus,sample"
    # The distilled draft, prompt lookup and the feature head (trained on the first run). The
    # target's first 8 of 30 layers (self8) accepted 1% of its tokens here: left out.
    config.drafters = "model,lookup,feature"
    config.schedules = "fixed"
    config.num_draft_tokens = "3"
    config.prompt_source = "humaneval"
    config.max_prompts = 8
    config.batch_sizes = "1,8"
    config.calls = 4
  if variant == "feature":
    config.output_dir = "benchmark_results/drafters_feature"
    config.tasks = "continue"
    config.modes = "greedy,t07,sample,nucleus"
    config.drafters = "model,lookup,feature,feature_greedy"
    config.schedules = "fixed"
    config.num_draft_tokens = "4"
    config.chain_verifier = "block"  # The distilled draft's best chain (Sun et al.).
    config.trees = "chain;chains:4x4/distinct;tree:4,2,1,1"  # 16 and 28 nodes, depth 4.
  if variant == "dynamic":
    config.output_dir = "benchmark_results/drafters_dynamic"
    config.tasks = "continue"
    config.modes = "greedy,sample"
    config.drafters = "model,feature,feature_greedy"
    config.schedules = "fixed"
    config.num_draft_tokens = "4,6"
    config.chain_verifier = "block"
    # The static 28-node tree measures the acceptance per sibling rank that shapes a Sequoia
    # tree of the same budget; dynamic trees (greedy proposals only): 16 nodes at depth 4, 24
    # at depth 6 (4 per depth), 32 at depth 6 (wide near the root).
    config.trees = "chain;tree:4,2,1,1;sequoia:28x4;dynamic:4x4;dynamic:4x6;dynamic:8,8,6,4,3,3"
  if variant == "parallel":
    # The parallel draft (K drafts from one call) against the sequential draft and the feature
    # head (sequential and parallel), in one run: chains of K = 2, 4, 8 at T=0, T=1 and
    # T=0.8 / top-p 0.95, batch 1 and 8.
    config.output_dir = "benchmark_results/drafters_parallel"
    config.tasks = "continue"
    config.modes = "greedy,sample,nucleus"
    config.drafters = "model,parallel,feature,parallel_head"
    config.schedules = "fixed"
    config.num_draft_tokens = "2,4,8"
    config.batch_sizes = "1,8"
    config.calls = 4
  if variant == "test":
    config.modes = "greedy"
    config.drafters = "model,lookup"
    config.schedules = "fixed,heuristic"
    config.num_draft_tokens = "2"
    config.num_prompts = 2
    config.prompt_tokens = 16
    config.repeat_tokens = 4
    config.max_new_tokens = 8
    config.calls = 2
  return config
