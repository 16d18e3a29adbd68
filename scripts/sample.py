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

from specsamp.experiments import cli, sample_job

_PAIR = cli.define_pair_flags()
_PROMPT = flags.DEFINE_string("prompt", None, "Sample this prompt (sets prompt_source=text:...).")
_PROMPTS_FILE = flags.DEFINE_string(
  "prompts_file",
  None,
  "Sample the prompts of this file: JSONL with 'prompt' fields, or one per line.",
)
_HUMANEVAL = flags.DEFINE_bool("humaneval", False, "Sample HumanEval's 164 prompts (the paper's).")
_OUTPUT_JSONL = flags.DEFINE_string(
  "output_jsonl", None, "Write each prompt's continuations and statistics here, one JSON per line."
)
_OUTPUT = flags.DEFINE_string(
  "output",
  None,
  "Also write the report (prompts, generated ids, "
  "texts, statistics, timings) as JSON to this file (process 0).",
)


def main(argv):
  cli.start(argv)
  config = _PAIR.pair_config()
  sources = [
    (_PROMPT.value is not None, f"text:{_PROMPT.value}"),
    (_PROMPTS_FILE.value is not None, f"file:{_PROMPTS_FILE.value}"),
    (_HUMANEVAL.value, "humaneval"),
  ]
  chosen = [source for given, source in sources if given]
  if len(chosen) > 1:
    raise ValueError("--prompt, --prompts_file and --humaneval: give at most one.")
  if chosen:
    config.sampling.prompt_source = chosen[0]
  report = sample_job.run(config, _PAIR.workdir.value)
  print(sample_job.format_report(report), flush=True)
  if _OUTPUT.value and jax.process_index() == 0:
    with open(_OUTPUT.value, "w", encoding="utf-8") as f:
      json.dump(sample_job.report_json(report), f, indent=1)
  if _OUTPUT_JSONL.value and jax.process_index() == 0:
    with open(_OUTPUT_JSONL.value, "w", encoding="utf-8") as f:
      f.writelines(json.dumps(row) + "\n" for row in sample_job.rows_jsonl(report))


if __name__ == "__main__":
  cli.run(main)
