r"""The GPU benchmark (configs/device_benchmark.py); scripts/device_benchmark.sh runs it.

  python scripts/device_benchmark.py --config=configs/device_benchmark.py --out=$OUT
  python scripts/device_benchmark.py --config=configs/device_benchmark.py:tiny --out=/tmp/dev
  python scripts/device_benchmark.py --summary=$OUT/results.json     # the table again

Runs the correctness gate, then the timed sections, each under its own time budget, writing
--out/results.json after every section and printing a table with the goals checked last
(specsamp/experiments/benchmarks/device_benchmark.py).
"""

import json
import sys

from absl import flags

from specsamp.experiments import cli
from specsamp.experiments.benchmarks import device_benchmark

_CONFIG = cli.define_config("config", "configs/device_benchmark.py", "GPU benchmark config.")
_OUT = flags.DEFINE_string("out", "benchmark_results/device", "Where results.json goes.")
_APPEND = flags.DEFINE_bool(
  "append", False, "Keep the sections --out/results.json already holds (another process's)."
)
_SUMMARY = flags.DEFINE_string(
  "summary", None, "Print the table of this results.json and exit (nothing is run)."
)
flags.adopt_module_key_flags(cli)  # --help lists the shared flags too.


def main(argv):
  cli.start(argv)
  if _SUMMARY.value:
    with open(_SUMMARY.value, encoding="utf-8") as f:
      print(device_benchmark.format_summary(json.load(f)))
    return
  results = device_benchmark.run(
    _CONFIG.value, _OUT.value, log=lambda line: print(line, flush=True), append=_APPEND.value
  )
  print(device_benchmark.format_summary(results), flush=True)
  if "gate" in results and device_benchmark.gate_failed(results["gate"]):
    sys.exit(3)  # The shell script then times nothing.


if __name__ == "__main__":
  cli.run(main)
