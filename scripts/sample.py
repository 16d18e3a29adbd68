r"""Samples text autoregressively from a config's model and reports ms/token.

  python scripts/sample.py --config=configs/tiny.py --prompt="def main():"
  python scripts/sample.py --config=configs/tiny.py:llama \
      --config.sampling.temperature=0.8 --config.sampling.top_p=0.95 --prompt=a --prompt=b

Until a trained checkpoint and the sentencepiece tokenizer exist, weights are
random (seeded) and text goes through the byte-level fallback tokenizer.
"""

from absl import app, flags
from ml_collections import config_flags

from specsamp import sample_job

_CONFIG = config_flags.DEFINE_config_file("config", "configs/tiny.py", "Experiment config.")
_PROMPT = flags.DEFINE_multi_string("prompt", ["def fibonacci(n):"], "Prompt(s); one row each.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  report = sample_job.run(_CONFIG.value, _PROMPT.value)
  for prompt, text, tokens in zip(report.prompts, report.texts, report.tokens):
    print(f"prompt: {prompt!r}\ntext:   {text!r}\ntokens: {tokens}\n")
  print(f"autoregressive: {report.ms_per_token:.2f} ms/token, {report.tokens_per_s:.1f} tokens/s "
        f"({report.steps} steps in {report.run_s * 1e3:.1f} ms; compile {report.compile_s:.1f} s)")


if __name__ == "__main__":
  app.run(main)
