r"""A feature head's training step with the target run at every step against read from its
stored outputs (specsamp/experiments/benchmarks/head_step.py): interleaved, medians.

  python scripts/benchmark_head_step.py --config=configs/smollm2_pair.py --output=result.json

Reads WORKDIR/regenerated/held_out (scripts/regenerate.py --split=held_out) and builds its store
in WORKDIR/target_outputs/held_out if it is not there yet.
"""

import os

from absl import flags

from specsamp import files
from specsamp.experiments import cli
from specsamp.experiments.benchmarks import head_step
from specsamp.experiments.jobs import pair as pair_lib

_PAIR = cli.define_pair_flags()
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed steps of each kind.")
_OUTPUT = flags.DEFINE_string("output", None, "Also write the result (JSON) here.")
cli.output_file(_OUTPUT)

flags.adopt_module_key_flags(cli)


def main(argv):
  cli.start(argv)
  config = _PAIR.pair_config()
  workdir = os.path.abspath(_PAIR.workdir.value or pair_lib.default_workdir(config))
  result = head_step.compare(config, workdir, repeats=_REPEATS.value)
  if _OUTPUT.value:
    files.write_json(_OUTPUT.value, result, indent=1)


if __name__ == "__main__":
  cli.run(main)
