"""scripts/sample.py and scripts/train.py end to end on the micro pair, as a user runs them."""

import json
import os
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import flip_a_byte, largest_file, script_env, xla_flags
from warm_python import WarmPython

from specsamp.sampling import tree as tree_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARM = WarmPython()


@pytest.fixture(scope="module", autouse=True)
def _warm_python():
  yield
  WARM.close()


def run_script(script, *args, devices=None):
  """Runs scripts/``script`` as a user would, in a process of its own forked from a warm
  interpreter (tests/warm_python.py). On one simulated CPU device unless ``devices`` says
  otherwise or a flag sets a mesh (then 8): the default mesh takes every device, and 8 of them
  made the training script 43% slower (33.2 s against 23.1 s, 2026-11-26)."""
  if devices is None:
    devices = 8 if any(arg.startswith(("--config.mesh.", "--mesh_")) for arg in args) else 1
  return WARM.run([os.path.join(ROOT, "scripts", script), *args], script_env(devices), ROOT, 300)


def start_two_processes(script, *args, devices):
  """scripts/``script`` started twice, as processes 0 and 1 of one jax.distributed run (gloo,
  a free localhost port), each on ``devices`` simulated CPU devices: the Popen objects."""
  import socket

  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  return [
    subprocess.Popen(
      [
        sys.executable,
        "-u",
        os.path.join(ROOT, "scripts", script),
        *args,
        "--distributed=manual",
        f"--coordinator_address=localhost:{port}",
        "--num_processes=2",
        f"--process_id={i}",
      ],
      cwd=ROOT,
      env=script_env(devices),
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for i in range(2)
  ]


def interrupt_when(worker, marker):
  """Reads ``worker``'s output up to the first line holding ``marker``, then sends it SIGINT:
  the lines read."""
  import signal

  seen = []
  for line in worker.stdout:
    seen.append(line)
    if marker in line:
      break
  worker.send_signal(signal.SIGINT)
  return "".join(seen)


def finish(workers, timeout=180):
  """(stdout, stderr) of each worker once it exits; every worker is killed if one does not
  exit in time (hosts waiting on each other hang rather than fail)."""
  try:
    return [worker.communicate(timeout=timeout) for worker in workers]
  finally:
    for worker in workers:
      worker.kill()


@pytest.fixture(scope="module")
def trained_workdir(tmp_path_factory):
  """The micro pair trained once by scripts/train.py (both drafts), shared by the tests."""
  workdir = str(tmp_path_factory.mktemp("pair") / "work")
  result = run_script(
    "train.py", "--config=configs/code_pair.py:test", f"--workdir={workdir}", "--drafts=none,token"
  )
  assert result.returncode == 0, result.stderr[-3000:]
  return workdir, result.stdout


@pytest.mark.slow
def test_train_script_trains_with_progress_and_reports_each_draft(trained_workdir):
  workdir, stdout = trained_workdir
  for needle in (
    "tokenizer: training",
    "target step",
    "tokens/s",
    "ETA",
    "eval",
    "draft (from scratch) step",
    "draft (token distillation) step",
    "Acceptance on",
  ):
    assert needle in stdout, needle
  table = [
    line.split() for line in stdout.splitlines() if line.split()[:1] in (["none"], ["token"])
  ]
  assert sorted((row[0], row[1]) for row in table) == [
    ("none", "T=1"),
    ("none", "greedy"),
    ("token", "T=1"),
    ("token", "greedy"),
  ]
  assert sorted(os.listdir(workdir)) == [
    "draft_none",
    "draft_token",
    "target",
    "tokenizer.model",
    "tokenizer_source.json",
  ]


@pytest.mark.slow
def test_sample_script_loads_the_cached_pair_and_reports(trained_workdir, tmp_path):
  """The user's own prompts (a JSONL file of two prompts of different lengths), with the
  report echoing its settings and one JSONL record per prompt."""
  import json

  workdir, _ = trained_workdir
  prompt_file = tmp_path / "prompts.jsonl"
  prompt_file.write_text(
    json.dumps({"prompt": "def fib(n):"}) + "\n" + json.dumps({"prompt": "import os\nx = ["}) + "\n"
  )
  result = run_script(
    "sample.py",
    "--config=configs/code_pair.py:test",
    f"--workdir={workdir}",
    "--config.sampling.temperature=0.8",
    "--config.sampling.top_p=0.95",
    "--config.speculative.verifier=block",
    "--config.mesh.data=2",
    "--config.mesh.tensor=4",
    f"--prompts_file={prompt_file}",
    f"--output_jsonl={tmp_path / 'rows.jsonl'}",
  )
  assert result.returncode == 0, result.stderr[-3000:]
  out = result.stdout
  assert "settings: prompt_source=file:" in out and "temperature=0.8" in out
  assert "verifier=block" in out and "num_draft_tokens=4" in out
  rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
  assert [row["prompt"] for row in rows] == ["def fib(n):", "import os\nx = ["]
  for row in rows:
    assert row["generated_tokens"] == 8 and row["speculative"] and row["autoregressive"]
    assert row["tokens_per_target_call"] == 8 / row["iterations"]
    assert sum(row["accepted_histogram"]) == row["iterations"]
  assert "target: loaded step" in out and "draft (token distillation): loaded step" in out
  assert "training" not in out  # nothing retrained
  for needle in (
    "autoregressive continuation:",
    "speculative continuation:",
    "ms/token",
    "speedup:",
    "acceptance:",
    "alpha",
    "t=1..4:",
    "tokens/target call:",
    "step costs:",
    "predicted:",
    "efficiency",
  ):
    assert needle in out, needle


@pytest.mark.slow
@pytest.mark.extended  # Reduced in the suite: tests/test_parallel_bound.py, in process.
def test_the_parallel_bound_script_reports_each_k(trained_workdir, tmp_path):
  """scripts/parallel_bound.py on the cached target: the target-marginal parallel drafter's
  tokens per call, within (1, K + 1], and the same numbers in its JSON."""
  output = tmp_path / "bound.json"
  result = run_script(
    "parallel_bound.py",
    "--config=configs/code_pair.py:test",
    f"--workdir={trained_workdir[0]}",
    "--ks=1,3",
    "--trees=1x2",
    "--windows=2",
    "--cuts=8,16",
    "--paths=8",
    "--chains=8",
    f"--output={output}",
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert "target: training" not in result.stdout and "4 contexts of 8, 16 tokens" in result.stdout
  reported = [
    float(x) for x in re.findall(r"(?:K=\d|tree 1x2 \(3 nodes\)): ([\d.]+) tokens", result.stdout)
  ]
  results = json.load(open(output))["results"]
  assert [r["widths"] for r in results] == [[1], [1, 1, 1], [1, 2]], result.stdout
  assert [r["contexts"] for r in results] == [4, 4, 4]
  np.testing.assert_allclose(reported, [r["tokens_per_call"] for r in results], atol=0.005)
  assert reported[0] == pytest.approx(2.0, abs=0.005)  # One draft from m_1 = p is always accepted.
  assert 1.0 < reported[1] <= 4.0 and 2.0 <= reported[2] <= 3.0
  # The script's wiring (contexts cut from the validation windows, the config's sampling and
  # seed): the library on the same target and contexts, in this process, gives the same tree.
  from specsamp.experiments.benchmarks import parallel_bound
  from specsamp.experiments.jobs import pair as pair_lib
  from specsamp.sampling import warping

  config = _test_pair_config()
  pair = pair_lib.prepare(config, trained_workdir[0], drafts=False, log=lambda _: None)
  windows = np.asarray(pair_lib.validation_windows(config, pair, 2, 16))
  again = parallel_bound.over_contexts(
    pair.target,
    [row[:cut].tolist() for row in windows for cut in (8, 16)],
    2,
    warping.SamplingConfig(
      config.sampling.temperature, top_k=config.sampling.top_k, top_p=config.sampling.top_p
    ),
    widths=(1, 2),
    paths=8,
    chains=8,
    seed=config.seed,
  )
  assert again["tokens_per_call"] == pytest.approx(results[2]["tokens_per_call"], abs=1e-5)


def test_a_pair_samples_with_its_layers_unstacked_on_cpu_and_saves_them_stacked(trained_workdir):
  """``layer_layout`` 'auto' on this CPU holds each loaded model's layers one array per layer
  (``transformer.unstack_layers``), 'stacked' keeps the scan; the same logits, and the
  parameters a checkpoint or an export reads are the stack either way."""
  from specsamp.experiments.jobs import pair as pair_lib
  from specsamp.models import transformer
  from specsamp.training import train

  config = _test_pair_config()
  pairs = {}
  for layout in ("auto", "stacked"):
    config.layer_layout = layout
    pairs[layout] = pair_lib.prepare(config, trained_workdir[0], log=lambda _: None)
  assert transformer.is_unstacked(pairs["auto"].target)
  assert transformer.is_unstacked(pairs["auto"].draft)
  assert not transformer.is_unstacked(pairs["stacked"].target)
  tokens = jnp.asarray(pairs["auto"].prompts[:2])
  logits = {k: jax.jit(lambda t, m=p.target: m(t)[0])(tokens) for k, p in pairs.items()}
  np.testing.assert_allclose(logits["auto"], logits["stacked"], rtol=1e-5, atol=1e-5)
  saved = [train.params_of(p.target) for p in pairs.values()]
  assert jax.tree.structure(saved[0]) == jax.tree.structure(saved[1])
  for a, b in zip(*map(jax.tree.leaves, saved)):
    np.testing.assert_array_equal(a, b)
  config.layer_layout = "unstack"
  with pytest.raises(ValueError, match="layer_layout must be one of .*got 'unstack'"):
    pair_lib.prepare(config, trained_workdir[0], log=lambda _: None)


def test_the_layer_layouts_loops_are_timed_side_by_side(trained_workdir):
  """scripts/benchmark_layers.py --loops: both loops in both layouts, interleaved."""
  from specsamp.experiments.benchmarks import layer_layouts

  config = _test_pair_config()
  config.speculative.num_draft_tokens = 2
  logs = []
  out = layer_layouts.compare_loops(config, trained_workdir[0], calls=2, log=logs.append)
  for loop in ("autoregressive", "speculative"):
    assert sorted(out["ms_per_token"][loop]) == ["stacked", "unstacked"]
  for layout, speedup in out["speedup"].items():
    ms = out["ms_per_token"]
    assert speedup == pytest.approx(ms["autoregressive"][layout] / ms["speculative"][layout])
  assert "stacked: autoregressive" in logs[-1] and "unstacked: autoregressive" in logs[-1]


@pytest.mark.slow
def test_a_workdir_with_another_tokenizer_is_refused(trained_workdir, tmp_path):
  workdir, _ = trained_workdir
  from specsamp.training.tokenizer import Tokenizer

  copy = str(tmp_path / "copy")
  shutil.copytree(workdir, copy)
  import argparse
  import inspect  # Two stdlib files: another tokenizer of the same size.

  other = Tokenizer.train([line for m in (argparse, inspect) for line in open(m.__file__)], 384)
  with open(os.path.join(copy, "tokenizer.model"), "wb") as f:
    f.write(other.model_proto)
  result = run_script("sample.py", "--config=configs/code_pair.py:test", f"--workdir={copy}")
  assert result.returncode != 0
  assert "different tokenizer" in result.stderr
  assert sorted(os.listdir(copy)) == sorted(os.listdir(workdir))  # nothing deleted


@pytest.mark.slow
@pytest.mark.parametrize(
  "override,message",
  [
    ("--config.sampling.top_p=1.5", "--config.sampling.top_p=1.5: must be in (0, 1]"),
    ("--config.speculative.verifier=magic", "--config.speculative.verifier='magic': must be one"),
    (
      "--config.sampling.topp=1",
      "--config.sampling.topp=1: the config has no field 'topp'; did you mean 'top_p'?",
    ),
    (  # No near miss: ml_collections' KeyError named the field only ("'gpus'").
      "--config.mesh.gpus=2",
      "--config.mesh.gpus=2: the config has no field 'gpus' (--help lists every field)",
    ),
    (
      "--config.speculative.num_draft_tokens=200",
      "--config.speculative.num_draft_tokens=200: must be <= sampling.max_new_tokens (8)",
    ),
  ],
)
def test_sample_script_reports_bad_overrides_in_one_line(tmp_path, override, message):
  """Checked before anything trains or compiles: one line naming the flag, exit status 2."""
  result = run_script(
    "sample.py", "--config=configs/code_pair.py:test", f"--workdir={tmp_path / 'w'}", override
  )
  assert result.returncode == 2
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(f"error: {message}"), result.stderr
  assert not (tmp_path / "w").exists()  # nothing was created, trained or compiled


@pytest.mark.slow
def test_a_workdir_trained_on_another_corpus_is_refused(trained_workdir, tmp_path):
  workdir, _ = trained_workdir
  for i in range(200):  # enough files for every split
    (tmp_path / f"mine_{i}.py").write_text(f"def f{i}(x):\n    return x * {i}\n" * 20)
  result = run_script(
    "sample.py",
    "--config=configs/code_pair.py:test",
    f"--workdir={workdir}",
    f"--corpus={tmp_path}/*.py",
  )
  assert result.returncode != 0  # The tokenizer's record of its corpus refuses it first.
  assert "tokenizer.model was trained on other data" in result.stderr
  assert "use another --workdir" in result.stderr
  # Data the tokenizer does not depend on: the checkpoints' record of their data refuses it.
  result = run_script(
    "sample.py",
    "--config=configs/code_pair.py:test",
    f"--workdir={workdir}",
    "--config.data.max_train_tokens=12345",
  )
  assert result.returncode != 0
  assert "different data" in result.stderr and "Use another --workdir" in result.stderr


@pytest.mark.slow
@pytest.mark.extended  # Reduced in the suite: tests/test_benchmark.py (the sweep's store, timing).
def test_benchmark_script_sweeps_resumes_and_feeds_the_performance_model(trained_workdir, tmp_path):
  workdir, _ = trained_workdir
  output = str(tmp_path / "bench")
  args = [
    "--config=configs/benchmark.py:test",
    f"--workdir={workdir}",
    f"--config.output_dir={output}",
  ]
  result = run_script("benchmark.py", *args)
  assert result.returncode == 0, result.stderr[-3000:]
  setting_lines = [line for line in result.stdout.splitlines() if "ms/token (AR" in line]
  # Mode 'sample', batch 1, K=2 and the automatic K: token and block verification of the
  # distilled draft, and the synthetic drafter at K=2 (a forced acceptance has no 'auto').
  assert len(setting_lines) == 5, result.stdout
  assert all("efficiency" in line for line in setting_lines)
  auto_lines = [line for line in setting_lines if "K=auto (auto: K=" in line]
  assert len(auto_lines) == 2, result.stdout
  assert "The automatic draft length" in result.stdout
  with open(os.path.join(output, "results.csv")) as f:
    header, *rows = f.read().splitlines()
  assert header.split(",")[:3] == ["mode", "temperature", "top_p"] and len(rows) == 5
  assert {
    "speedup_vs_k.png",
    "acceptance_per_position.png",
    "ms_per_token.png",
    "results.json",
  } <= set(os.listdir(output))
  # A second run finds every setting done and times nothing again.
  again = run_script("benchmark.py", *args)
  assert again.returncode == 0, again.stderr[-3000:]
  assert "ms/token (AR" not in again.stdout
  model = run_script("perf_model.py", f"--results={output}/results.json")
  assert model.returncode == 0, model.stderr[-3000:]
  for needle in (
    "The paper's setting",
    "Calibrated on",
    "memory-bandwidth floor",
    "Recommended K",
    "HumanEval nucleus",
  ):
    assert needle in model.stdout, needle


@pytest.mark.slow
@pytest.mark.extended  # Reduced in the suite: test_hf.py's export round trips, test_gguf's import.
def test_export_and_import_scripts_round_trip_the_trained_pair(trained_workdir, tmp_path):
  """The default-pair family (plain GELU MLP) exports as HF 'arcee', loads in transformers with
  the same logits, and imports back to identical parameters."""
  import jax
  import numpy as np
  import torch
  import transformers

  from specsamp.hf import convert
  from specsamp.training import checkpoint

  workdir, _ = trained_workdir
  hf_dir, back = str(tmp_path / "hf"), str(tmp_path / "back")
  result = run_script("export_hf.py", f"--checkpoint={workdir}/target", f"--output={hf_dir}")
  assert result.returncode == 0, result.stderr[-3000:]
  assert "+ tokenizer.model" in result.stdout
  assert sorted(os.listdir(hf_dir)) == [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.model",
  ]
  ours, _ = checkpoint.load_model(f"{workdir}/target")
  tokens = np.random.default_rng(0).integers(4, ours.vocab_size, size=(2, 10))
  hf_model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).eval()
  assert hf_model.config.model_type == "arcee"
  with torch.no_grad():
    reference = hf_model(torch.as_tensor(tokens)).logits.numpy()
  logits = np.asarray(ours(jax.numpy.asarray(tokens))[0])
  assert np.abs(logits - reference).max() < 1e-4 * np.abs(reference).max()

  result = run_script(
    "import_hf.py", f"--hf_dir={hf_dir}", f"--output={back}", "--mesh_data=2", "--mesh_tensor=4"
  )
  assert result.returncode == 0, result.stderr[-3000:]
  again, meta = checkpoint.load_model(back)
  # The same model; the import reads the context the export wrote (8192: a pair trained here
  # records none), a descriptive field no identity check compares.
  assert again.config.max_position == 8192
  assert again.config.replace(max_position=None) == ours.config
  assert meta["source"]["model_type"] == "arcee"
  for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(again)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

  # The imported pair drives the main job through the config's checkpoint fields (the draft
  # takes the same round trip through the Python API).
  draft_hf, draft_back = str(tmp_path / "draft_hf"), str(tmp_path / "draft_back")
  convert.export_model(checkpoint.load_model(f"{workdir}/draft_token")[0], draft_hf)
  convert.import_to_checkpoint(draft_hf, draft_back)
  result = run_script(
    "sample.py",
    "--config=configs/code_pair.py:test",
    f"--workdir={tmp_path / 'imported_pair'}",
    f"--config.target.checkpoint={back}",
    f"--config.draft.checkpoint={draft_back}",
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"target: loaded 2 layers x 64 from {back}" in result.stdout
  assert "training" not in result.stdout and "speedup:" in result.stdout


@pytest.mark.slow
@pytest.mark.extended  # Reduced in the suite: tests/test_hf.py's assisted-generation parity.
def test_compare_hf_script_times_both_libraries(trained_workdir, tmp_path):
  import json

  workdir, _ = trained_workdir
  output = str(tmp_path / "compare.json")
  result = run_script(
    "compare_hf.py",
    "--config=configs/code_pair.py:test",
    f"--workdir={workdir}",
    f"--output={output}",
  )
  assert result.returncode == 0, result.stderr[-3000:]
  for needle in (
    "greedy (greedy):",
    "nucleus (temperature 0.8, top-p 0.95):",
    "hf assisted (K=4)",
    "hf assisted (hf defaults)",
    "specsamp speculative (K=4)",
    "specsamp speculative / hf assisted (same K):",
    "at equal tokens per verification:",
    "greedy outputs identical across all five: True",
  ):
    assert needle in result.stdout, needle
  results = json.load(open(output))
  assert results["hf_defaults"]["num_assistant_tokens"] == 20
  for mode in ("greedy", "nucleus"):
    entry = results["modes"][mode]
    assert entry["ratio_vs_hf_assisted"] > 0
    assert entry["specsamp speculative (K=4)"]["tokens"] == 2 * 8
    assert 1.0 <= entry["hf assisted (K=4)"]["tokens_per_target_call"] <= 5.0


@pytest.mark.slow
def test_drafter_benchmark_compares_drafters_and_schedules(trained_workdir, tmp_path):
  import json

  workdir, _ = trained_workdir
  output = str(tmp_path / "drafters")
  # The user's own prompts, of different lengths (the benchmarks take every prompt source).
  prompt_file = tmp_path / "prompts.txt"
  prompt_file.write_text(
    "def fibonacci(n):\\n    if n < 2:\\n        return n\n"
    "class Stack:\\n    def __init__(self):\\n        self.items = []\\n    def push(self, x):\n"
  )
  result = run_script(
    "benchmark_drafters.py",
    "--config=configs/benchmark_drafters.py:test",
    f"--workdir={workdir}",
    f"--config.output_dir={output}",
    f"--prompts_file={prompt_file}",
    "--config.trees=chain;tree:2,1;sequoia:3x2",
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"timing 2 file:{prompt_file} prompts of" in result.stdout
  records = json.load(open(os.path.join(output, "results.json")))["records"]
  # 2 tasks x greedy x (2 drafters x 2 schedules x the chain at K=2, + the model's 2 trees).
  assert len(records) == 12
  assert {r["drafter"] for r in records.values()} == {"model", "lookup"}
  assert {r["task"] for r in records.values()} == {"continue", "grounded"}
  trees = [r for r in records.values() if "tree" in r]
  assert {(r["drafter"], r["schedule"], r["tree"]) for r in trees} == {
    ("model", "fixed", "tree:2,1"),
    ("model", "fixed", "sequoia:3x2"),
  }
  for r in trees:  # The Sequoia tree is shaped from the tree:2,1 run's acceptance per rank.
    assert len(r["acceptance_at_rank"]) == 2
    if r["tree"].startswith("sequoia"):
      measured = [t for t in trees if t["tree"] == "tree:2,1" and t["task"] == r["task"]][0]
      ranks = [float(a) for a in r["shaped_from"].split(",")]
      np.testing.assert_allclose(ranks, measured["acceptance_at_rank"], atol=1e-4)
      assert r["shaped_tree"] == list(tree_lib.sequoia(ranks, 3, 2).parents)
  for r in records.values():
    assert r["speedup"] > 0 and 1.0 <= r["tokens_per_call"] <= 3.0
    assert 0.0 <= r["mean_draft_length"] <= (4.0 if "tree" in r else 2.0)  # tree:2,1: 4 nodes.
  lookup = [r for r in records.values() if r["drafter"] == "lookup"]
  assert all(r["draft_calls_per_call"] == 0 and r["draft_cost"] is None for r in lookup)
  assert all(r["draft_cost"] > 0 for r in records.values() if r["drafter"] == "model")
  summary = open(os.path.join(output, "summary.md")).read()
  assert "| task | mode | batch | drafter | schedule | proposal |" in summary
  assert "| tree:2,1 |" in summary


@pytest.mark.slow
@pytest.mark.extended  # Reduced in the suite: test_notebook_cells_are_python_and_import_what_exists
def test_notebook_runs_end_to_end(trained_workdir, monkeypatch):
  """notebooks/speculative_sampling.ipynb, every cell, on the CPU, on the micro pair."""
  import nbformat
  from nbclient import NotebookClient

  workdir, _ = trained_workdir
  monkeypatch.setenv("SPECSAMP_NOTEBOOK_VARIANT", "test")
  monkeypatch.setenv("SPECSAMP_NOTEBOOK_WORKDIR", workdir)
  monkeypatch.setenv("XLA_FLAGS", xla_flags(1))  # The kernel on one device, as run_script.
  notebooks = os.path.join(ROOT, "notebooks")
  notebook = nbformat.read(os.path.join(notebooks, "speculative_sampling.ipynb"), as_version=4)
  NotebookClient(
    notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": notebooks}}
  ).execute()
  outputs = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs]
  text = "".join(out.get("text", "") for out in outputs)
  for needle in (
    "on cpu",
    "min(1, p/q)",
    "tokens for one target call",
    "speedup:",
    "tokens per target call",
  ):
    assert needle in text, needle
  assert any("image/png" in out.get("data", {}) for out in outputs)  # the figure


@pytest.mark.slow
@pytest.mark.extended  # Reduced in the suite: tests/test_cli.py's two processes joining one mesh.
def test_multi_host_sampling_equals_one_process(trained_workdir, tmp_path):
  """2 processes x 4 CPU devices (jax.distributed over gloo), batch 8 sharded over 'data':
  the sample job and its statistics run on every host, and the tokens equal a one-process
  8-device run's."""
  import json

  workdir, _ = trained_workdir
  flags = [
    "--config=configs/code_pair.py:test",
    f"--workdir={workdir}",
    "--config.mesh.data=8",
    "--config.sampling.num_prompts=8",
    "--config.sampling.batch_size=8",
    "--config.sampling.max_new_tokens=12",
  ]
  single = run_script("sample.py", *flags, f"--output={tmp_path / 'single.json'}")
  assert single.returncode == 0, single.stderr[-3000:]
  workers = start_two_processes(
    "sample.py", *flags, f"--output={tmp_path / 'multi.json'}", devices=4
  )
  results = finish(workers, timeout=300)
  for worker, (out, err) in zip(workers, results):
    assert worker.returncode == 0, err[-3000:]
    assert "of 8 devices" in out and "tokens/target call:" in out
  one, two = (json.loads((tmp_path / name).read_text()) for name in ("single.json", "multi.json"))
  assert two["tokens"] == one["tokens"]  # Generated ids of both samplers, every prompt.
  assert len(two["tokens"]["speculative"]) == 8
  assert two["stats"] == one["stats"]


@pytest.mark.slow
def test_help_lists_every_config_field_and_the_shared_flags():
  missing = run_script("sample.py", "--config=configs/no_such_pair.py")
  assert missing.returncode == 2 and missing.stderr.strip().splitlines() == [
    "error: --config=configs/no_such_pair.py: [Errno 2] No such file or directory: "
    "'configs/no_such_pair.py'"
  ]
  result = run_script("sample.py", "--help")  # absl's --help exits with status 1.
  out = " ".join(result.stdout.split())  # absl wraps long lines.
  for needle in (
    "--config.sampling.top_p=1.0 Nucleus mass, in (0, 1].",
    "--config.speculative.num_draft_tokens=8 K, draft tokens per target call",
    "--config.sampling.seed=0",
    "--config.resume_from='latest'",
    "--prompt:",
    "--humaneval",
    "--distributed:",
    "--resume:",
  ):
    assert needle in out, needle


@pytest.mark.slow
def test_a_corrupt_latest_step_is_one_line_and_latest_intact_reads_the_previous(
  trained_workdir, tmp_path
):
  workdir, _ = trained_workdir
  copy = tmp_path / "copy"
  shutil.copytree(workdir, copy)
  latest = max(int(step) for step in os.listdir(copy / "target"))
  for root, _, names in os.walk(copy / "target" / str(latest) / "params"):
    for name in names:
      if os.path.getsize(os.path.join(root, name)) > 100:
        os.truncate(os.path.join(root, name), 20)  # A copy cut short.
  result = run_script("sample.py", "--config=configs/code_pair.py:test", f"--workdir={copy}")
  assert result.returncode == 2
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1, result.stderr[-3000:]  # No traceback, no echo from orbax's threads.
  assert f"checkpoint step {latest}" in lines[0] and "TensorStore details" not in lines[0]
  assert "--resume=latest_intact" in lines[0] and "nothing was deleted" in lines[0]
  assert str(latest) in os.listdir(copy / "target")  # nothing moved without being asked


def _test_pair_config():
  sys.path.insert(0, os.path.join(ROOT, "configs"))
  import code_pair

  return code_pair.get_config("test")


@pytest.mark.slow
def test_sampling_and_prompt_seeds_are_separate_from_training(trained_workdir):
  """sampling.seed changes the draws, not the prompts; prompt_seed changes the held-out
  prompts; neither retrains (config.seed is the training seed)."""
  from specsamp.experiments.jobs import pair as pair_lib
  from specsamp.experiments.jobs import sample_job

  workdir, _ = trained_workdir
  logs = []
  reports = {}
  for seed in (0, 1):
    config = _test_pair_config()
    config.sampling.seed = seed
    reports[seed] = sample_job.run(config, workdir, log=logs.append)
  assert reports[0].prompts == reports[1].prompts
  assert reports[0].tokens["speculative"] != reports[1].tokens["speculative"]
  assert reports[1].settings["seed"] == 1 and reports[1].settings["prompt_seed"] == 0
  config = _test_pair_config()
  config.sampling.prompt_seed = 1
  other = pair_lib.prepare(config, workdir, log=logs.append)
  assert other.prompts.tolist() != reports[0].prompts
  assert not any("training" in line for line in logs), logs


@pytest.mark.slow
@pytest.mark.parametrize(  # Self-speculation's case is the extended command's (test_drafters.py).
  "name", ["lookup:2", pytest.param("self:1", marks=pytest.mark.extended)]
)
def test_the_main_job_samples_with_drafters_that_need_no_draft_model(
  trained_workdir, tmp_path, name
):
  """--config.speculative.drafter=lookup:N / self:L: nothing trained or loaded for a draft
  (a workdir without one is enough), K chosen automatically, greedy output equal to the
  autoregressive loop's, and the report names the drafter."""
  from specsamp.experiments.jobs import sample_job

  workdir, _ = trained_workdir
  copy = tmp_path / "copy"
  shutil.copytree(workdir, copy, ignore=shutil.ignore_patterns("draft_*"))
  config = _test_pair_config()
  config.speculative.drafter = name
  config.speculative.draft_length = "auto"
  config.sampling.temperature = 0.0
  logs = []
  report = sample_job.run(config, str(copy), log=logs.append)
  assert not any("draft" in line and ("training" in line or "loaded" in line) for line in logs)
  assert not any(path.startswith("draft_") for path in os.listdir(copy)), os.listdir(copy)
  assert report.tokens["speculative"] == report.tokens["autoregressive"]
  assert report.settings["drafter"] == name
  assert report.choice is not None and report.choice["largest"] == 4
  if name.startswith("lookup"):
    assert report.costs.draft_step_s == 0.0  # No model: nothing to time.
  else:
    assert report.costs.draft_step_s > 0.0


@pytest.mark.slow
def test_when_no_k_pays_the_job_times_the_autoregressive_loop_once(
  trained_workdir, tmp_path, monkeypatch
):
  """The automatic draft length chose K=0: the speculative job is the autoregressive loop, so it
  is timed once (not twice, timing the noise), and the loops the probes ran on the prompts'
  one shape get no warm-up call again."""
  from specsamp.experiments.benchmarks import timing
  from specsamp.experiments.jobs import sample_job
  from specsamp.sampling import draft_length

  calls = []
  interleaved = timing.time_interleaved

  def spy(samplers, inputs, *args, **kwargs):
    calls.append((list(samplers), set(kwargs.get("warm", ()))))
    return interleaved(samplers, inputs, *args, **kwargs)

  monkeypatch.setattr(timing, "time_interleaved", spy)
  monkeypatch.setattr(draft_length, "choose", lambda predicted, min_speedup: 0)
  config = _test_pair_config()
  config.speculative.drafter = "lookup:2"
  config.speculative.draft_length = "auto"
  # Greedy, as the lookup:2 main-job test before it: the probes' loops are compiled once.
  config.sampling.temperature = 0.0
  report = sample_job.run(config, trained_workdir[0], log=lambda line: None)
  probe, timed = calls
  assert probe == (["autoregressive", 2, 4], set())  # The probes: K_max = 4 and half of it.
  assert timed == (["autoregressive"], {"autoregressive"})
  assert report.speculative.seconds == report.autoregressive.seconds
  assert report.tokens["speculative"] == report.tokens["autoregressive"]
  assert report.speedup == 1.0 and "timed once" in sample_job.format_report(report)


@pytest.mark.slow
@pytest.mark.parametrize(  # The suite: the parallel draft; the two heads are extended.
  "name, stage, needle",
  [
    ("parallel", "draft_parallel", "parallel distillation): "),
    pytest.param(
      "parallel_seq", "sequential_head", "sequential head: ", marks=pytest.mark.extended
    ),
    pytest.param(
      "parallel_head",
      "feature_head_parallel",
      "parallel feature head: ",
      marks=pytest.mark.extended,
    ),
  ],
)
def test_the_main_job_trains_each_parallel_drafter_once_and_drafts_from_one_call(
  trained_workdir, tmp_path, name, stage, needle
):
  """--config.speculative.drafter=parallel / parallel_seq / parallel_head: the first run trains
  the parallel draft (draft_parallel/), its sequential head (sequential_head/, over a parallel
  draft trained first) or the parallel feature head (feature_head_parallel/), the next loads it
  (the pair the job prepares); one draft call per iteration; greedy output equals the
  autoregressive loop's."""
  from specsamp.experiments.jobs import drafter_specs, sample_job

  workdir, _ = trained_workdir
  copy = tmp_path / "copy"
  shutil.copytree(workdir, copy)
  config = _test_pair_config()
  config.speculative.drafter = name
  config.sampling.temperature = 0.0
  if name == "parallel_head":  # At most the positions its training unrolls (refused past).
    config.speculative.num_draft_tokens = config.feature.train.ttt_steps
  logs = []
  report = sample_job.run(config, str(copy), log=logs.append)
  assert any(needle + "training" in line for line in logs), (name, logs)
  assert stage in os.listdir(copy)
  spec = drafter_specs.parse(name)
  logs = []
  drafter_specs.prepare_pair(spec, config, str(copy), logs.append)  # What sample_job.run loads.
  assert not any(needle + "training" in line for line in logs), (name, logs)
  assert any(needle + "loaded" in line for line in logs), (name, logs)
  assert report.tokens["speculative"] == report.tokens["autoregressive"], name
  assert report.settings["drafter"] == name
  stats = report.stats
  assert stats["draft_calls"] == stats["target_calls"], (name, stats)  # one call each
  # The prediction charges that one call, 2K tokens wide, not K one-token steps.
  K = report.settings["num_draft_tokens"]
  assert report.draft_call["per_iteration"] == 1.0 and report.draft_call["tokens"] == 2 * K
  assert f"1.00 draft calls of {2 * K} tokens" in sample_job.format_report(report)


def test_drafter_names_parse_to_one_drafter_each_and_bad_ones_are_refused():
  from specsamp.experiments.jobs import drafter_specs

  assert drafter_specs.parse("lookup") == drafter_specs.DrafterSpec("lookup", 3)
  assert drafter_specs.parse("lookup:5") == drafter_specs.DrafterSpec("lookup", 5)
  assert drafter_specs.parse("self:2") == drafter_specs.DrafterSpec("self", 2)
  assert drafter_specs.parse("draft").needs_draft and not drafter_specs.parse("self:2").needs_draft
  assert drafter_specs.parse("feature").needs_feature_head
  parallel = drafter_specs.parse("parallel")
  assert parallel.needs_draft and parallel.draft_modes == ["parallel"]
  assert drafter_specs.parse("parallel_head").needs_parallel_head
  sequential = drafter_specs.parse("parallel_seq")
  assert sequential.needs_sequential_head and sequential.draft_modes == ["parallel"]
  for bad in ("self", "self:0", "lookup:0", "lookup:x", "draft:2", "parallel:4", "eagle"):
    with pytest.raises(ValueError, match="Unknown drafter"):
      drafter_specs.parse(bad)


@pytest.mark.slow
def test_an_empty_workdir_stage_trains_and_an_empty_checkpoint_is_an_error(
  trained_workdir, tmp_path
):
  """A workdir is a cache: an emptied target/ is trained again (and says so). A checkpoint
  named by the config (target.checkpoint) that is empty is a clear error."""
  from specsamp.experiments.jobs import pair as pair_lib
  from specsamp.training import checkpoint

  workdir, _ = trained_workdir
  copy = tmp_path / "copy"
  shutil.copytree(workdir, copy)
  shutil.rmtree(copy / "target")
  (copy / "target").mkdir()
  logs = []
  config = _test_pair_config()
  config.target.train.learning_rate *= 2  # Retrained otherwise: the same shape, other weights.
  pair_lib.prepare(config, str(copy), drafts=False, log=logs.append)
  assert any("holds no checkpoint; training from scratch" in line for line in logs), logs
  assert os.listdir(copy / "target")
  # The draft distilled from the old target is refused (loaded silently until 2026-11-30); the
  # one trained from scratch does not depend on the target.
  with pytest.raises(checkpoint.CheckpointError, match="draft_token was trained from another"):
    pair_lib.prepare(config, str(copy), draft_modes=["token"], log=logs.append)
  pair_lib.prepare(config, str(copy), draft_modes=["none"], log=logs.append)
  config = _test_pair_config()
  (tmp_path / "empty").mkdir()
  config.target.checkpoint = str(tmp_path / "empty")
  config.tokenizer.path = str(copy / "tokenizer.model")
  with pytest.raises(FileNotFoundError, match="holds no finished checkpoint"):
    pair_lib.prepare(config, str(copy), log=logs.append)


@pytest.mark.slow
def test_the_scripts_refuse_bad_input_before_preparing_the_pair(tmp_path):
  """A typo in --prompts, the plan or the optimisation settings, or answers not made yet, is
  one line at once, not after the target was trained or imported: the empty workdir stays
  empty. So are train.py's drafts, K and periods (a period of 0 was a ZeroDivisionError after
  training began; keeping 0 checkpoints deleted every saved step)."""
  workdir = tmp_path / "work"
  common = ["--config=configs/code_pair.py:test", f"--workdir={workdir}"]
  (tmp_path / "shipped").mkdir()
  (tmp_path / "shipped" / "CARD.md").write_text("an earlier drafter")
  for script, flag, message in (
    ("regenerate.py", f"--prompts={tmp_path / 'missing.jsonl'}", "--prompts: no file"),
    ("regenerate.py", "--settings=greedy,hot", "settings must be some of"),
    ("regenerate.py", "--width_step=0", "--width_step must be >= 1 token"),
    ("train_drafter.py", f"--ship_to={tmp_path / 'shipped'}", "is not empty; ship into a new"),
    ("train.py", "--drafts=tokn", "(distill.mode 'tokn'): distill.mode must be one of"),
    ("train.py", "--config.speculative.num_draft_tokens=0", "must be an int >= 1 (K)"),
    ("train.py", "--config.target.train.keep_checkpoints=0", "keep_checkpoints must be >= 1"),
    ("train_drafter.py", "--config.answers.train.warmup_steps=-1", "warmup_steps must be in"),
    ("train_drafter.py", "--config.answers.drafter=feature", "No regenerated train answers"),
  ):
    result = run_script(script, *common, flag)
    assert result.returncode != 0 and message in result.stderr, result.stderr[-2000:]
    assert not workdir.exists()
  # A certificate of no case printed ALL PASS; a bad count or level, or an --output with no
  # folder, failed after the draws (hours at the full scope).
  for flags_, message in (
    (["--scope=quick", "--mesh=2x4"], "--scope=quick has no case with --model=all and --mesh=2x4"),
    (["--num_samples=0"], "--num_samples must be >= 1"),
    ([f"--output={tmp_path / 'missing' / 'cert.md'}"], "to write it in (the shell does not"),
  ):
    result = run_script("certify.py", *flags_)
    assert result.returncode == 2 and message in result.stderr, result.stderr[-2000:]


@pytest.mark.slow
def test_ctrl_c_during_training_saves_and_exits_cleanly(trained_workdir, tmp_path):
  import signal

  workdir, _ = trained_workdir
  copy = tmp_path / "copy"
  shutil.copytree(workdir, copy)
  shutil.rmtree(copy / "target")
  env = script_env(1)
  process = subprocess.Popen(
    [sys.executable, "-u", os.path.join(ROOT, "scripts", "train.py"),
     "--config=configs/code_pair.py:test", f"--workdir={copy}",
     "--config.target.train.steps=100000", "--config.target.train.log_every=1"],
    cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
  )  # fmt: skip
  for line in process.stdout:
    if "target step" in line:
      break
  process.send_signal(signal.SIGINT)
  stdout, stderr = process.communicate(timeout=120)
  assert process.returncode == 130, stderr[-3000:]
  assert "interrupted at step" in stdout and (
    "saving a checkpoint" in stdout or "is saved" in stdout
  )
  assert stderr.strip().splitlines()[-1] == "interrupted." and "Traceback" not in stderr
  assert os.listdir(copy / "target")  # the step it reached was saved


@pytest.mark.slow
@pytest.mark.extended  # Reduced in the suite: test_cli.py's two processes (RaisedAnywhere).
def test_ctrl_c_on_one_host_stops_every_host_at_the_same_step(trained_workdir, tmp_path):
  """2 processes x 2 CPU devices train the target (jax.distributed over gloo); a Ctrl-C reaches
  process 1 only. Both stop before the same step, save it together and exit with 130: one host
  stopping alone would save (a collective) while the other steps."""
  workdir, _ = trained_workdir
  copy = tmp_path / "copy"
  shutil.copytree(workdir, copy)
  shutil.rmtree(copy / "target")
  workers = start_two_processes(
    "train.py", "--config=configs/code_pair.py:test", f"--workdir={copy}",
    "--config.mesh.data=4", "--config.target.train.steps=100000",
    "--config.target.train.log_every=1", devices=2,
  )  # fmt: skip
  # Without the agreement the hosts hang (process 1 in the save, process 0 in its next step).
  try:
    seen = interrupt_when(workers[1], "target step")
  finally:
    results = finish(workers)
  steps = []
  for worker, (out, err), before in zip(workers, results, ("", seen)):
    assert worker.returncode == 130, err[-3000:]
    found = re.findall(r"target: interrupted at step (\d+)", before + out)
    assert len(found) == 1, out[-2000:]
    steps.append(int(found[0]))
  assert steps[0] == steps[1], steps
  from specsamp.training import checkpoint

  assert checkpoint.Checkpoints(str(copy / "target")).latest_step() == steps[0]


@pytest.mark.slow
@pytest.mark.extended  # Reduced in the suite: tests/test_benchmark_trees.py, in process.
def test_tree_benchmark_times_every_setting_resumes_and_prints_the_tables(
  trained_workdir, tmp_path
):
  """scripts/benchmark_trees.py on the micro pair (resuming is benchmark.Store's, tested with
  scripts/benchmark.py above)."""
  workdir, _ = trained_workdir
  output = str(tmp_path / "trees")
  args = [
    "--config=configs/benchmark_trees.py:test",
    f"--workdir={workdir}",
    f"--config.output_dir={output}",
  ]
  result = run_script("benchmark_trees.py", *args)
  assert result.returncode == 0, result.stderr[-3000:]
  records = json.load(open(os.path.join(output, "results.json")))["records"]
  assert set(records) == {
    "sample/autoregressive/-",
    "sample/chain:2/block",
    "sample/tree:2,1/traversal",
  }
  for r in records.values():
    assert r["ms_per_token"] > 0 and r["tokens_per_s"] > 0 and r["speedup"] > 0
    assert 1.0 <= r["tokens_per_call"] <= 3.0  # At most D=2 drafts and the bonus token.
    if r["proposal"] == "autoregressive":
      assert r["tokens_per_call"] == 1.0  # One token per target call, by construction.
    assert r["target_step_ms"] > 0
    if r["proposal"] != "autoregressive":
      assert 0.0 <= r["alpha"] <= 1.0 and r["score_ms"] > 0 and r["draft_step_ms"] > 0
      assert 0 < r["nodes_per_call"] <= r["nodes"] and 0 < r["draft_calls_per_iteration"] <= 2
      assert r["vs_block"] > 0
  assert records["sample/tree:2,1/traversal"]["nodes"] == 4
  assert records["sample/chain:2/block"]["vs_block"] == 1.0
  for needle in (
    "| proposal | verifier | nodes | ms_per_token |",
    "| tree:2,1 | traversal | 4 |",
    "Predicted on 16 TPU v4 chips",
    "| proposal | verifier | nodes | tokens_per_call | score_ms |",
  ):
    assert needle in result.stdout, needle
  assert "| proposal |" in open(os.path.join(output, "summary.md")).read()


@pytest.mark.slow
@pytest.mark.extended  # Reduced in the suite: the regenerate-and-train test below trains a head,
# ships it and loads it in the main job (greedy equal to autoregressive); test_calibration.py
# fits the rank temperature '@fit' asks for.
def test_the_feature_head_trains_once_and_samples_exactly_greedy(trained_workdir, tmp_path):
  """speculative.drafter='feature': the head trains on the cached target on the first run
  (into its own stage, the target untouched), loads on the next (growing a dynamic tree of
  greedy proposals at its fitted rank temperature), and greedy speculative equals
  autoregressive."""
  from specsamp.experiments.jobs import sample_job

  workdir = str(tmp_path / "work")
  shutil.copytree(trained_workdir[0], workdir)
  # The notebook's head iteration may have trained a head in the shared workdir already.
  shutil.rmtree(os.path.join(workdir, "feature_head"), ignore_errors=True)
  logs = []
  reports = []
  for run in range(2):
    config = _test_pair_config()
    config.speculative.drafter = "feature"
    config.speculative.draft_length = "fixed"
    config.sampling.temperature = 0.0
    if run:  # The loaded head grows a dynamic tree, ranked at its fitted temperature.
      config.speculative.tree = "dynamic:2,1@fit"
      config.speculative.num_draft_tokens = 2
      config.speculative.proposal = "greedy"
    reports.append(sample_job.run(config, workdir, log=logs.append))
  text = "\n".join(logs)
  assert text.count("feature head: training on target layers") == 1, text
  assert "feature head: loaded step 8" in text
  assert "target: loaded step" in text and "target: training" not in text
  assert "fitted on validation windows" in text
  assert 0 < reports[1].settings["rank_temperature"] and "rank temperature" in text
  for report in reports:
    assert report.tokens["speculative"] == report.tokens["autoregressive"]
    assert report.stats["tokens_per_target_call"] > 1.0
  config = _test_pair_config()
  config.speculative.drafter = "feature"
  config.speculative.tree = "chains:2x2"
  config.speculative.num_draft_tokens = 2
  config.speculative.proposal = "greedy"  # i.i.d. siblings cannot be chosen greedily.
  with pytest.raises(ValueError, match="speculative.proposal='greedy'"):
    sample_job.check_settings(config)


@pytest.mark.slow
@pytest.mark.parametrize(
  "every_drafter",
  [False, pytest.param(True, marks=pytest.mark.extended)],  # The suite: the draft and the head.
)
def test_regenerate_and_train_drafter_keep_the_best_draft_by_tau(
  trained_workdir, tmp_path, every_drafter
):
  """scripts/regenerate.py has the micro target answer a user's JSONL prompts (no chat template:
  their text) into held-out greedy and training shards, resuming; scripts/train_drafter.py
  trains the draft on them, stops and resumes, reports tau at each evaluation and keeps the
  best; the feature head trains, ships and loads from its folder (a corrupted copy refused).
  ``every_drafter`` (the extended command): the parallel draft and the parallel head too, and
  the head's step timed online and from the store."""
  import json
  import shutil

  source, _ = trained_workdir
  workdir = str(tmp_path / "work")
  shutil.copytree(source, workdir)
  prompts = tmp_path / "prompts.jsonl"
  prompts.write_text(
    "".join(json.dumps({"prompt": f"def f{i}(x):\n    return x + {i}"}) + "\n" for i in range(240))
  )
  sizes = ["--batch_size=16", "--shard_prompts=64", "--max_new_tokens=24", "--max_prompt_tokens=64"]
  common = ["--config=configs/code_pair.py:test", f"--workdir={workdir}", f"--prompts={prompts}"]
  shipped = tmp_path / "shipped_answers"  # What --ship_to merges into (the repository's copy).
  held = run_script(
    "regenerate.py",
    *common,
    *sizes,
    "--split=held_out",
    "--settings=greedy",
    f"--ship_to={shipped / 'held_out'}",
  )
  assert held.returncode == 0, held.stderr[-3000:]
  assert "answer tokens" in held.stdout and "held_out split" in held.stdout
  if every_drafter:  # A run stopped after one shard (test_regenerate.py resumes one in process).
    first = run_script("regenerate.py", *common, *sizes, "--max_shards=1")
    assert first.returncode == 0 and "1 shards" in first.stdout, first.stderr[-3000:]
  rest = run_script("regenerate.py", *common, *sizes, f"--ship_to={shipped / 'train'}")
  assert rest.returncode == 0, rest.stderr[-3000:]
  manifest = json.load(open(os.path.join(workdir, "regenerated", "train", "manifest.json")))
  assert [s["setting"] for s in manifest["shards"]] == ["greedy", "nucleus", "greedy", "nucleus"]
  done = re.findall(r"regenerate: shard_\d+\.npz \(", rest.stdout)
  assert len(done) == (3 if every_drafter else 4)  # The first shard was not redone.
  assert json.load(open(shipped / "train" / "manifest.json"))["shards"] == manifest["shards"]
  # A fresh workdir trains on the shipped answers (config answers.shipped_dir).
  shutil.rmtree(os.path.join(workdir, "regenerated"))

  train_args = [
    "--config=configs/code_pair.py:test",
    f"--workdir={workdir}",
    f"--config.answers.shipped_dir={shipped}",
  ]
  stopped = run_script("train_drafter.py", *train_args, "--stop_after=2")
  assert stopped.returncode == 0, stopped.stderr[-3000:]
  assert f"4 shards from {shipped / 'train'}" in stopped.stdout
  assert json.load(open(os.path.join(workdir, "regenerated", "train", "manifest.json"))) == (
    json.load(open(shipped / "train" / "manifest.json"))
  )
  assert "tau(K=4)" in stopped.stdout and "(best)" in stopped.stdout
  best_json = os.path.join(workdir, "draft_answers", "best", "best.json")
  stopped_best = json.load(open(best_json))
  # The clock counts the time after the last evaluation too (the checkpoint at the stop).
  assert stopped_best["seconds_total"] > stopped_best["curve"][-1]["seconds"]
  resumed = run_script("train_drafter.py", *train_args)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "resuming from step 2" in resumed.stdout and "best: step" in resumed.stdout
  best = json.load(open(best_json))
  assert best["step"] in (2, 4) and 1.0 <= best["tau"] <= 5.0 and len(best["acc"]) == 4
  assert best["seconds_total"] > best["curve"][-1]["seconds"] > stopped_best["seconds_total"]
  from specsamp.training import checkpoint

  model, meta = checkpoint.load_model(os.path.join(workdir, "draft_answers", "best"))
  assert meta["step"] == best["step"] and model.config.num_layers == 1
  assert [point["step"] for point in best["curve"]] == [2, 4]  # The learning curve.
  # tau measured at another K does not compare with the best kept: refused, where the K = 2
  # evaluations could never beat the K = 4 bar and the card read "tau(K=2) 4.451".
  other_k = run_script("train_drafter.py", *train_args, "--config.answers.tau_draft_tokens=2")
  assert other_k.returncode != 0 and "does not compare" in other_k.stderr, other_k.stderr[-2000:]
  assert json.load(open(best_json)) == best

  def trained_and_shipped(drafter: str, kind: str) -> str:
    """``drafter`` trained on the answers and shipped (its card names ``kind``): the folder. A
    head reads the target's outputs stored once per row, built by the first head and reused."""
    folder = str(tmp_path / f"shipped_{drafter}")
    run = run_script(
      "train_drafter.py", *train_args, f"--config.answers.drafter={drafter}", f"--ship_to={folder}"
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"{kind} (answers)" in run.stdout and "tau(K=4)" in run.stdout
    assert f"shipped to {folder}" in run.stdout
    assert f"# A {kind} trained" in open(os.path.join(folder, "CARD.md")).read()
    built = "target outputs:" in run.stdout and "tokens to compute" in run.stdout
    assert built == (drafter == "feature"), run.stdout  # The parallel head reuses the store.
    # A head is measured beside prompt lookup, alone and as feature+lookup.
    beside = "prompt lookup alone" in run.stdout and "feature+lookup" in run.stdout
    assert beside == (drafter == "feature"), run.stdout
    return folder

  # The feature head on the same answers, shipped, then loaded by the main job from the folder
  # (verified first): greedy speculative equals autoregressive; a corrupted copy is refused.
  folder = trained_and_shipped("feature", "feature head")
  if every_drafter:  # The head's step timed with the target run at every step and from the store.
    timed = run_script(
      "benchmark_head_step.py", *train_args, "--repeats=1", f"--output={tmp_path / 'step.json'}"
    )
    assert timed.returncode == 0, timed.stderr[-3000:]
    step = json.load(open(tmp_path / "step.json"))
    assert step["online_seconds"] > 0 and step["stored_seconds"] > 0 and step["store_rows"] > 0
    assert "stored / online" in timed.stdout
  bare = run_script("train_drafter.py", *train_args, "--ship_only")
  assert bare.returncode != 0 and "give --ship_to" in bare.stdout + bare.stderr
  untrained = run_script(  # No best to ship (a mistyped drafter): an error, not exit 0.
    "train_drafter.py",
    *train_args,
    "--config.answers.drafter=parallel_head",
    "--ship_only",
    f"--ship_to={tmp_path / 'nothing'}",
  )
  assert untrained.returncode != 0 and "nothing to ship" in untrained.stderr
  card = open(os.path.join(folder, "CARD.md")).read()
  head_best = json.load(open(os.path.join(workdir, "feature_head_answers", "best", "best.json")))
  assert f"**{head_best['tau']:.3f}**" in card and "answer tokens" in card
  assert f"**{head_best['tau_with_lookup']:.3f}**" in card  # feature+lookup's tau.
  # scripts/head_tau_by_context.py's measurement on the shipped head: read per sequence, the
  # rows train_drafter measured tau on give its best tau; read as whole rows, a tau of its own.
  from specsamp.experiments.benchmarks import head_context

  config = _test_pair_config()
  config.answers.shipped_dir = str(shipped)
  by_context = head_context.compare(config, workdir, folder, log=lambda line: None)
  assert by_context["K"] == 4 and by_context["rows"] > 0
  assert by_context["per_sequence"]["tau"] == pytest.approx(head_best["tau"], abs=1e-6)
  for read in ("per_sequence", "whole_rows"):
    assert 1.0 <= by_context[read]["tau"] <= 5.0 and len(by_context[read]["acc"]) == 4
  # Side by side in one tree, each position accepts the longer run: never fewer on average.
  beside = by_context["feature and lookup, one tree (beside)"]
  assert beside["tau"] >= by_context["feature+lookup"]["tau"] and 1.0 <= beside["loop"] <= 5.0
  # A fresh run from the shipped head (answers.init_from) measures it first, on the same rows:
  # step 0's tau is the shipped head's; it goes on training with the head's draft vocabulary.
  from specsamp.experiments.jobs import answer_training

  config.answers.drafter = "feature"
  config.answers.head_directory = "feature_head_more"
  config.answers.init_from = folder
  lines = []
  more = answer_training.train_on_answers(config, workdir, stop_after=1, log=lines.append)
  assert any(f"starting from the head in {folder}" in line for line in lines), lines
  assert more["curve"][0]["step"] == 0
  assert more["curve"][0]["tau"] == pytest.approx(by_context["per_sequence"]["tau"], abs=1e-6)
  # The checkpoints record what it started from (its parameters), the card where it lay.
  store = checkpoint.Checkpoints(os.path.join(workdir, "feature_head_more"))
  assert list(store.read_meta()["init_from"]) == ["parameters"]
  assert more["init_from"]["path"] == os.path.realpath(folder) and more["init_from"]["step"] is None
  resumed = []  # Resumed: no second step 0.
  answer_training.train_on_answers(config, workdir, stop_after=1, log=resumed.append)
  assert any("resuming from step 1" in line for line in resumed), resumed
  assert not any("starting from the head" in line for line in resumed), resumed
  inside = os.path.join(workdir, "feature_head_more", "best")
  config.answers.init_from = inside  # The run's own best, which a fresh run empties: refused.
  with pytest.raises(ValueError, match="inside this run's own directory"):
    answer_training.train_on_answers(config, workdir, stop_after=1, log=lines.append)
  config.answers.init_from = folder
  with pytest.raises(ValueError, match="holds a sequential head.*trains a parallel head"):
    answer_training.train_on_answers(
      config, workdir, drafter="parallel_head", stop_after=1, log=lines.append
    )
  config.answers.head_directory = "feature_head_other"
  config.feature.head.ffn_dim = 8  # Another head's shape: refused, naming the field.
  with pytest.raises(ValueError, match="is not a head of config.feature.head.*ffn_dim") as refused:
    answer_training.train_on_answers(config, workdir, stop_after=1, log=lines.append)
  # check_meta's advice (delete the directory) is cut: here the directory is the start.
  assert "delete this directory" not in str(refused.value)
  # A wider MLP than the start's grows it (feature_train.widen_mlp): step 0 measures what the
  # start measured, and the card says what it grew from.
  start_ffn = store.read_meta()["head"]["ffn_dim"]
  config.answers.head_directory = "feature_head_wider"
  config.feature.head.ffn_dim = 2 * start_ffn
  wider = answer_training.train_on_answers(config, workdir, stop_after=1, log=lines.append)
  assert wider["curve"][0]["tau"] == pytest.approx(more["curve"][0]["tau"], abs=1e-6)
  assert wider["init_from"]["widened_from_ffn_dim"] == start_ffn
  wide_store = checkpoint.Checkpoints(os.path.join(workdir, "feature_head_wider"))
  assert wide_store.read_meta()["head"]["ffn_dim"] == 2 * start_ffn
  config.feature.head.ffn_dim = 0
  config.answers.init_from = str(tmp_path / "no_head")
  with pytest.raises(FileNotFoundError, match="no_head"):
    answer_training.train_on_answers(config, workdir, stop_after=1, log=lines.append)
  config.answers.drafter = "draft"  # A draft has no head to start from: said, not ignored.
  with pytest.raises(ValueError, match="init_from starts a feature head"):
    answer_training.train_on_answers(config, workdir, stop_after=1, log=lines.append)
  from specsamp.experiments.jobs import sample_job

  def greedy_run(drafter: str, section: str, field: str, folder: str):
    """The main job with ``drafter`` loaded from ``folder``: greedy equals autoregressive."""
    config = _test_pair_config()
    config.speculative.drafter = drafter
    config[section][field] = folder
    config.sampling.temperature = 0.0
    logs = []
    report = sample_job.run(config, workdir, log=logs.append)
    assert report.tokens["speculative"] == report.tokens["autoregressive"]
    return config, logs

  config, logs = greedy_run("feature+lookup", "feature", "checkpoint", folder)
  assert any(f"feature head: loaded from {folder}" in line for line in logs), logs
  if every_drafter:  # The head alone (test_feature_drafter.py's greedy identity in the suite).
    greedy_run("feature", "feature", "checkpoint", folder)
  flip_a_byte(largest_file(os.path.join(folder, "checkpoint")))
  with pytest.raises(ValueError, match="is corrupt"):
    sample_job.run(config, workdir, log=logs.append)
  if not every_drafter:
    return

  # The parallel draft on the same answers, shipped, then drafting K tokens from one call in
  # the main job, loaded from the folder: greedy speculative equals autoregressive.
  folder = trained_and_shipped("parallel", "parallel draft")
  config, logs = greedy_run("parallel", "draft", "parallel_checkpoint", folder)
  assert any(f"parallel draft: loaded 1 layers x 64 from {folder}" in line for line in logs), logs
  # Refused before sampling: another placeholder than it was trained with. A draft that records
  # none (here a chain draft) is loaded with a warning that it cannot be checked.
  trained_with = config.draft.train.distill.mask_token
  config.draft.train.distill.mask_token = trained_with + 1
  with pytest.raises(ValueError, match=f"trained with placeholder token {trained_with}, but"):
    sample_job.run(config, workdir, log=logs.append)
  config.draft.train.distill.mask_token = trained_with
  from specsamp.experiments.jobs import pair as pair_lib

  config.draft.parallel_checkpoint = os.path.join(workdir, "draft_answers", "best")
  logs = []
  pair_lib.prepare(config, workdir, drafts=True, draft_modes=["parallel"], log=logs.append)
  assert any("records no placeholder token" in line for line in logs), logs

  # The feature head as a parallel head on the same answers, shipped with its target, drafting
  # K tokens from one call in the main job: greedy speculative equals autoregressive.
  folder = trained_and_shipped("parallel_head", "parallel feature head")
  _, logs = greedy_run("parallel_head", "feature", "parallel_checkpoint", folder)
  assert any(f"parallel feature head: loaded from {folder}" in line for line in logs), logs


@pytest.mark.slow
@pytest.mark.extended  # Reduced in the suite: test_regenerate.py (one process), test_cli.py.
@pytest.mark.parametrize("interrupted", [False, True])
def test_multi_host_regeneration_writes_what_one_process_writes(
  trained_workdir, tmp_path, interrupted
):
  """2 processes x 2 CPU devices answer a user's JSONL prompts into one shared directory
  (jax.distributed over gloo): the same shard files as a one-process run's, greedy answers
  equal token for token, and no partial file left. ``interrupted``: a Ctrl-C reaches process 1
  after its first shard; both begin no new shard, write the ones begun and exit with 130, and a
  second run on both answers the rest."""
  import json

  workdir, _ = trained_workdir
  prompts = tmp_path / "prompts.jsonl"
  prompts.write_text(
    "".join(json.dumps({"prompt": f"def g{i}(x):\n    return x * {i}"}) + "\n" for i in range(40))
  )
  flags = [
    "--config=configs/code_pair.py:test", f"--workdir={workdir}", f"--prompts={prompts}",
    "--batch_size=4", "--shard_prompts=4", "--max_new_tokens=12", "--max_prompt_tokens=64",
    "--settings=greedy", "--config.mesh.data=4",
  ]  # fmt: skip
  single = run_script("regenerate.py", *flags, f"--out={tmp_path / 'one'}", devices=4)
  assert single.returncode == 0, single.stderr[-3000:]
  two = [*flags, f"--out={tmp_path / 'two'}"]
  if interrupted:
    workers = start_two_processes("regenerate.py", *two, devices=2)
    try:
      interrupt_when(workers[1], "regenerate: shard_00000.npz (")
    finally:
      results = finish(workers)
    for worker, (out, err) in zip(workers, results):
      assert worker.returncode == 130 and "interrupted." in err, err[-3000:]
      assert "stopping before shard_" in out, out[-2000:]
    stopped = json.load(open(tmp_path / "two" / "manifest.json"))["shards"]
    assert 1 <= len(stopped) < len(json.load(open(tmp_path / "one" / "manifest.json"))["shards"])
  workers = start_two_processes("regenerate.py", *two, devices=2)
  for worker, (_, err) in zip(workers, finish(workers)):
    assert worker.returncode == 0, err[-3000:]
  one, two = (json.load(open(tmp_path / d / "manifest.json")) for d in ("one", "two"))
  assert [s["file"] for s in two["shards"]] == [s["file"] for s in one["shards"]]
  assert not [name for name in os.listdir(tmp_path / "two") if "partial" in name]
  for shard in one["shards"]:
    with np.load(tmp_path / "one" / shard["file"]) as a:
      with np.load(tmp_path / "two" / shard["file"]) as b:
        np.testing.assert_array_equal(a["tokens"], b["tokens"])
