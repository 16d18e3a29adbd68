"""The GPU benchmark (scripts/device_benchmark.sh) at tiny sizes on this CPU, and its parts."""

import json
import os
import re
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from conftest import script_env
from flax import nnx

from specsamp import sharding
from specsamp.experiments.benchmarks import device_benchmark, shaped_pair
from specsamp.models import transformer
from specsamp.models.config import TransformerConfig
from specsamp.sampling import model_protocol

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_8B = os.path.join(ROOT, "configs/hf/llama-3.1-8b/config.json")
DRAFT_1B = os.path.join(ROOT, "configs/hf/llama-3.2-1b/config.json")


@pytest.mark.slow
@pytest.mark.extended  # Reduced in the suite: this file's tests of the sections, gates and goals.
def test_the_tiny_benchmark_runs_from_the_shell_script(tmp_path):
  """The script's sweep at tiny sizes: rows for every setting, the table and the goals."""
  env = {**script_env(1), "OUT": str(tmp_path)}
  sections = "environment,bandwidth,warping,layers,shaped"
  result = subprocess.run(
    ["bash", "scripts/device_benchmark.sh", "--tiny", "--", f"--config.sections={sections}"],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  results = json.loads((tmp_path / "results.json").read_text())
  assert {name: row["status"] for name, row in results["status"].items()} == dict.fromkeys(
    sections.split(","), "ok"
  )
  rows = results["shaped"]["rows"]
  assert [(r["batch_size"], r["num_draft_tokens"], r["alpha"]) for r in rows] == [
    (1, 4, 0.8),
    (1, 4, 0.6),
  ]
  for row in rows:
    assert row["ar_ms_per_token"] > 0 and row["spec_ms_per_token"] > 0
    assert row["speedup"] == pytest.approx(row["ar_ms_per_token"] / row["spec_ms_per_token"])
    assert row["efficiency"] == pytest.approx(row["speedup"] / row["predicted_speedup"])
    assert row["floor_ms"] > 0 and row["ar_step_over_floor"] > 0
    assert row["draft_pass_ms"] == pytest.approx(row["pass_over_draft_step"] * row["draft_step_ms"])
  products = results["bandwidth"]["decode_matmuls"]["products"]
  assert set(products) == {"q", "k_v", "o", "mlp_in", "mlp_out", "head"}
  assert all(row["in_major_s"] > 0 and row["out_major_s"] > 0 for row in products.values())
  warped = results["warping"]["records"]
  assert [(r["vocab"], r["batch"]) for r in warped] == [(16_384, 1), (16_384, 5)]
  # Both ways keep the same tokens (they may differ only for a token within float32 rounding
  # of top_p, which these seeded rows do not have), and every Zipf row's nucleus lies in its
  # most likely blocks (its 128 most likely tokens hold about 99% of the mass).
  for r in warped:
    assert r["same_tokens"] and r["rows_found_in_blocks"] == r["batch"]
  drawn = results["warping"]["draws"]
  assert [(r["vocab"], r["batch"], r["block"]) for r in drawn] == [(1024, 1, 32), (1024, 8, 32)]
  assert all(r["flat_us"] > 0 and r["two_stage_us"] > 0 for r in drawn)
  assert set(results["layers"]["chosen"].values()) <= {"scan", "unrolled", "unstacked"}
  assert results["shaped"]["layers"] == results["layers"]["chosen"]
  table = (tmp_path / "log.txt").read_text()
  assert "| B | K | alpha |" in table and "8B/1B alpha 0.8 K=4 batch 1:" in table
  assert "| vocab | rows | nucleus, blocks first |" in table and "| 16,384 | 5 |" in table
  assert "| vocab | rows | block | flat race |" in table and "| 1,024 | 8 | 32 |" in table


def _results(speedup=2.1, efficiency=0.9, floor=1.2, peer_ratio=1.6, pass_ratio=None) -> dict:
  row = dict(
    batch_size=1,
    num_draft_tokens=4,
    alpha=0.8,
    ar_ms_per_token=4.0,
    spec_ms_per_token=4.0 / speedup,
    speedup=speedup,
    predicted_speedup=speedup / efficiency,
    efficiency=efficiency,
    tokens_per_target_call=3.3,
    draft_ratio=0.15,
    score_ratio=1.02,
    ar_step_over_floor=floor,
    ar_loop_over_floor=floor * 1.01,
  )
  if pass_ratio is not None:  # Rows of runs before 2026-11-27 lack the draft pass.
    row.update(pass_over_draft_step=pass_ratio, draft_pass_ms=pass_ratio * 0.6)
  side = lambda tps: {"tokens_per_s": tps}
  return {
    "status": {"shaped": {"status": "ok", "seconds": 1.0}},
    "shaped": {
      "target_hf_config": TARGET_8B,
      "draft_hf_config": DRAFT_1B,
      "dtype": "bfloat16",
      "tiny": False,
      "prompt_tokens": 128,
      "max_new_tokens": 64,
      "rows": [row],
    },
    "shaped_peer": {
      "num_draft_tokens": 4,
      "modes": {
        "greedy": {
          "specsamp speculative (K=4)": side(100.0 * peer_ratio),
          "hf assisted (K=4)": side(100.0),
          "specsamp autoregressive": side(80.0),
          "hf autoregressive": side(40.0),
          "ratio_vs_hf_assisted": peer_ratio,
        }
      },
    },
  }


def test_the_device_wheels_are_checked_after_they_are_installed(tmp_path):
  """install_wheels (scripts/device_wheels.sh) fails in one line naming the module when the
  wheels did not bring it, and passes when the module imports."""

  def install(module):
    script = f"source {ROOT}/scripts/device_wheels.sh && install_wheels {tmp_path}/site {module}"
    return subprocess.run(
      ["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )

  missing = install("json,specsamp_no_such_module")
  assert missing.returncode == 1
  assert "cannot import json,specsamp_no_such_module" in missing.stderr
  assert "device_answers.sh pack" in missing.stderr
  present = install("json")
  assert present.returncode == 0, present.stderr


@pytest.mark.parametrize(
  "changes, verdicts",
  [
    ({}, ["met", "met", "met", "met"]),
    (dict(speedup=1.53, efficiency=0.88), ["NOT met", "met", "met", "met"]),
    (dict(efficiency=0.84), ["met", "NOT met", "met", "met"]),
    (dict(floor=2.12), ["met", "met", "NOT met", "met"]),
    (dict(peer_ratio=1.2), ["met", "met", "met", "NOT met"]),
    (dict(pass_ratio=1.1), ["met", "met", "met", "met", "met"]),
    (dict(pass_ratio=2.37), ["met", "met", "NOT met", "met", "met"]),
  ],
)
def test_the_goals_are_read_off_the_results(changes, verdicts):
  lines = "\n".join(device_benchmark.goal_lines(_results(**changes)))
  assert re.findall(r"(NOT met|met)\)", lines) == verdicts
  assert "| 1 | 4 | 0.8 |" in device_benchmark.format_summary(_results(**changes))


def test_a_gate_fails_only_on_a_check_it_completed():
  equal = {"chain, batch ragged": {"equal": True}}
  assert not device_benchmark.gate_failed({"passed": None, "greedy": equal})  # Cut short.
  assert device_benchmark.gate_failed({"greedy": {"tree": {"equal": False}}})
  assert device_benchmark.gate_failed({"greedy": equal, "g_test": {"passed": False}})
  assert not device_benchmark.gate_failed({"greedy": equal, "g_test": {"passed": True}})


def _config(sections: str, **budgets) -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.sections = sections
  config.stop_on_gate_failure = True
  config.budgets = ml_collections.ConfigDict(budgets)
  return config


def test_a_section_past_its_budget_stops_and_the_rest_still_run(tmp_path, monkeypatch):
  def slow(config, context, log):
    context["results"]["shaped"] = {"rows": [{"kept": True}]}  # A row it finished.
    time.sleep(5)

  monkeypatch.setitem(device_benchmark.SECTION_FUNCTIONS, "shaped", slow)
  monkeypatch.setitem(device_benchmark.SECTION_FUNCTIONS, "pairs", lambda *_: {"ran": True})
  start = time.perf_counter()
  results = device_benchmark.run(_config("shaped,pairs", shaped=0.3), str(tmp_path), log=print)
  assert time.perf_counter() - start < 4
  assert results["status"]["shaped"]["status"].startswith("stopped: past its budget")
  assert results["shaped"]["rows"] == [{"kept": True}]
  assert results["pairs"] == {"ran": True}
  assert json.loads((tmp_path / "results.json").read_text())["pairs"] == {"ran": True}


def test_a_failed_gate_times_nothing_then_or_in_a_later_process(tmp_path, monkeypatch):
  failed = {"passed": False, "greedy": {"chain, batch ragged": {"equal": False}}}
  monkeypatch.setitem(device_benchmark.SECTION_FUNCTIONS, "gate", lambda *_: failed)
  ran = []
  monkeypatch.setitem(device_benchmark.SECTION_FUNCTIONS, "bandwidth", lambda *_: ran.append(1))
  results = device_benchmark.run(_config("gate,bandwidth"), str(tmp_path), log=print)
  assert "bandwidth" not in results and not ran
  results = device_benchmark.run(_config("bandwidth"), str(tmp_path), log=print, append=True)
  assert results["gate"] == failed and not ran
  with pytest.raises(ValueError, match="Unknown sections"):
    device_benchmark.run(_config("gate,warp"), str(tmp_path))


def test_the_8b_shapes_read_every_weight_once():
  """Llama-3.1-8B from its config.json: 8,030,261,248 parameters (its model card's count), and
  a decode step reads all but the embedding table's unused rows: 2 bytes each in bfloat16."""
  config = shaped_pair.model_config(TARGET_8B, "bfloat16")
  count = sharding.count_parameters(lambda rngs: transformer.Transformer(config, rngs=rngs))
  assert count == 8_030_261_248
  embedding = config.vocab_size * config.d_model
  kv = 2 * config.num_layers * config.num_kv_heads * config.resolved_head_dim * 2 * 192
  read = shaped_pair.step_read_bytes(config, 1, 192)
  assert read == pytest.approx(2 * (count - embedding) + kv, rel=1e-3)
  draft = shaped_pair.model_config(DRAFT_1B, "bfloat16", tiny=True)
  assert (draft.d_model, draft.num_layers, draft.tie_embeddings) == (64, 2, True)


@pytest.mark.parametrize("path", [TARGET_8B, DRAFT_1B])
def test_the_decode_products_are_every_weight_matrix_of_the_step(path):
  """decode_matmuls covers each weight matrix a step multiplies by exactly once: with the
  embedding table (when untied) and the norms' scales it is the model's parameter count."""
  config = shaped_pair.model_config(path, "bfloat16")
  count = sharding.count_parameters(lambda rngs: transformer.Transformer(config, rngs=rngs))
  products = shaped_pair.decode_matmuls(config)
  weights = sum(d_in * d_out * n for d_in, d_out, n, _ in products.values())
  embedding = 0 if config.tie_embeddings else config.vocab_size * config.d_model
  norms = config.d_model * (2 * config.num_layers + 1)
  assert weights + embedding + norms == count
  assert products["head"][3] is config.tie_embeddings  # A tied head reads the [V, D] table.


def test_the_decode_products_are_timed_in_both_layouts():
  config = shaped_pair.model_config(TARGET_8B, "float32", tiny=True)
  timed = shaped_pair.time_decode_matmuls(config, 2, "float32", 1e10, stack_bytes=2**16, repeats=1)
  assert timed["products"].keys() == shaped_pair.decode_matmuls(config).keys()
  step = 0.0
  for row in timed["products"].values():
    for layout in ("in_major", "out_major"):
      assert row[f"{layout}_s"] > 0
      assert row[f"{layout}_bytes_per_s"] == pytest.approx(
        row["d_in"] * row["d_out"] * 4 / row[f"{layout}_s"]
      )
    step += row["count"] * row["out_major_s" if row["out_major"] else "in_major_s"]
  assert timed["step_s"] == pytest.approx(step)


def test_layers_unroll_only_when_clearly_faster():
  seconds = {
    # The H200's 8B step: 0.2% faster unrolled over the stack (unstacked: not timed there).
    "target": {"scan": 11.453, "unrolled": 11.431, "unstacked": 11.44},
    "draft": {"scan": 2.0, "unrolled": 1.8, "unstacked": 1.9},
    "cpu": {"scan": 6.43, "unrolled": 12.0, "unstacked": 3.66},  # This CPU's default target.
  }
  assert device_benchmark.choose_layer_modes(seconds, 0.05) == {
    "target": "scan",
    "draft": "unrolled",
    "cpu": "unstacked",
  }
  assert device_benchmark.choose_layer_modes(seconds, 0.0)["target"] == "unrolled"


def test_twins_with_unrolled_or_unstacked_layers_give_the_same_logits():
  """'unrolled' shares the model's arrays; 'unstacked' holds one copy per layer and leaves the
  model stacked."""
  config = TransformerConfig(
    vocab_size=64, num_layers=3, d_model=32, num_heads=4, num_kv_heads=2, ffn_dim=64
  )
  model = transformer.create(config, seed=0)
  twin = shaped_pair.with_layers(model, "unrolled")
  assert twin.config.scan_layers is False and model.config.scan_layers is True
  leaves = lambda m: jax.tree.leaves(model_protocol.split_model(m)[1])
  assert all(a is b for a, b in zip(leaves(model), leaves(twin)))
  unstacked = shaped_pair.with_layers(model, "unstacked")
  assert transformer.is_unstacked(unstacked) and not transformer.is_unstacked(model)
  tokens = jnp.asarray([[1, 5, 9, 2]], jnp.int32)
  positions = jnp.arange(4, dtype=jnp.int32)[None]
  call = nnx.jit(lambda m: m(tokens, positions, m.init_cache(1, 8))[0])
  logits = [call(m) for m in (model, twin, unstacked)]
  for other in logits[1:]:
    np.testing.assert_allclose(logits[0], other, rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="mode must be one of"):
    shaped_pair.with_layers(model, "stacked")


def test_layer_layouts_are_timed_against_the_floor():
  """scripts/benchmark_layers.py's comparison: every layout of every model at every token
  count, beside one floor per call (the same weight bytes whatever the layout)."""
  from specsamp.experiments.benchmarks import layer_layouts

  config = TransformerConfig(
    vocab_size=64, num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, ffn_dim=64
  )
  out = layer_layouts.compare(
    {"tiny": config}, tokens=(1, 3), cache_slots=16, rounds=1, log=[].append
  )
  assert sorted(out["results"]) == ["tiny/1", "tiny/3"]
  assert out["machine"]["memory_bandwidth"] > 0
  for record in out["results"].values():
    for mode in shaped_pair.LAYER_MODES:
      assert record[f"{mode}_ms"] > 0
      assert record[f"{mode}_of_floor"] == pytest.approx(record["floor_ms"] / record[f"{mode}_ms"])


if __name__ == "__main__":
  sys.exit(pytest.main([__file__, "-q"]))
