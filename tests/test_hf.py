"""Parity with Hugging Face transformers: logits, greedy generation, assisted generation,
and the import / export / checkpoint paths with their errors."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import torch
from flax import nnx

import hf_models
from specsamp import checkpoint, hf, sharding, train
from specsamp.hf import architectures, convert, safetensors_io, weights
from specsamp.models import transformer
from specsamp.sampling import autoregressive, speculative

KINDS = list(hf_models.ARCHITECTURES)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """kind -> (torch target, its HF directory, torch draft, the draft's directory)."""
  cache = {}

  def get(kind):
    if kind not in cache:
      target = hf_models.build(kind)
      draft = hf_models.perturbed(target, 0.1, seed=1)
      root = tmp_path_factory.mktemp(kind)
      target.save_pretrained(root / "target")
      draft.save_pretrained(root / "draft")
      cache[kind] = (target, str(root / "target"), draft, str(root / "draft"))
    return cache[kind]

  return get


@pytest.fixture(scope="module")
def imported(saved):
  cache = {}

  def get(kind, which="target"):
    if (kind, which) not in cache:
      _, target_dir, _, draft_dir = saved(kind)
      cache[kind, which] = hf.import_model(target_dir if which == "target" else draft_dir)[0]
    return cache[kind, which]

  return get


def relative_error(ours, reference) -> float:
  """max |ours - ref| / max |ref|: the error relative to the logits' scale."""
  return float(np.abs(np.asarray(ours) - reference).max() / np.abs(reference).max())


def torch_logits(model, tokens: np.ndarray) -> np.ndarray:
  with torch.no_grad():
    return model(torch.as_tensor(tokens)).logits.numpy()


TOKENS = np.random.default_rng(0).integers(3, hf_models.VOCAB, size=(2, 13))


@pytest.mark.parametrize("kind", KINDS)
def test_logits_match_transformers(kind, saved, imported):
  torch_model = saved(kind)[0]
  reference = torch_logits(torch_model, TOKENS)
  model = imported(kind)
  logits, _ = model(jnp.asarray(TOKENS))
  assert relative_error(logits, reference) < 1e-4
  # The cached path: a 6-token prefill, then one token per call.
  cache = model.init_cache(2, 16)
  pieces = [model(jnp.asarray(TOKENS[:, :6]), cache=cache)]
  for t in range(6, TOKENS.shape[1]):
    pieces.append(model(jnp.asarray(TOKENS[:, t:t + 1]), cache=pieces[-1][1]))
  stepped = np.concatenate([np.asarray(p[0]) for p in pieces], axis=1)
  assert relative_error(stepped, reference) < 1e-4


def with_config(model, **changes):
  """``model``'s parameters in a model whose config differs by ``changes`` (parameters the
  new config has no place for are dropped)."""
  config = model.config.replace(**changes)
  abstract = nnx.eval_shape(lambda: transformer.Transformer(config, rngs=nnx.Rngs(0)))
  graphdef, abstract_params = nnx.split(abstract, nnx.Param)

  def prune(source, like):
    return {k: prune(source[k], v) if isinstance(v, dict) else source[k] for k, v in like.items()}

  return nnx.merge(graphdef, prune(train.params_of(model), nnx.to_pure_dict(abstract_params)))


@pytest.mark.parametrize("kind, field, value", [
    ("mistral", "sliding_window", None), ("gemma2", "sliding_window", None),
    ("llama", "rope_scaling", "none"), ("gemma2", "query_pre_attn_scalar", None),
    ("gemma2", "post_norms", False), ("gemma2", "final_logit_softcap", None),
    ("arcee", "gelu_approximate", False)])
def test_parity_detects_each_feature(kind, field, value, saved, imported):
  """Negative controls: with one feature switched off parity breaks, so the test above
  would catch a wrong implementation of it."""
  reference = torch_logits(saved(kind)[0], TOKENS)
  logits, _ = with_config(imported(kind), **{field: value})(jnp.asarray(TOKENS))
  assert relative_error(logits, reference) > 2e-4  # Twice the parity tolerance.


PROMPTS = np.random.default_rng(1).integers(3, hf_models.VOCAB, size=(2, 7))


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_matches_transformers_generate(kind, saved, imported):
  torch_model = saved(kind)[0]
  reference = hf_models.generate(torch_model, torch.as_tensor(PROMPTS), 16, do_sample=False)
  out = autoregressive.generate(imported(kind), PROMPTS, np.full(2, PROMPTS.shape[1]),
                                jax.random.key(0), max_new_tokens=16, temperature=0.0)
  np.testing.assert_array_equal(np.asarray(out.tokens)[:, PROMPTS.shape[1]:], reference)


@pytest.mark.parametrize("kind", KINDS)
def test_speculative_greedy_matches_assisted_generation(kind, saved, imported):
  """Ours with a draft vs transformers' generate(assistant_model=draft), batch 1 (HF's limit)."""
  target, _, draft, _ = saved(kind)
  histogram = np.zeros(4, int)
  for row in range(2):
    prompt = PROMPTS[row:row + 1]
    reference = hf_models.generate(target, torch.as_tensor(prompt), 16, do_sample=False,
                                   assistant_model=draft)
    out = speculative.speculative_generate(
        imported(kind), imported(kind, "draft"), prompt, np.array([prompt.shape[1]]),
        jax.random.key(row), max_new_tokens=16, num_draft_tokens=3, temperature=0.0)
    np.testing.assert_array_equal(np.asarray(out.tokens)[:, prompt.shape[1]:], reference)
    histogram += np.asarray(out.accepted_histogram).sum(axis=0)
  # The draft is a noisy copy: some proposals are accepted and some rejected, so both
  # branches of verification ran.
  assert histogram[1:].sum() > 0 and histogram[:-1].sum() > 0, histogram
