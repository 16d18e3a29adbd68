r"""What one parallel draft call costs in standalone draft steps (issue 39).

  python scripts/benchmark_parallel.py --config=configs/code_pair.py
  python scripts/benchmark_parallel.py --config=configs/code_pair.py --ks=2,4,8 --batch_size=8

Prepares (or loads) the pair's parallel draft (distilled on the first run, as
``--config.speculative.drafter=parallel`` does) and times one draft step against one parallel
call per K (``specsamp/experiments/benchmarks/parallel_pass.py``).
"""

from absl import flags

from specsamp.experiments import cli
from specsamp.experiments.benchmarks import parallel_pass
from specsamp.experiments.jobs import drafter_specs
from specsamp.experiments.jobs import pair as pair_lib

_PAIR = cli.define_pair_flags()
_KS = flags.DEFINE_list("ks", ["2", "4", "8"], "Draft tokens per parallel call.")
_BATCH = flags.DEFINE_integer("batch_size", 1, "Rows per call.")
_CALLS = flags.DEFINE_integer("calls", 200, "Timed rounds (interleaved); medians.")

flags.adopt_module_key_flags(cli)  # --help lists the shared flags too.


def main(argv):
  cli.start(argv)
  config = _PAIR.pair_config()
  pair = pair_lib.prepare(config, _PAIR.workdir.value, draft_modes=["parallel"])
  drafter = drafter_specs.make(
    drafter_specs.DrafterSpec("parallel"),
    pair,
    mask_token_id=config.draft.train.distill.mask_token,
  )
  ks = [int(k) for k in _KS.value]
  result = parallel_pass.time_pass(drafter, ks, batch_size=_BATCH.value, calls=_CALLS.value)
  print(
    f"draft step (1 token per row, batch {_BATCH.value}): {result['step_ms']:.3f} ms, "
    f"{result['step_gflop']:.4f} GFLOP, {result['step_mb']:.2f} MB accessed"
  )
  for k in ks:
    cost = result["calls"][k]
    print(
      f"parallel call, K={k} (width {2 * k}): {cost['ms']:.3f} ms = "
      f"{cost['draft_steps']:.2f} steps; "
      f"{cost['gflop']:.4f} GFLOP = {cost['gflop'] / result['step_gflop']:.1f}x the step's, "
      f"{cost['mb']:.2f} MB = {cost['mb'] / result['step_mb']:.2f}x"
    )


if __name__ == "__main__":
  cli.run(main)
