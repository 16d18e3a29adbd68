"""The job behind ``scripts/sample.py``: build the model on its mesh, sample, time it."""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import jax
import ml_collections
import numpy as np

from specsamp import sharding
from specsamp.byte_tokenizer import ByteTokenizer
from specsamp.models import transformer
from specsamp.models.config import TransformerConfig
from specsamp.sampling import autoregressive


@dataclasses.dataclass
class SampleReport:
  """What one sampling run produced and how fast."""

  prompts: list[str]
  texts: list[str]
  tokens: list[list[int]]
  compile_s: float
  run_s: float
  steps: int

  @property
  def ms_per_token(self) -> float:
    """Wall time per sequential decode step (per token of each row)."""
    return 1e3 * self.run_s / max(self.steps, 1)

  @property
  def tokens_per_s(self) -> float:
    return sum(len(t) for t in self.tokens) / max(self.run_s, 1e-9)


def encode_batch(tokenizer, prompts: Sequence[str], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  """Right-padded [B, L] token ids and [B] lengths."""
  encoded = [tokenizer.encode(p) for p in prompts]
  lengths = np.array([len(e) for e in encoded], np.int32)
  batch = np.full((len(encoded), lengths.max()), pad_id, np.int32)
  for row, ids in enumerate(encoded):
    batch[row, :len(ids)] = ids
  return batch, lengths


def run(config: ml_collections.ConfigDict, prompts: Sequence[str]) -> SampleReport:
  """Autoregressive sampling of ``prompts`` with the config's model, mesh and sampling."""
  if not prompts:
    raise ValueError("Give at least one prompt.")
  tokenizer = ByteTokenizer()
  model_config = TransformerConfig.from_config(config.model)
  if model_config.vocab_size < tokenizer.vocab_size:
    raise ValueError(f"The model's vocab_size {model_config.vocab_size} is smaller than the "
                     f"tokenizer's {tokenizer.vocab_size}.")
  mesh = sharding.make_mesh(dict(config.mesh))
  model = transformer.create(model_config, mesh, seed=config.seed)
  tokens, lengths = encode_batch(tokenizer, prompts, tokenizer.pad_id)
  s = config.sampling

  def sample():
    with sharding.use_mesh(mesh):
      out = autoregressive.generate(
          model, tokens, lengths, jax.random.key(config.seed), max_new_tokens=s.max_new_tokens,
          temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
          eos_id=tokenizer.eos_id if s.use_eos else None, pad_id=tokenizer.pad_id)
      return jax.block_until_ready(out)

  start = time.perf_counter()
  sample()  # Compiles; the timed run below reuses the executable.
  compile_s = time.perf_counter() - start
  start = time.perf_counter()
  out = sample()
  run_s = time.perf_counter() - start
  generated = [out.generated(row).tolist() for row in range(len(prompts))]
  return SampleReport(prompts=list(prompts), texts=[tokenizer.decode(g) for g in generated],
                      tokens=generated, compile_s=compile_s - run_s, run_s=run_s,
                      steps=int(out.model_calls))
