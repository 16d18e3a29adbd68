r"""Exports a specsamp checkpoint (trained or imported) to a Hugging Face model directory.

  python scripts/export_hf.py --checkpoint=workdir/code_pair/target --output=hf/code_target
  python scripts/export_hf.py --checkpoint=workdir/code_pair/draft_token --output=hf/code_draft

Writes config.json, generation_config.json, model.safetensors (sharded with an
index past --max_shard_gb) and the tokenizer (tokenizer.model, or tokenizer.json with
tokenizer_config.json), which transformers loads with AutoModelForCausalLM.from_pretrained.
The tokenizer is --tokenizer, else the one in the checkpoint directory or its parent (a
pair's workdir).
specsamp's own Chinchilla-style models (plain GELU MLP) export as 'arcee'.
"""

import os

from absl import app, flags

from specsamp.experiments import cli
from specsamp.hf import convert
from specsamp.training import tokenizer as tokenizer_lib
from specsamp.training.checkpoint import load_model

_CHECKPOINT = flags.DEFINE_string(
  "checkpoint", None, "specsamp checkpoint directory.", required=True
)
_OUTPUT = flags.DEFINE_string("output", None, "New HF model directory.", required=True)
_TOKENIZER = flags.DEFINE_string(
  "tokenizer", None, "Tokenizer to include: tokenizer.model or tokenizer.json."
)
_DTYPE = flags.DEFINE_enum(
  "dtype",
  None,
  ["float32", "bfloat16", "float16"],
  "Stored dtype; default the model's param_dtype.",
)
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step; default the latest.")
_MAX_SHARD_GB = flags.DEFINE_float("max_shard_gb", 5.0, "Largest safetensors shard.")


def _find_tokenizer(checkpoint: str) -> str | None:
  if _TOKENIZER.value:
    return os.path.expanduser(_TOKENIZER.value)
  for directory in (checkpoint, os.path.dirname(os.path.abspath(checkpoint))):
    path = tokenizer_lib.find(directory)
    if path is not None:
      return path
  return None


flags.adopt_module_key_flags(cli)  # --help lists the shared flags too.


def main(argv):
  cli.start(argv)
  checkpoint = os.path.expanduser(_CHECKPOINT.value)
  model, meta = load_model(checkpoint, step=_STEP.value)
  tokenizer_path = _find_tokenizer(checkpoint)
  tokenizer = tokenizer_lib.load(tokenizer_path) if tokenizer_path else None
  if tokenizer is not None and meta.get("tokenizer") not in (None, tokenizer.fingerprint):
    raise app.UsageError(
      f"{tokenizer_path} (fingerprint {tokenizer.fingerprint}) is not the "
      f"tokenizer the checkpoint was made with ({meta['tokenizer']})."
    )
  files = convert.export_model(
    model,
    os.path.expanduser(_OUTPUT.value),
    tokenizer=tokenizer,
    dtype=_DTYPE.value,
    max_shard_bytes=int(_MAX_SHARD_GB.value * 2**30),
  )
  print(
    f"exported step {meta['step']} to {_OUTPUT.value}: {', '.join(files)}"
    f"{' + ' + os.path.basename(tokenizer_path) if tokenizer else ''}",
    flush=True,
  )


if __name__ == "__main__":
  cli.run(main)
