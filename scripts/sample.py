r"""Autoregressive vs speculative sampling on a trained target/draft pair (the main job).

  python scripts/sample.py --config=configs/code_pair.py
  python scripts/sample.py --config=configs/code_pair.py --config.sampling.temperature=0.8 \
      --config.sampling.top_p=0.95 --config.speculative.num_draft_tokens=3 \
      --config.speculative.verifier=block
  python scripts/sample.py --config=configs/code_pair.py --corpus='~/src/**/*.py' \
      --workdir=workdir/my_code
  python scripts/sample.py --config=configs/code_pair.py --output=report.json
  python scripts/sample.py --config=configs/code_pair.py --prompt="def fib(n):"
  python scripts/sample.py --config=configs/code_pair.py --humaneval \
      --config.sampling.temperature=0.8 --config.sampling.top_p=0.95 --output_jsonl=he.jsonl

The first run trains the tokenizer, the target and the distilled draft into
--workdir (default workdir/<config name>), with progress; later runs load them.
Prints sample text from held-out prompts, ms/token of both samplers, the
measured speedup, acceptance (overall and per position), tokens per target
call, the measured step costs and the speedup they predict.
"""

import json

import jax
from absl import flags

from specsamp import files
from specsamp.experiments import cli
from specsamp.experiments.jobs import sample_job

_PAIR = cli.define_pair_flags()
_PROMPTS = cli.define_prompt_flags()
_OUTPUT_JSONL = flags.DEFINE_string(
  "output_jsonl", None, "Write each prompt's continuations and statistics here, one JSON per line."
)
cli.output_file(_OUTPUT_JSONL)
_OUTPUT = flags.DEFINE_string(
  "output",
  None,
  "Also write the report (prompts, generated ids, "
  "texts, statistics, timings) as JSON to this file (process 0).",
)
cli.output_file(_OUTPUT)

flags.adopt_module_key_flags(cli)  # --help lists the shared flags too.


def main(argv):
  cli.start(argv)
  config = _PAIR.pair_config()
  if _PROMPTS.source():
    config.sampling.prompt_source = _PROMPTS.source()
  report = sample_job.run(config, _PAIR.workdir.value)
  print(sample_job.format_report(report), flush=True)
  if _OUTPUT.value and jax.process_index() == 0:
    files.write_json(_OUTPUT.value, sample_job.report_json(report), indent=1)
  if _OUTPUT_JSONL.value and jax.process_index() == 0:
    rows = "".join(json.dumps(row) + "\n" for row in sample_job.rows_jsonl(report))
    files.write_atomically(_OUTPUT_JSONL.value, rows)


if __name__ == "__main__":
  cli.run(main)
