r"""Compiles an EAGLE-3-style head's training step and the regeneration loop for a TPU slice,
on any machine (libtpu, no TPU): memory per chip and predicted tokens/s
(specsamp/experiments/proofs/aot_training.py).

  python scripts/aot_train_head.py --hf_config=configs/hf/llama-3.1-8b/config.json --topology=v5e-8
  python scripts/aot_train_head.py --hf_config=configs/hf/llama-3.1-8b/config.json --topology=v4-8 \
      --train_mesh=fsdp=4 --regen_mesh=tensor=4 --batch_size=16

--hf_config is any model's config.json (your own: the file beside its weights). The training
mesh shards the target FSDP-style (each chip gathers a layer at a time), the regeneration mesh
tensor-parallel (decoding gathers no weights).
"""

import sys

from specsamp import files
from specsamp.experiments.proofs import aot

aot.quiet_libtpu()  # Before jax initialises libtpu.

from absl import flags  # noqa: E402

from specsamp.experiments import cli  # noqa: E402
from specsamp.experiments.proofs import aot_training  # noqa: E402

_HF = flags.DEFINE_string("hf_config", None, "The target's HF config.json.", required=True)
_TOPOLOGY = flags.DEFINE_enum("topology", "v5e-8", sorted(aot.SLICES), "The TPU slice.")
_TRAIN_MESH = flags.DEFINE_string("train_mesh", "fsdp=-1", "Training mesh, e.g. 'data=2,fsdp=4'.")
_REGEN_MESH = flags.DEFINE_string("regen_mesh", "tensor=-1", "Regeneration mesh.")
_BATCH = flags.DEFINE_integer("batch_size", 8, "Training sequences per step.")
_SEQ = flags.DEFINE_integer("seq_len", 2048, "Training sequence length.")
_TTT = flags.DEFINE_integer("ttt_steps", 7, "Unrolled head steps (EAGLE-3: 7).")
_VOCAB = flags.DEFINE_integer("draft_vocab_size", 32_000, "The head's draft vocabulary.")
_REGEN_BATCH = flags.DEFINE_integer("regen_batch", 64, "Prompts answered together.")
_PROMPT = flags.DEFINE_integer("regen_prompt_tokens", 512, "Prompt tokens per row.")
_NEW = flags.DEFINE_integer("regen_new_tokens", 512, "Answer tokens per row.")
_OUTPUT = flags.DEFINE_string("output", None, "Also write the report as JSON here.")
cli.output_file(_OUTPUT)
_PROGRAMS = flags.DEFINE_list("programs", ["training", "regeneration"], "Programs to compile.")
flags.adopt_module_key_flags(cli)


def _mesh(text: str) -> dict[str, int]:
  axes = {}
  for part in text.split(","):
    name, _, size = part.partition("=")
    if not size.strip().lstrip("-").isdigit():  # int('four') named no flag.
      raise ValueError(f"Mesh {text!r}: expected 'axis=size,...' with int sizes (or -1).")
    axes[name.strip()] = int(size)
  return axes


def main(argv):
  cli.start(argv)
  plan = aot_training.Plan(
    topology=_TOPOLOGY.value,
    train_mesh=_mesh(_TRAIN_MESH.value),
    regen_mesh=_mesh(_REGEN_MESH.value),
    batch_size=_BATCH.value,
    seq_len=_SEQ.value,
    ttt_steps=_TTT.value,
    draft_vocab_size=_VOCAB.value,
    regen_batch=_REGEN_BATCH.value,
    regen_prompt_tokens=_PROMPT.value,
    regen_new_tokens=_NEW.value,
    programs=tuple(_PROGRAMS.value),
  )
  report = aot_training.run(_HF.value, plan, log=lambda line: print(line, flush=True))
  if _OUTPUT.value:
    # The command that made it, so that a stored result can be made again exactly.
    files.write_json(_OUTPUT.value, dict(report, argv=["python", *sys.argv]), indent=1)


if __name__ == "__main__":
  cli.run(main)
