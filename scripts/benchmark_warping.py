r"""What top-p and top-k warping cost per call, the nucleus searched in its most likely blocks
first against the whole vocabulary (specsamp/experiments/benchmarks/warping_cost.py).

  python scripts/benchmark_warping.py                        # Zipf-like logits, 49,152 tokens
  python scripts/benchmark_warping.py --logits=logits.npy    # your model's [N, V] logits
"""

import json

import numpy as np
from absl import app, flags

from specsamp import files
from specsamp.experiments import cli
from specsamp.experiments.benchmarks import warping_cost

_LOGITS = flags.DEFINE_string("logits", None, "A [N, V] .npy of real logits (default: Zipf-like).")
_VOCAB = flags.DEFINE_integer("vocab", 49_152, "Vocabulary of the Zipf-like logits.")
_EXPONENT = flags.DEFINE_float(
  "zipf",
  1.5,
  "Their exponent: larger is more peaked (1.5: a nucleus of about 19 tokens at T = 0.8).",
)
_BATCH = flags.DEFINE_list("batch_sizes", ["1", "5", "64"], "Rows warped per call.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.8, "Logits are divided by this.")
_TOP_P = flags.DEFINE_float("top_p", 0.95, "Nucleus mass.")
_REPEATS = flags.DEFINE_integer("repeats", 11, "Timed calls of each way (interleaved).")
_OUTPUT = flags.DEFINE_string("output", None, "Also write the records (JSON) here.")
cli.output_file(_OUTPUT)


def main(argv):
  del argv
  batch_sizes = [int(b) for b in _BATCH.value]
  if _LOGITS.value:
    logits = np.load(_LOGITS.value).astype(np.float32)
  else:
    logits = warping_cost.zipf_logits(max(batch_sizes), _VOCAB.value, _EXPONENT.value)
  if len(logits) < max(batch_sizes):
    raise ValueError(f"{_LOGITS.value} has {len(logits)} rows; the largest batch needs more.")
  records = warping_cost.measure(
    logits, batch_sizes, _TEMPERATURE.value, _TOP_P.value, repeats=_REPEATS.value
  )
  for record in records:
    print(json.dumps(record), flush=True)
  if _OUTPUT.value:
    files.write_json(_OUTPUT.value, records, indent=1)


if __name__ == "__main__":
  app.run(main)
