"""keras-hub side by side (scripts/compare_keras_hub.py): the same weights in both libraries,
greedy identity, the exactness test's power over keras-hub's SpeculativeSampler, and the
script end to end."""

import json
import os

import numpy as np
import pytest
from test_scripts import run_script

from specsamp.experiments.peers import compare_keras_hub, keras_hub_peer


@pytest.fixture(scope="module", autouse=True)
def _keras_hub_is_installed():
  """The test command installs keras-hub (--no-deps) on JAX: no skip. Imported in the worker
  that runs these tests, not at collection (keras costs every worker about 3 s there)."""
  keras_hub_peer.modules()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  target, draft = compare_keras_hub.exact_pair()
  paths = compare_keras_hub.export_pair(target, draft, str(tmp_path_factory.mktemp("exact")))
  return target, draft, paths


def test_a_missing_export_is_refused_in_one_line(tmp_path):
  with pytest.raises(FileNotFoundError, match="config.json missing"):
    keras_hub_peer.load_causal_lm(str(tmp_path / "nope"))


def test_a_pair_keras_hub_cannot_drive_is_refused_before_training(tmp_path):
  from specsamp.experiments import config_files

  path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs", "code_pair.py")
  config = config_files.load_module(path).get_config("test")  # GELU MLP: HF 'arcee'.
  with pytest.raises(ValueError, match="exports as HF 'arcee'.*code_pair.py:llama"):
    compare_keras_hub.run(config, str(tmp_path), parts=("speed",))
  assert not os.listdir(tmp_path)  # Nothing trained, nothing written.


@pytest.mark.slow
def test_parity_check_refuses_different_weights(tiny):
  target, draft, paths = tiny
  with pytest.raises(AssertionError, match="logits differ"):
    compare_keras_hub.check_parity(
      {"draft as target": (draft, keras_hub_peer.load_causal_lm(paths["target"]))},
      np.zeros((1, 4), np.int64),
    )


def test_keras_hub_rule_is_a_distribution_and_differs_from_the_target(tiny):
  target, draft, _ = tiny
  from specsamp.sampling import warping
  from specsamp.testing import exactness

  rule = compare_keras_hub.keras_hub_rule(target, draft, 1.0, compare_keras_hub.EXACT_K)
  exact = exactness.exact_distribution(
    target, compare_keras_hub.EXACT_PROMPT, warping.SamplingConfig(1.0), 3
  )
  assert rule.min() >= 0 and abs(rule.sum() - 1) < 1e-9 and abs(exact.sum() - 1) < 1e-9
  assert 0.5 * np.abs(rule - exact).sum() > 0.05  # Far from exact: what the G-test sees.


@pytest.mark.slow
@pytest.mark.extended  # The suite's reduced version: the two tests above on the tiny pair.
def test_compare_script_end_to_end(tmp_path):
  """The script on the micro Llama pair: parity, greedy identity in all four samplers, and
  at T=1, batch 1, 4,000 sequences: specsamp passes the G-test; keras-hub's SpeculativeSampler
  is rejected against the target and passes against the exact distribution of its own rule;
  keras-hub's autoregressive sampler (the control) passes."""
  workdir, output = str(tmp_path / "work"), str(tmp_path / "kh.json")
  result = run_script(
    "compare_keras_hub.py",
    "--config=configs/code_pair.py:test",
    "--config.target.model.mlp_activation=swiglu",
    "--config.draft.model.mlp_activation=swiglu",
    f"--workdir={workdir}",
    "--modes=greedy",
    "--batch_sizes=2",
    "--calls=1",
    "--rounds=2",
    "--max_new_tokens=8",
    "--exact_samples=4000",
    "--exact_warpings=T=1",
    "--exact_batches=1",
    f"--output={output}",
  )
  assert result.returncode == 0, result.stderr[-3000:]
  for needle in ("parity:", "keras-hub speculative (K=4)", "specsamp speculative (K=4)", "G="):
    assert needle in result.stdout, needle
  results = json.load(open(output))
  (greedy,) = results["speed"]["settings"]
  assert (greedy["mode"], greedy["batch_size"]) == ("greedy", 2)
  assert all(greedy["greedy_identical"].values()), greedy["greedy_identical"]
  assert max(results["speed"]["parity"].values()) <= compare_keras_hub.PARITY_TOLERANCE
  exactness = results["exactness"]
  assert exactness["greedy_identical"]
  assert max(exactness["parity"].values()) <= compare_keras_hub.PARITY_TOLERANCE
  cases = {case["sampler"]: case for case in exactness["cases"]}
  assert cases["specsamp speculative"]["passed"], cases["specsamp speculative"]
  assert cases["keras-hub autoregressive"]["passed"], cases["keras-hub autoregressive"]
  keras = cases["keras-hub speculative"]
  assert not keras["passed"] and keras["G"] > 10 * keras["threshold"], keras
  assert keras["vs_rule"]["passed"], keras["vs_rule"]
  assert "| sampler |" in open(os.path.splitext(output)[0] + ".md").read()
