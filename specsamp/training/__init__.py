"""Training: tokenizer, data, optax training and distillation, orbax checkpoints.

tokenizer.py   SentencePiece: train, load, encode/decode, fingerprint
data.py        corpus files, split by file, packed step-addressed batches, held-out prompts
train.py       TrainConfig, the jitted sharded train step, distillation losses, fit (resume)
checkpoint.py  orbax checkpoints, and ``load_model``: the one way to load a model (trained
               or imported) onto any mesh
"""

from specsamp.training.checkpoint import load_model

__all__ = ["load_model"]
