"""Hugging Face checkpoints: import Llama / Mistral / Qwen2 / Arcee / Gemma / Gemma 2
safetensors into specsamp (placed shard by shard on a mesh), and export back.

  safetensors_io  reads and writes the safetensors format (lazily, by memory map)
  architectures   HF config.json <-> TransformerConfig, with clear refusals
  weights         the tensor-by-tensor name and layout mapping
  convert         import_model / export_model / orbax checkpoints / tokenizer

An imported checkpoint loads like any other: ``specsamp.training.checkpoint.load_model``.
"""

from specsamp.hf.architectures import SUPPORTED_MODEL_TYPES, UnsupportedArchitecture
from specsamp.hf.convert import export_model, import_model, import_to_checkpoint, load_tokenizer

__all__ = [
  "SUPPORTED_MODEL_TYPES",
  "UnsupportedArchitecture",
  "export_model",
  "import_model",
  "import_to_checkpoint",
  "load_tokenizer",
]
