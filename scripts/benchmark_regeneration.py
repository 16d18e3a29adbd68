r"""Regeneration's decoding three ways (specsamp/experiments/benchmarks/regeneration.py): batches
to their longest answer, finished rows leaving them, and one batch that waiting prompts refill.

  python scripts/benchmark_regeneration.py --config=configs/smollm2_pair.py --output=result.json
"""

from absl import flags

from specsamp import files
from specsamp.experiments import cli
from specsamp.experiments.benchmarks import regeneration

_PAIR = cli.define_pair_flags()
_PROMPTS = flags.DEFINE_integer("prompts", 128, "Prompts answered (sorted by length).")
_BATCH = flags.DEFINE_integer("batch_size", 32, "Prompts answered together.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 256, "Answer tokens at most.")
_SETTING = flags.DEFINE_enum("setting", "greedy", ["greedy", "nucleus", "t1"], "Sampling.")
_REPEATS = flags.DEFINE_integer("repeats", 1, "Timed runs of each way (after an untimed one).")
_OFFSET = flags.DEFINE_integer("offset", 0, "First prompt of the shuffled training split.")
_WIDTH_STEP = flags.DEFINE_integer(
  "width_step",
  64,
  "Prompts pad to a multiple of this (384: one width, as on a GPU, and the untimed round "
  "compiles every program).",
)
_OUTPUT = flags.DEFINE_string("output", None, "Also write the result (JSON) here.")
cli.output_file(_OUTPUT)

flags.adopt_module_key_flags(cli)


def main(argv):
  cli.start(argv)
  result = regeneration.compare(
    _PAIR.pair_config(),
    _PAIR.workdir.value,
    prompts=_PROMPTS.value,
    batch_size=_BATCH.value,
    max_new_tokens=_MAX_NEW.value,
    setting=_SETTING.value,
    repeats=_REPEATS.value,
    offset=_OFFSET.value,
    width_step=_WIDTH_STEP.value,
  )
  if _OUTPUT.value:
    files.write_json(_OUTPUT.value, result, indent=1)


if __name__ == "__main__":
  cli.run(main)
