r"""What drawing a token costs: the flat exponential race against the two-stage race over
blocks of about sqrt(V) tokens (specsamp/experiments/benchmarks/draw_cost.py).

  python scripts/benchmark_draws.py                                  # 64 to 49,152 tokens
  python scripts/benchmark_draws.py --vocabs=1024 --batch_sizes=1,8,64
"""

from absl import app, flags

from specsamp import files
from specsamp.experiments import cli
from specsamp.experiments.benchmarks import draw_cost

_VOCABS = flags.DEFINE_list(
  "vocabs", ["64", "128", "256", "512", "1024", "4096", "8192", "49152"], "Vocabulary sizes."
)
_BATCH = flags.DEFINE_list("batch_sizes", ["1", "8"], "Rows drawn per call.")
_DRAWS = flags.DEFINE_integer("draws_per_call", 200, "Draws inside one timed call.")
_REPEATS = flags.DEFINE_integer("repeats", 9, "Timed calls of each way (interleaved).")
_OUTPUT = flags.DEFINE_string("output", None, "Also write the records (JSON) here.")
cli.output_file(_OUTPUT)


def main(argv):
  del argv
  records = draw_cost.measure(
    [int(v) for v in _VOCABS.value],
    [int(b) for b in _BATCH.value],
    draws_per_call=_DRAWS.value,
    repeats=_REPEATS.value,
  )
  print("| vocabulary | rows | block | flat race (us) | two stages (us) | ratio | categorical |")
  print("|---|---|---|---|---|---|---|")
  for r in records:
    print(
      f"| {r['vocab']:,} | {r['batch']} | {r['block']} | {r['flat_us']} | {r['two_stage_us']} "
      f"| {r['flat_over_two_stage']}x | {r['categorical']} |"
    )
  if _OUTPUT.value:
    files.write_json(_OUTPUT.value, records, indent=1)


if __name__ == "__main__":
  app.run(main)
