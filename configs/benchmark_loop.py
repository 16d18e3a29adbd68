"""The loop benchmark (scripts/benchmark_loop.py): where a speculative iteration's time goes.

Launch:
  python scripts/benchmark_loop.py --config=configs/benchmark_loop.py            # batch 1 and 8
  python scripts/benchmark_loop.py --config=configs/benchmark_loop.py --config.batch_sizes=1
  python scripts/benchmark_loop.py --config=configs/benchmark_loop.py --config.batch_sizes=1 \
      --config.num_draft_tokens=8 --config.profile=True     # + where the real loops' time goes

Arguments:
  (none)  the default pair (configs/code_pair.py), K=4, T=1, a 128-token prompt, batch 1
          and 8, 5 interleaved rounds: about 6 minutes on a 2-core CPU once the pair is
          trained.
  smollm2 the real target (configs/smollm2_pair.py, its distilled draft), K=3, T=0.8 /
          top-p 0.95, batch 1 and 8, 3 rounds: where a 49,152-token vocabulary's iteration
          goes.
  test    the micro pair, 1 round, for the test suite.
"""

import ml_collections

from specsamp.experiments import config_files

code_pair = config_files.sibling(__file__, "code_pair")

VARIANTS = ("default", "smollm2", "test")


def get_config(arg=None):
  variant = arg or "default"
  if variant not in VARIANTS:
    raise ValueError(f"configs/benchmark_loop.py: unknown variant {arg!r}; use one of {VARIANTS}.")
  config = ml_collections.ConfigDict()
  config.pair = code_pair.get_config("test" if variant == "test" else None)  # The pair to time.
  config.output = "docs/benchmarks/loop.json"  # Where the results go ('' writes nothing).
  config.batch_sizes = "1,8"  # Rows per call.
  config.num_draft_tokens = 4  # K.
  config.temperature = 1.0  # Both models sample at this temperature (0 is greedy).
  config.top_p = 1.0  # Nucleus mass.
  config.prompt_tokens = 128  # Tokens of the (synthetic) prompt of every row.
  # An iteration's cost is (time of a long_tokens call - time of a short_tokens call) over
  # their difference in iterations: the fixed cost of a call drops out.
  config.short_tokens = 32
  config.long_tokens = 128
  config.rounds = 5  # Interleaved rounds; every number is the median over them.
  # Also profile one call of each real loop (token verifier, long_tokens new tokens) and sum
  # its operations' time by name scope (benchmarks/op_profile.py), scopes this many deep
  # (3: score/layer/mlp).
  config.profile = False
  config.profile_depth = 3
  if variant == "smollm2":
    config.pair = config_files.sibling(__file__, "smollm2_pair").get_config()
    config.output = "docs/benchmarks/loop_smollm2.json"
    config.num_draft_tokens = 3
    config.temperature = 0.8
    config.top_p = 0.95
    config.rounds = 3
  if variant == "test":
    config.output = ""
    config.batch_sizes = "1"
    config.num_draft_tokens = 2
    config.prompt_tokens = 8
    config.short_tokens = 4
    config.long_tokens = 8
    config.rounds = 1
  return config
