"""The correctness gate a device run passes before it times anything.

On a new backend (a GPU, a new jax) the loop's exactness is checked first, on the device:

  greedy   greedy speculative sampling emits exactly greedy autoregressive sampling's tokens,
           for a chain (the draft model), a tree (``tree:2,2,1``) and the feature head (random
           weights, reading the target's layers 0 and 1), from a small random float32 target
           and a noisy copy of it as the draft, at batch 1 and on ragged rows;
  g_test   one case of the exactness certificate (``certify.py``: the loop's samples against
           the exactly enumerated target, a G-test) at ``num_samples`` draws.

Matmuls run at 'highest' precision here: a GPU's default float32 matmul (TF32) rounds the
scoring call's logits and a single step's differently, and greedy equality is a statement
about the model's exact argmax, not about rounding.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from specsamp.experiments.proofs import certify
from specsamp.models import transformer
from specsamp.models.config import TransformerConfig
from specsamp.sampling import autoregressive, drafters, speculative
from specsamp.testing import exactness

GATE_CASE = certify.Case(
  model="transformer",
  verifier="token",
  drafter="model",
  schedule="fixed",
  warping="T=0.7,k=4,p=0.9",
  batch="1",
  mesh="1",
)
"""The certificate case the gate runs: the Transformer pair, token verification, all three
warpings at once."""


def gate_model_config() -> TransformerConfig:
  """A small random target: the certificate's 2-layer grouped-query Transformer with a
  256-token vocabulary (greedy ties are rarer, and rows run longer without repeating)."""
  return certify.model_config().replace(vocab_size=256, d_model=64, ffn_dim=128)


def _ragged_prompts(vocab: int) -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng(0)
  lengths = np.asarray([3, 7, 1, 5], np.int32)
  prompts = rng.integers(0, vocab, (len(lengths), int(lengths.max()))).astype(np.int32)
  return prompts, lengths


BATCHES = ("1", "ragged")


def greedy_equality(
  max_new_tokens: int = 32,
  batches: tuple[str, ...] = BATCHES,
  results: dict[str, Any] | None = None,
  log: Callable[[str], None] = print,
) -> dict[str, Any]:
  """For each drafter, whether greedy speculative output equals greedy autoregressive output,
  on one prompt ('1') and on four ragged rows ('ragged'); with the tokens per target call (so
  an equality is seen to come from accepted drafts, not from rejecting them all). Each case
  lands in ``results`` (returned) as it finishes."""
  unknown = sorted(set(batches) - set(BATCHES))
  if unknown:
    raise ValueError(f"Unknown gate batches {unknown}; use some of {BATCHES}.")
  target = transformer.create(gate_model_config(), seed=3)
  draft = exactness.noisy_copy(target, 0.1, seed=4)
  feature = certify.feature_drafter_for(target, reduced_vocabulary=False)
  cases = {
    "chain": dict(draft=drafters.ModelDrafter(draft), num_draft_tokens=4),
    "tree:2,2,1": dict(draft=drafters.ModelDrafter(draft), num_draft_tokens=3, tree="tree:2,2,1"),
    "feature_head": dict(draft=feature, num_draft_tokens=4),
  }
  inputs = {
    "1": (np.asarray([[5, 17, 99, 3]], np.int32), np.asarray([4], np.int32)),
    "ragged": _ragged_prompts(target.vocab_size),
  }
  key = jax.random.key(0)
  results = {} if results is None else results
  for batch_name in batches:
    prompts, lengths = inputs[batch_name]
    reference = autoregressive.generate(
      target, prompts, lengths, key, max_new_tokens=max_new_tokens, temperature=0.0
    )
    expected = np.asarray(reference.tokens)
    for name, options in cases.items():
      out = speculative.speculative_generate(
        target,
        prompts=prompts,
        prompt_lengths=lengths,
        rng=key,
        max_new_tokens=max_new_tokens,
        temperature=0.0,
        **options,
      )
      got = np.asarray(out.tokens)
      stats = out.summary()
      row = results[f"{name}, batch {batch_name}"] = {
        "equal": bool(np.array_equal(got, expected)),
        "mismatched_tokens": int((got != expected).sum()),
        "tokens_per_target_call": stats["tokens_per_target_call"],
      }
      log(
        f"greedy {name}, batch {batch_name}: {'equal' if row['equal'] else 'DIFFERENT'} "
        f"({row['tokens_per_target_call']:.2f} tokens/call)"
      )
  return results


def run(
  num_samples: int = 100_000,
  level: float = 1e-4,
  max_new_tokens: int = 32,
  batches: tuple[str, ...] = BATCHES,
  partial: dict[str, Any] | None = None,
  log: Callable[[str], None] = print,
) -> dict[str, Any]:
  """The gate: greedy equality, then the G-test case. ``passed`` is both. ``partial`` gets
  the greedy cases as they finish (what a gate cut short had checked)."""
  start = time.perf_counter()
  partial = {} if partial is None else partial
  with jax.default_matmul_precision("highest"):
    greedy = greedy_equality(max_new_tokens, batches, partial.setdefault("greedy", {}), log)
    (result,) = certify.certify([GATE_CASE], num_samples, level, log=log)
  g_test = {
    "case": GATE_CASE.name,
    "n": result.n,
    "G": result.G,
    "threshold": result.threshold,
    "cells": result.cells,
    "level": level,
    "passed": result.passed,
  }
  passed = all(row["equal"] for row in greedy.values()) and result.passed
  return {
    "passed": passed,
    "greedy": greedy,
    "g_test": g_test,
    "seconds": time.perf_counter() - start,
  }
