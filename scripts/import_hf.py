r"""Imports a Hugging Face model directory into an orbax checkpoint specsamp samples from.

  python scripts/import_hf.py --hf_dir=~/models/Llama-3.2-1B --output=ckpt/llama3_1b
  python scripts/import_hf.py --hf_dir=~/models/gemma-2-27b --output=ckpt/gemma2_27b \
      --param_dtype=bfloat16 --mesh_tensor=8

Reads config.json and model.safetensors (or the shards of
model.safetensors.index.json) tensor by tensor, placing each device's shard
directly on the mesh (--mesh_data x --mesh_fsdp x --mesh_expert x --mesh_tensor); the model
is never whole in host RAM. Writes step 0 of an orbax checkpoint whose
metadata holds the model config, the tokenizer fingerprint and the source;
tokenizer.model is copied beside it when the HF directory has one.
Supported: llama (Llama 2/3/3.1+, SmolLM), mistral, qwen2, arcee, gemma, gemma2.
"""

import os

from absl import flags

from specsamp import sharding
from specsamp.experiments import cli
from specsamp.hf import convert

_HF_DIR = flags.DEFINE_string("hf_dir", None, "Hugging Face model directory.", required=True)
_OUTPUT = flags.DEFINE_string("output", None, "New orbax checkpoint directory.", required=True)
_PARAM_DTYPE = flags.DEFINE_enum(
  "param_dtype", None, ["float32", "bfloat16", "float16"], "Weight dtype; default the checkpoint's."
)
_DTYPE = flags.DEFINE_enum(
  "dtype", None, ["float32", "bfloat16", "float16"], "Activation dtype; default --param_dtype."
)
_DATA = flags.DEFINE_integer("mesh_data", -1, "Data-parallel axis (-1: the devices left).")
_FSDP = flags.DEFINE_integer("mesh_fsdp", 1, "FSDP axis (parameters sharded along d_model).")
_EXPERT = flags.DEFINE_integer("mesh_expert", 1, "Expert-parallel axis (a mixture of experts).")
_TENSOR = flags.DEFINE_integer("mesh_tensor", 1, "Tensor-parallel axis.")

flags.adopt_module_key_flags(cli)  # --help lists the shared flags too.


def main(argv):
  cli.start(argv)
  mesh = sharding.make_mesh(
    {
      "data": _DATA.value,
      "fsdp": _FSDP.value,
      "expert": _EXPERT.value,
      "tensor": _TENSOR.value,
    }
  )
  config = convert.import_to_checkpoint(
    os.path.expanduser(_HF_DIR.value),
    os.path.expanduser(_OUTPUT.value),
    mesh,
    param_dtype=_PARAM_DTYPE.value,
    dtype=_DTYPE.value,
  )
  print(
    f"imported {config.num_layers} layers x {config.d_model} ({config.param_dtype}) into "
    f"{_OUTPUT.value}",
    flush=True,
  )


if __name__ == "__main__":
  cli.run(main)
