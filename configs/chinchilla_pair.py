"""The paper's pair: Chinchilla 70B as the target, the 4B draft (Chen et al. 2023, section 4).

A pair config (configs/code_pair.py's sections) with configs/chinchilla_70b.py's model as
``target.model`` and configs/chinchilla_4b.py's as ``draft.model``, both bfloat16 and tensor
parallel over every device in shard_map mode, sampling as the paper's HumanEval setting
(T = 0.8, top-p 0.95, K = 4, 128 new tokens). Its ``aot`` section drives
scripts/aot_compile.py, which compiles the pair's loops for a TPU slice on any machine:

  python scripts/aot_compile.py --config=configs/chinchilla_pair.py --topology=v4-32

Training or sampling it needs a pod and real weights (``target.checkpoint`` /
``draft.checkpoint`` from scripts/import_hf.py).

Arguments:
  (none)  the paper's pair.
  test    a tiny pair of the same shape (for the test suite's AOT compile).
"""

import ml_collections

from specsamp.experiments import config_files

code_pair = config_files.sibling(__file__, "code_pair")
chinchilla_70b = config_files.sibling(__file__, "chinchilla_70b")
chinchilla_4b = config_files.sibling(__file__, "chinchilla_4b")

VARIANTS = ("paper", "test")


def get_config(arg=None):
  variant = arg or "paper"
  if variant not in VARIANTS:
    raise ValueError(f"configs/chinchilla_pair.py: unknown variant {arg!r}; use one of {VARIANTS}.")
  config = code_pair.get_config()
  config.name = f"chinchilla_pair_{variant}"
  config.tokenizer.vocab_size = 32_000
  config.target.model = chinchilla_70b.get_config().model
  config.draft.model = chinchilla_4b.get_config().model
  config.mesh.data = 1  # Batch 1 decoding: the paper's latency setting.
  config.mesh.tensor = -1  # Every chip tensor parallel (the paper: 16 TPU v4).
  config.sampling.max_new_tokens = 128  # The paper's generation length.
  config.sampling.temperature = 0.8  # HumanEval's nucleus setting.
  config.sampling.top_p = 0.95
  config.speculative.num_draft_tokens = 4  # K = 4, as the paper.

  config.aot = ml_collections.ConfigDict()
  config.aot.topology = "v4-32"  # A Cloud TPU slice (aot.SLICES): v4-32 is 16 v4 chips.
  config.aot.cache_length = 2048  # KV cache slots per row.
  config.aot.batch_sizes = "1,16"  # Rows per call to compile the speculative loop for.
  config.aot.verifiers = "token,block"  # The speculative loop is compiled with each.
  config.aot.fit_batch = True  # Also find the largest batch whose program fits HBM.
  # A published pair's shapes in place of the models above: HF config.json files (configs/hf).
  config.aot.target_hf_config = ""  # e.g. configs/hf/llama-3.1-70b/config.json
  config.aot.draft_hf_config = ""  # e.g. configs/hf/llama-3.2-1b/config.json
  # The tokenizer's size when the two embeddings are padded differently over the same real
  # tokens (Qwen2.5: 151,665 in 151,936 and 152,064 rows): the draft's logits are padded.
  config.aot.real_vocab_size = 0

  if variant == "test":
    config.tokenizer.vocab_size = 512
    for model, layers, width in ((config.target.model, 4, 256), (config.draft.model, 1, 256)):
      model.vocab_size = 512
      model.num_layers = layers
      model.d_model = width
      model.num_heads = model.num_kv_heads = 4
      model.head_dim = 64
      model.ffn_dim = 4 * width
    config.sampling.max_new_tokens = 16
    config.aot.topology = "v4-8"
    config.aot.cache_length = 64
    config.aot.batch_sizes = "1"
    config.aot.verifiers = "token"
    config.aot.fit_batch = False
  return config
