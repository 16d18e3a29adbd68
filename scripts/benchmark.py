r"""Benchmarks autoregressive vs speculative sampling on the default pair (configs/benchmark.py).

  python scripts/benchmark.py --config=configs/benchmark.py          # full sweep, resumable
  python scripts/benchmark.py --config=configs/benchmark.py:quick
  python scripts/benchmark.py --config=configs/benchmark.py --config.modes=greedy \
      --config.batch_sizes=1 --config.output_dir=benchmark_results/greedy

Trains the pair first if --workdir lacks it. Writes results.json, results.csv,
summary.md (Markdown tables) and the PNG figures into config.output_dir, and
prints one line per setting.
--prompt, --prompts_file or --humaneval time those prompts instead of held-out windows
(config.prompt_source). Then run scripts/perf_model.py --results=<output_dir>/results.json.
"""

from absl import flags

from specsamp import files
from specsamp.experiments import cli
from specsamp.experiments.benchmarks import benchmark, plots

_CONFIG = cli.define_config("config", "configs/benchmark.py", "Benchmark config.")
_PROMPTS = cli.define_prompt_flags()
_WORKDIR = flags.DEFINE_string("workdir", None, "Pair cache; default workdir/<pair name>.")

flags.adopt_module_key_flags(cli)  # --help lists the shared flags too.


def main(argv):
  cli.start(argv)
  config = _CONFIG.value
  if _PROMPTS.source():
    config.prompt_source = _PROMPTS.source()
  results = benchmark.run(config, _WORKDIR.value, log=lambda line: print(line, flush=True))
  summary = benchmark.summary_tables(results)
  files.write_atomically(f"{config.output_dir}/summary.md", summary)
  print(summary)
  for path in plots.write_all(results, config.output_dir):
    print(f"wrote {path}")
  print(f"wrote {config.output_dir}/results.json and results.csv")


if __name__ == "__main__":
  cli.run(main)
