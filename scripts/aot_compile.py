r"""Compiles a pair's sampling loops for a TPU slice, on any machine (no TPU needed).

  python scripts/aot_compile.py --config=configs/chinchilla_pair.py --topology=v4-32
  python scripts/aot_compile.py --config=configs/chinchilla_pair.py --topology=v5e-16
  python scripts/aot_compile.py --config=configs/chinchilla_pair.py:test   # seconds

Needs libtpu: pip install -e ".[tpu]". Nothing is allocated: parameters and caches are
abstract shapes with their shardings. Prints, per chip: compile time and memory (arguments,
temporaries, output, total, against the chip's HBM) of the autoregressive loop and of the
speculative loop (prefill, draft, score, verify: the jitted function users run) with each
verifier; the collectives of one target decode step; and the HBM bytes of one target step,
one draft step and one scoring call of K+1 tokens counted from the optimized HLO (each
weight's reads, the cache, intermediates, what is materialised: experiments/proofs/
hlo_bytes.py), the ms they take at HBM bandwidth, beside the performance model, XLA's cost
analysis (FLOPs, bytes accessed) and the paper's 14.1 ms and 1.8 ms.
"""

import sys

from specsamp import files
from specsamp.experiments.proofs import aot

aot.quiet_libtpu()  # Before jax initialises libtpu.

from absl import flags  # noqa: E402

from specsamp.experiments import cli  # noqa: E402

_CONFIG = cli.define_config("config", "configs/chinchilla_pair.py", "Pair config.")
_TOPOLOGY = flags.DEFINE_enum(
  "topology", None, sorted(aot.SLICES), "The TPU slice; default config.aot.topology."
)
_OUTPUT = flags.DEFINE_string("output", None, "Also write the report as JSON here.")
cli.output_file(_OUTPUT)
flags.adopt_module_key_flags(cli)  # --help lists the shared flags too.


def main(argv):
  cli.start(argv)
  report = aot.run(_CONFIG.value, _TOPOLOGY.value, log=lambda line: print(line, flush=True))
  print()
  print(aot.format_report(report))
  if _OUTPUT.value:
    # The command that made it, so that a stored result can be made again exactly.
    files.write_json(_OUTPUT.value, dict(report, argv=["python", *sys.argv]), indent=1)


if __name__ == "__main__":
  cli.run(main)
