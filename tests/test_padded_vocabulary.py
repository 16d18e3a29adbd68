"""A draft whose embedding is padded differently from the target's over the same real tokens
(Qwen2.5-0.5B's 151,936 rows against Qwen2.5-72B's 152,064): model_protocol.PaddedVocabulary,
exact by enumeration; anything else refused."""

import dataclasses
import itertools

import numpy as np
import pytest
from conftest import EXACT_VOCAB, assert_follows, sampled_counts, tiny_config

from specsamp.experiments.proofs import aot
from specsamp.models import transformer
from specsamp.sampling import model_protocol, warping


@pytest.mark.slow
def test_a_padded_draft_samples_the_targets_distribution_exactly():
  """Target over 8 ids (the last 2 'padding' rows, which still get probability), draft over
  6: q is 0 on ids 6 and 7, and the samples still follow the target, ids 6 and 7 included."""
  config = tiny_config(vocab_size=EXACT_VOCAB, d_model=32, num_heads=4, num_kv_heads=2)
  target = transformer.create(config, seed=10)
  draft = transformer.create(config.replace(vocab_size=6), seed=10)
  with pytest.raises(ValueError, match="PaddedVocabulary"):
    model_protocol.check_same_vocabulary(target, draft)
  padded = model_protocol.PaddedVocabulary(draft, EXACT_VOCAB, real_vocab_size=6)
  prompt = [1, 5, 2]
  counts, stats = sampled_counts(target, padded, prompt, num_draft_tokens=3, temperature=1.0)
  # The target's padding ids are sampled (and fed to the draft).
  padding = np.asarray(list(itertools.product(range(EXACT_VOCAB), repeat=3))).max(-1) >= 6
  assert counts[padding].sum() > 0
  assert 0.05 < stats["acceptance_rate"] < 0.98
  assert_follows(counts, target, prompt, warping.SamplingConfig(1.0))


def test_anything_but_padding_is_refused():
  config = tiny_config(vocab_size=8)
  draft = transformer.create(config.replace(vocab_size=6), seed=0)
  with pytest.raises(ValueError, match="real_vocab_size <= draft"):
    model_protocol.PaddedVocabulary(draft, 8, real_vocab_size=7)  # Real tokens the draft lacks.
  with pytest.raises(ValueError, match="real_vocab_size <= draft"):
    model_protocol.PaddedVocabulary(draft, 6, real_vocab_size=6)  # Nothing to pad.


@pytest.mark.parametrize(
  "name, expected",
  [
    ("qwen2.5-72b", dict(num_layers=80, d_model=8192, vocab_size=152064, qkv_bias=True)),
    ("qwen2.5-0.5b", dict(num_layers=24, vocab_size=151936, tie_embeddings=True)),
    ("qwen3-30b-a3b", dict(num_experts=128, experts_per_token=8, ffn_dim=768, qk_norm=True)),
    ("gemma-2-27b", dict(num_layers=46, query_pre_attn_scalar=144.0, sliding_window=4096)),
    ("llama-3.1-70b", dict(rope_scaling="llama3", rope_scaling_factor=8.0, num_kv_heads=8)),
  ],
)
def test_the_shipped_published_configs_read_as_their_models(name, expected):
  config = tiny_config()  # Its dtypes and tensor-parallel mode carry over.
  ours = aot.model_config(dataclasses.asdict(config), f"configs/hf/{name}/config.json")
  assert {key: getattr(ours, key) for key in expected} == expected
