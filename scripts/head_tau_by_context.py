r"""A feature head's tau on the held-out answers, each packed sequence read apart and with whole
rows read causally (specsamp/experiments/benchmarks/head_context.py).

  python scripts/head_tau_by_context.py --config=configs/smollm2_pair.py --output=result.json

Measures --head (default: the config's feature.checkpoint, SmolLM2's shipped head) on the rows
scripts/train_drafter.py measures tau on.
"""

import os

from absl import flags

from specsamp import files
from specsamp.experiments import cli
from specsamp.experiments.benchmarks import head_context
from specsamp.experiments.jobs import pair as pair_lib

_PAIR = cli.define_pair_flags()
_HEAD = flags.DEFINE_string("head", None, "The head's checkpoint (default: feature.checkpoint).")
_OUTPUT = flags.DEFINE_string("output", None, "Also write the result (JSON) here.")
cli.output_file(_OUTPUT)

flags.adopt_module_key_flags(cli)


def main(argv):
  cli.start(argv)
  config = _PAIR.pair_config()
  workdir = os.path.abspath(_PAIR.workdir.value or pair_lib.default_workdir(config))
  result = head_context.compare(config, workdir, _HEAD.value)
  if _OUTPUT.value:
    files.write_json(_OUTPUT.value, result, indent=1)


if __name__ == "__main__":
  cli.run(main)
