r"""Samples from a config's model: autoregressive, and speculative with a draft config.

  python scripts/sample.py --config=configs/tiny.py --draft_config=configs/tiny.py:draft
  python scripts/sample.py --config=configs/tiny.py:llama --draft_config=configs/tiny.py:llama,draft \
      --config.sampling.temperature=0.8 --config.sampling.top_p=0.95 \
      --config.speculative.num_draft_tokens=3 --config.speculative.verifier=block \
      --prompt="def main():" --prompt="import os"

Prints each prompt's text and tokens from both samplers, ms/token, the speedup
and the speculative statistics. Until a trained checkpoint and the
sentencepiece tokenizer exist, weights are random (seeded) and text goes
through the byte-level fallback tokenizer.
"""

from absl import app, flags
from ml_collections import config_flags

from specsamp import sample_job

_CONFIG = config_flags.DEFINE_config_file("config", "configs/tiny.py", "Target model config.")
_DRAFT = config_flags.DEFINE_config_file(
    "draft_config", None, "Draft model config; without it only autoregressive sampling runs.")
_PROMPT = flags.DEFINE_multi_string("prompt", ["def fibonacci(n):"], "Prompt(s); one row each.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  report = sample_job.run(_CONFIG.value, _PROMPT.value, _DRAFT.value)
  print(sample_job.format_report(report))


if __name__ == "__main__":
  app.run(main)
