r"""Hugging Face transformers assisted generation vs specsamp speculative sampling, same weights.

  pip install -e ".[hf]"
  python scripts/compare_hf.py --config=configs/code_pair.py
  python scripts/compare_hf.py --config=configs/code_pair.py --modes=greedy --max_new_tokens=128

Prepares (or loads) the pair of --config, exports its target and distilled
draft to the HF format, and samples the held-out prompts at batch 1 with:
HF autoregressive, HF assisted generation with K fixed, HF assisted with its
default adaptive schedule, specsamp autoregressive and specsamp speculative.
Prints tokens/s and tokens per target call of each and the ratio; writes all
numbers to --output as JSON.
"""

import os

from absl import app, flags

from specsamp import files
from specsamp.experiments import cli
from specsamp.experiments.jobs import pair as pair_lib
from specsamp.experiments.peers import compare_hf

_CONFIG = cli.define_config("config", "configs/code_pair.py", "Pair config.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoint cache; default workdir/<config name>.")
_MODES = flags.DEFINE_list("modes", ["greedy", "nucleus"], f"Any of {sorted(compare_hf.MODES)}.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", None, "Default: config.sampling.max_new_tokens.")
_K = flags.DEFINE_integer(
  "num_draft_tokens", None, "K; default config.speculative.num_draft_tokens."
)
_OUTPUT = flags.DEFINE_string("output", None, "JSON results; default <workdir>/compare_hf.json.")
cli.output_file(_OUTPUT)

flags.adopt_module_key_flags(cli)  # --help lists the shared flags too.


def main(argv):
  cli.start(argv)
  unknown = sorted(set(_MODES.value) - set(compare_hf.MODES))
  if unknown:
    raise app.UsageError(f"Unknown --modes {unknown}; choose from {sorted(compare_hf.MODES)}.")
  config = _CONFIG.value
  workdir = os.path.abspath(_WORKDIR.value or pair_lib.default_workdir(config))
  pair = pair_lib.prepare(config, workdir)
  results = compare_hf.run(
    pair,
    pair.draft,
    num_draft_tokens=_K.value or config.speculative.num_draft_tokens,
    max_new_tokens=_MAX_NEW.value or config.sampling.max_new_tokens,
    modes=_MODES.value,
    seed=config.seed,
    export_dir=os.path.join(workdir, "hf_export"),
  )
  output = _OUTPUT.value or os.path.join(workdir, "compare_hf.json")
  files.write_json(output, results, indent=2)
  print(f"wrote {output}", flush=True)


if __name__ == "__main__":
  cli.run(main)
