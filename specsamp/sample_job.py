"""The job behind ``scripts/sample.py``: build target (and draft) on the mesh, sample, time.

Autoregressive sampling from the target, and, when a draft config is given,
speculative sampling of the same prompts with the same key, side by side:
text, tokens, ms/token and the speculative statistics.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import jax
import ml_collections
import numpy as np

from specsamp import sharding
from specsamp.byte_tokenizer import ByteTokenizer
from specsamp.models import transformer
from specsamp.models.config import TransformerConfig
from specsamp.sampling import autoregressive, speculative


@dataclasses.dataclass
class Run:
  """One timed sampling run."""

  name: str
  texts: list[str]
  tokens: list[list[int]]
  compile_s: float
  run_s: float
  stats: dict[str, Any] | None = None

  @property
  def ms_per_token(self) -> float:
    """Wall time per generated token of the longest row (sequential tokens)."""
    return 1e3 * self.run_s / max(max(len(t) for t in self.tokens), 1)

  @property
  def tokens_per_s(self) -> float:
    return sum(len(t) for t in self.tokens) / max(self.run_s, 1e-9)


@dataclasses.dataclass
class SampleReport:
  prompts: list[str]
  autoregressive: Run
  speculative: Run | None = None

  @property
  def speedup(self) -> float | None:
    if self.speculative is None:
      return None
    return self.autoregressive.ms_per_token / self.speculative.ms_per_token


def encode_batch(tokenizer, prompts: Sequence[str], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  """Right-padded [B, L] token ids and [B] lengths."""
  encoded = [tokenizer.encode(p) for p in prompts]
  lengths = np.array([len(e) for e in encoded], np.int32)
  batch = np.full((len(encoded), lengths.max()), pad_id, np.int32)
  for row, ids in enumerate(encoded):
    batch[row, :len(ids)] = ids
  return batch, lengths


def _timed(name: str, sample: Callable[[], Any], tokenizer, num_rows: int) -> Run:
  start = time.perf_counter()
  jax.block_until_ready(sample())  # Compiles; the timed run reuses the executable.
  first_s = time.perf_counter() - start
  start = time.perf_counter()
  out = jax.block_until_ready(sample())
  run_s = time.perf_counter() - start
  generated = [out.generated(row).tolist() for row in range(num_rows)]
  return Run(name=name, texts=[tokenizer.decode(g) for g in generated], tokens=generated,
             compile_s=max(first_s - run_s, 0.0), run_s=run_s,
             stats=out.summary() if hasattr(out, "summary") else None)


def _model(config: ml_collections.ConfigDict, mesh, tokenizer):
  model_config = TransformerConfig.from_config(config.model)
  if model_config.vocab_size < tokenizer.vocab_size:
    raise ValueError(f"The model's vocab_size {model_config.vocab_size} is smaller than the "
                     f"tokenizer's {tokenizer.vocab_size}.")
  return transformer.create(model_config, mesh, seed=config.seed)


def run(config: ml_collections.ConfigDict, prompts: Sequence[str],
        draft_config: ml_collections.ConfigDict | None = None) -> SampleReport:
  """Samples ``prompts`` autoregressively and, with a draft config, speculatively."""
  if not prompts:
    raise ValueError("Give at least one prompt.")
  tokenizer = ByteTokenizer()
  mesh = sharding.make_mesh(dict(config.mesh))
  target = _model(config, mesh, tokenizer)
  tokens, lengths = encode_batch(tokenizer, prompts, tokenizer.pad_id)
  s = config.sampling
  common = dict(max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_k=s.top_k,
                top_p=s.top_p, eos_id=tokenizer.eos_id if s.use_eos else None,
                pad_id=tokenizer.pad_id)
  key = jax.random.key(config.seed)

  def sample_autoregressive():
    with sharding.use_mesh(mesh):
      return autoregressive.generate(target, tokens, lengths, key, **common)

  report = SampleReport(list(prompts),
                        _timed("autoregressive", sample_autoregressive, tokenizer, len(prompts)))
  if draft_config is not None:
    draft = _model(draft_config, mesh, tokenizer)

    def sample_speculative():
      with sharding.use_mesh(mesh):
        return speculative.speculative_generate(
            target, draft, tokens, lengths, key,
            num_draft_tokens=config.speculative.num_draft_tokens,
            verifier=config.speculative.verifier, **common)

    report.speculative = _timed("speculative", sample_speculative, tokenizer, len(prompts))
  return report


def format_report(report: SampleReport) -> str:
  """Human-readable side-by-side report."""
  runs = [r for r in (report.autoregressive, report.speculative) if r is not None]
  lines = []
  for row, prompt in enumerate(report.prompts):
    lines.append(f"prompt: {prompt!r}")
    for r in runs:
      lines.append(f"  {r.name:>14} text:   {r.texts[row]!r}")
      lines.append(f"  {r.name:>14} tokens: {r.tokens[row]}")
    lines.append("")
  for r in runs:
    lines.append(f"{r.name:>14}: {r.ms_per_token:7.2f} ms/token, {r.tokens_per_s:9.1f} tokens/s "
                 f"({r.run_s * 1e3:.1f} ms; compile {r.compile_s:.1f} s)")
  if report.speculative is not None:
    stats = report.speculative.stats
    per_position = " ".join(f"{a:.2f}" for a in stats["acceptance_at_position"])
    lines += [
        f"       speedup: {report.speedup:.2f}x (autoregressive ms/token / speculative ms/token)",
        f"    acceptance: {stats['acceptance_rate']:.3f} of draft tokens; P(token t accepted), "
        f"t=1..{stats['num_draft_tokens']}: {per_position}",
        f"tokens/target call: {stats['tokens_per_target_call']:.2f}; target calls "
        f"{stats['target_calls']}, draft calls {stats['draft_calls']}; accepted-count histogram "
        f"{stats['accepted_histogram']}",
    ]
  return "\n".join(lines)
