"""scripts/benchmark_trees.py: its plumbing without a pair, and end to end on the micro pair.

python -m pytest tests/test_benchmark_trees.py
"""

import pytest
from test_configs import load_config

from specsamp.experiments.benchmarks import benchmark_trees
from specsamp.sampling import tree as tree_lib


def test_trees_are_split_on_semicolons():
  assert benchmark_trees.parse_trees(" chains:2x4; tree:2,2,1,1 ;") == [
    "chains:2x4",
    "tree:2,2,1,1",
  ]


@pytest.mark.parametrize(
  "field,value,message",
  [
    ("trees", "chains:2x3", "must be num_draft_tokens"),
    ("trees", "tree:2,x", "Bad tree"),
    ("modes", "greedy,beam", "Unknown modes"),
    ("chain_verifiers", "token,traversal", "Unknown chain_verifiers"),
    ("tree_verifiers", "block", "Unknown tree_verifiers"),
    ("calls", 0, "calls"),
    ("predict_hardware", "abacus", "predict_hardware"),
  ],
)
def test_bad_configs_are_refused(field, value, message):
  config = load_config("benchmark_trees")
  config[field] = value
  with pytest.raises(ValueError, match=message):
    benchmark_trees.check_config(config)


def test_the_full_config_runs_each_proposal_once_in_greedy_and_twice_when_sampling():
  config = load_config("benchmark_trees")
  benchmark_trees.check_config(config)
  trees = benchmark_trees.parse_trees(config.trees)
  assert all(tree_lib.parse(s).num_nodes <= 16 for s in trees)
  assert benchmark_trees.settings(config, "greedy") == [
    ("chain:4", "token"),
    *[(s, "token") for s in trees],
  ]
  sample = benchmark_trees.settings(config, "sample")
  assert len(sample) == 2 + 2 * len(trees)
  assert ("chain:4", "block") in sample and ("tree:2,2,1,1", "traversal") in sample


def test_draft_calls_take_the_root_pair_then_each_depths_nodes():
  assert benchmark_trees.draft_call_widths(tree_lib.chain(4)) == [2, 1, 1, 1]
  assert benchmark_trees.draft_call_widths(tree_lib.parse("chains:4x4")) == [2, 4, 4, 4]
  assert benchmark_trees.draft_call_widths(tree_lib.parse("tree:2,2,1,1")) == [2, 2, 4, 4]


def _record(mode, proposal, verifier, tokens_per_call):
  return {
    "mode": mode,
    "proposal": proposal,
    "verifier": verifier,
    "num_draft_tokens": 4,
    "tokens_per_call": tokens_per_call,
  }


def test_ratios_are_to_the_block_chain_or_in_greedy_the_one_chain():
  records = {
    "sample/chain:4/block": _record("sample", "chain:4", "block", 2.0),
    "sample/chain:4/token": _record("sample", "chain:4", "token", 1.5),
    "sample/chains:2x4/traversal": _record("sample", "chains:2x4", "traversal", 3.0),
    "greedy/chain:4/token": _record("greedy", "chain:4", "token", 4.0),
    "greedy/tree:4,1,1,1/token": _record("greedy", "tree:4,1,1,1", "token", 4.4),
    "greedy/autoregressive/-": _record("greedy", "autoregressive", "-", 1.0),
  }
  benchmark_trees.add_ratios(records)
  ratios = {k: r["vs_block"] for k, r in records.items()}
  assert ratios["sample/chain:4/token"] == 0.75 and ratios["sample/chains:2x4/traversal"] == 1.5
  assert ratios["greedy/tree:4,1,1,1/token"] == pytest.approx(1.1)
  assert ratios["greedy/autoregressive/-"] is None


def test_the_prediction_is_calibrated_to_the_paper_and_scoring_wider_costs_little():
  config = load_config("benchmark_trees")
  records = {
    "sample/autoregressive/-": _record("sample", "autoregressive", "-", 1.0),
    "sample/chain:4/block": _record("sample", "chain:4", "block", 3.0),
    "sample/chains:4x4/token": _record("sample", "chains:4x4", "token", 3.0),
  }
  predicted = benchmark_trees.predict(config, records)
  rows = predicted["records"]
  assert rows["sample/autoregressive/-"]["ms_per_token"] == pytest.approx(14.1)
  chain, tree = rows["sample/chain:4/block"], rows["sample/chains:4x4/token"]
  # Four 4B steps of 1.8 ms and a 70B call on 5 tokens, about a step.
  assert chain["draft_ms"] == pytest.approx(4 * 1.8, rel=0.02)
  assert chain["score_ms"] == pytest.approx(14.1, rel=0.02)
  # 17 tokens: memory-bound still, a few percent dearer; so the same tokens per call is slower.
  assert 1.0 < tree["score_ms"] / chain["score_ms"] < 1.05
  assert chain["speedup"] == pytest.approx(14.1 * 3 / chain["iteration_ms"])
  assert tree["speedup"] < chain["speedup"]
  assert "a model, not a measurement" in benchmark_trees.predicted_tables(predicted, ["sample"])
