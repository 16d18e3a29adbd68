r"""Where a speculative iteration's time goes (configs/benchmark_loop.py).

  python scripts/benchmark_loop.py --config=configs/benchmark_loop.py
  python scripts/benchmark_loop.py --config=configs/benchmark_loop.py --config.batch_sizes=1

Trains the default pair first if --workdir lacks it. For each batch size prints, as medians
of interleaved rounds: a target step, a draft step, an autoregressive loop step, the
speculative loop's iteration with every draft rejected and with every draft accepted, each
phase of the iteration timed alone (specsamp/experiments/benchmarks/loop_phases.py), and
the launched operations per iteration by phase, read from the compiled program; with
--config.profile=True, one profiled call of each real loop, its time summed by name scope
(specsamp/experiments/benchmarks/op_profile.py). Writes the results as JSON to config.output.
"""

import os

from absl import flags

from specsamp import files
from specsamp.experiments import cli
from specsamp.experiments.benchmarks import loop_phases

_CONFIG = cli.define_config("config", "configs/benchmark_loop.py", "Loop benchmark config.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Pair cache; default workdir/<pair name>.")
flags.adopt_module_key_flags(cli)  # --help lists the shared flags too.


def main(argv):
  cli.start(argv)
  config = _CONFIG.value
  results = loop_phases.run(config, _WORKDIR.value, log=lambda line: print(line, flush=True))
  print(loop_phases.format_table(results))
  if config.output:
    os.makedirs(os.path.dirname(config.output) or ".", exist_ok=True)
    files.write_json(config.output, results, indent=1)
    print(f"wrote {config.output}")


if __name__ == "__main__":
  cli.run(main)
