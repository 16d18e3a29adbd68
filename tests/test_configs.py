"""Configs: the paper's pair counts its parameters without allocating; tiny families build."""

import os

import pytest

from specsamp import sharding
from specsamp.experiments import config_files
from specsamp.models import Transformer, TransformerConfig

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def load_config(name, arg=None):
  return config_files.load_module(os.path.join(CONFIGS, f"{name}.py")).get_config(arg)


@pytest.mark.parametrize("name,expected", [("chinchilla_70b", 70e9), ("chinchilla_4b", 4e9)])
def test_paper_pair_parameter_counts(name, expected):
  config = TransformerConfig.from_config(load_config(name).model)
  count = sharding.count_parameters(lambda rngs: Transformer(config, rngs=rngs))
  assert abs(count - expected) / expected < 0.15, f"{name}: {count / 1e9:.2f}B"


def test_paper_pair_shares_a_vocabulary_and_shards_on_16_devices():
  target = TransformerConfig.from_config(load_config("chinchilla_70b").model)
  draft = TransformerConfig.from_config(load_config("chinchilla_4b").model)
  assert target.vocab_size == draft.vocab_size
  for config in (target, draft):  # 16-way tensor parallelism (the paper's 16 TPU v4 chips)
    assert config.num_heads % 16 == 0 and config.ffn_dim % 16 == 0


@pytest.mark.parametrize("family", ["chinchilla", "llama", "qwen2", "gemma"])
def test_tiny_families(family):
  config = load_config("tiny", family)
  model_config = TransformerConfig.from_config(config.model)
  assert sharding.count_parameters(lambda rngs: Transformer(model_config, rngs=rngs)) > 0
  assert set(config.mesh.keys()) == {*sharding.MESH_AXES, "rules"}
  sharding.parse_rules(config.mesh.rules)  # valid overrides (none by default)


def test_unknown_tiny_family_is_refused():
  with pytest.raises(ValueError, match="unknown family"):
    load_config("tiny", "gpt5")


def test_the_benchmark_configs_time_a_pair_variant_after_a_comma():
  """'quick,large': the sweep of the large pair (a TPU VM's workdir; the benchmark configs
  always built the CPU-sized pair, whose 1024-piece tokenizer refused that workdir)."""
  assert load_config("benchmark", "quick,large").pair.tokenizer.vocab_size == 2048
  assert load_config("benchmark", "quick").pair.tokenizer.vocab_size == 1024
  assert load_config("benchmark", "test").pair.name == load_config("code_pair", "test").name
  assert load_config("benchmark_drafters", "full,large").pair.name == "code_pair_large"
  with pytest.raises(ValueError, match="not with smollm2"):
    load_config("benchmark_drafters", "smollm2,large")
  with pytest.raises(ValueError, match="code_pair.py: unknown variant 'nope'"):
    load_config("benchmark", "quick,nope")
