"""Benchmark plumbing without a trained pair: config checks, statistics, the store, timing and
plots."""

import json
import os

import numpy as np
import pytest
from test_configs import load_config

from specsamp.experiments.benchmarks import benchmark, plots, speedup, timing


def test_parse_list():
  assert benchmark.parse_list("1, 2,4", int) == [1, 2, 4]
  assert benchmark.parse_list((1, 2), int) == [1, 2]
  assert benchmark.parse_list("token") == ["token"]


@pytest.mark.parametrize(
  "field,value,message",
  [
    ("modes", "greedy,beam", "Unknown modes"),
    ("drafters", "tokn,synthetic", r"Unknown drafters \['tokn'\]"),
    ("num_draft_tokens", "0,2", "num_draft_tokens"),
    ("batch_sizes", "1,3", "divide the 2 prompts of prompt_source='held_out'; got 3"),
    ("verifiers", "token,tree", "verifiers"),
    ("synthetic_acceptance", 1.5, "synthetic_acceptance"),
    ("calls", 0, "calls"),
  ],
)
def test_bad_configs_are_refused(field, value, message):
  config = load_config("benchmark", "test")
  config[field] = value
  with pytest.raises(ValueError, match=message):
    benchmark.check_config(config)


def test_a_prompt_file_is_read_and_counted_before_the_machine_is_measured(tmp_path):
  """A missing prompt file, or a batch size that does not divide its prompts, failed only after
  the machine was measured and the pair prepared (the review of 2026-11-30)."""
  config = load_config("benchmark", "test")
  config.prompt_source = f"file:{tmp_path / 'nope.txt'}"
  with pytest.raises(FileNotFoundError, match="No prompt file at"):
    benchmark.check_config(config)
  (tmp_path / "three.txt").write_text("def fib(n):\nclass Stack:\nimport os\n")
  config.prompt_source, config.batch_sizes = f"file:{tmp_path / 'three.txt'}", "1,2"
  with pytest.raises(ValueError, match="divide the 3 prompts of prompt_source='file:.*; got 2"):
    benchmark.check_config(config)
  config.batch_sizes = "1,3"
  benchmark.check_config(config)


def test_tokens_per_call_standard_error():
  histogram = [3, 1, 0, 6]  # Accepted counts 0..3.
  values = np.repeat(np.arange(4), histogram).astype(float)
  expected = values.std(ddof=1) / np.sqrt(len(values))
  assert np.isclose(benchmark.tokens_per_call_se(histogram), expected)
  assert np.isnan(benchmark.tokens_per_call_se([1, 0]))


def test_store_resumes_and_refuses_another_setup(tmp_path):
  store = benchmark.Store(str(tmp_path), "abc", resume=True)
  store.data["records"]["x"] = {"mode": "greedy"}
  store.save()
  assert benchmark.Store(str(tmp_path), "abc", resume=True).data["records"] == {
    "x": {"mode": "greedy"}
  }
  assert benchmark.Store(str(tmp_path), "abc", resume=False).data["records"] == {}
  with pytest.raises(ValueError, match="another pair or prompt setup"):
    benchmark.Store(str(tmp_path), "other", resume=True)
  assert json.load(open(tmp_path / "results.json"))["records"]  # Nothing was lost.


def test_a_resumed_sweep_refuses_records_of_other_settings():
  """A setting that changes a record's numbers but not its key is in the fingerprint where a
  config sets it (a resumed sweep at another synthetic acceptance or chain verifier reported
  the stored records as its own, timing nothing); at the defaults the fingerprint is the one
  results stored before carry."""
  from specsamp.experiments.benchmarks import benchmark_drafters

  for module, name in ((benchmark, "benchmark"), (benchmark_drafters, "benchmark_drafters")):
    config = load_config(name)
    defaults = module.FINGERPRINT_UNLESS_DEFAULT
    assert all(config.get(field, value) == value for field, value in defaults.items())
    plain = benchmark.fingerprint(config)
    assert benchmark.fingerprint(config, unless_default=defaults) == plain
    for field, value in defaults.items():
      changed = load_config(name)
      other = "block" if value == "token" else not value if isinstance(value, bool) else value + 1
      with changed.unlocked():
        changed[field] = other
      assert benchmark.fingerprint(changed, unless_default=defaults) != plain, field


class _FakeOutput:
  def __init__(self, generated):
    self.num_generated = np.array(generated)


def test_time_sampler_counts_tokens_and_excludes_the_warm_up():
  seeds = []

  def sample(batch, seed):
    seeds.append(seed)
    return _FakeOutput([4] * len(batch))

  timed = timing.time_sampler("fake", sample, [np.zeros((2, 3)), np.ones((2, 3))], calls=3)
  assert seeds == [timing.WARMUP_INDEX, 0, 1, 2]  # Warm-up on its own seed, then one per call.
  assert len(timed.outputs) == 3 and timed.ms_per_token > 0 and timed.tokens_per_s > 0
  assert timed.tokens == [8, 8, 8] and timed.sequential_tokens == [4, 4, 4]


def _record(mode, drafter, verifier, k, batch=1):
  speedup = 1 + 0.1 * k
  return {
    "mode": mode,
    "temperature": 0.0 if mode == "greedy" else 1.0,
    "top_p": 1.0,
    "batch_size": batch,
    "drafter": drafter,
    "verifier": verifier,
    "num_draft_tokens": k,
    "speedup": speedup,
    "predicted_speedup": speedup * 1.1,
    "alpha": 0.8,
    "acceptance_at_position": [0.8 ** (t + 1) for t in range(k)],
    "ms_per_token": 1 / speedup,
    "ar_ms_per_token": 1.0,
  }


def test_plots_are_written(tmp_path):
  records = [
    _record(m, d, v, k)
    for m in ("greedy", "sample")
    for d, v in (("token", "token"), ("synthetic", "synthetic"))
    for k in (1, 2, 4)
  ]
  records += [_record("sample", "token", "block", k) for k in (1, 2, 4)]
  results = {"records": {str(i): r for i, r in enumerate(records)}}
  paths = plots.write_all(results, str(tmp_path))
  assert [os.path.basename(p) for p in paths] == [
    "speedup_vs_k.png",
    "acceptance_per_position.png",
    "ms_per_token.png",
  ]
  for path in paths:
    with open(path, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  assert plots.write_all({"records": {}}, str(tmp_path)) == []


def test_a_sweep_of_one_k_draws_its_predicted_point(tmp_path, monkeypatch):
  """One fixed K (the :test config, or '4,auto'): the predicted series is one point, which a
  bare dashed line drew as nothing while the legend promised it (2026-11-30's review)."""
  figures = []
  monkeypatch.setattr(plots.plt, "close", figures.append)
  plots.speedup_vs_k([_record("sample", "token", "token", 4)], 1, str(tmp_path / "one.png"))
  (axis,) = figures[0].axes
  predicted = [line for line in axis.get_lines() if line.get_linestyle() == "--"]
  assert len(predicted) == 1 and predicted[0].get_marker() not in (None, "", "None")
  assert list(predicted[0].get_ydata()) == [pytest.approx(1.4 * 1.1)]


def test_the_docs_figures_draw(tmp_path):
  """The tree and feature-head figures of docs/how_it_works.md are written as PNGs."""
  paths = [
    plots.tree_figure("tree:2,2,1", str(tmp_path / "tree.png"), accepted=(1, 4, 8)),
    plots.feature_head_figure(str(tmp_path / "head.png")),
  ]
  for path in paths:
    with open(path, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_timed_calls_only_see_input_shapes_the_warm_up_compiled():
  """Prompts of several padded lengths: every shape is warmed up (and compiled) before the
  first timed call, so no timed call compiles."""
  import jax.numpy as jnp

  calls = []

  def sample(prompts, index):
    calls.append((index, prompts.shape))
    return jnp.ones((1, 3), jnp.int32)

  inputs = [jnp.zeros((1, width), jnp.int32) for width in (40, 789, 40, 120)]
  timed = timing.time_interleaved({"a": sample}, inputs, count=lambda out: (3, 3))["a"]
  warmed = {shape for index, shape in calls if index == timing.WARMUP_INDEX}
  assert warmed == {(1, 40), (1, 789), (1, 120)}
  assert len(calls) == 3 + 4 and len(timed.seconds) == 4
  first_timed = next(i for i, (index, _) in enumerate(calls) if index != timing.WARMUP_INDEX)
  assert all(index != timing.WARMUP_INDEX for index, _ in calls[first_timed:])
  assert timing.input_shape(inputs[0]) == timing.input_shape(inputs[2])
  assert timing.input_shape(inputs[0]) != timing.input_shape(inputs[1])


def test_a_warm_sampler_is_not_warmed_up_again():
  """``warm`` names samplers already called on these shapes (the automatic draft length's
  probes): only the others get warm-up calls, and a warm one reports no compile time."""
  import jax.numpy as jnp

  calls = []

  def sampler(name):
    def sample(prompts, index):
      calls.append((name, index))
      return jnp.ones((1, 3), jnp.int32)

    return sample

  inputs = [jnp.zeros((1, 8), jnp.int32)] * 3
  timed = timing.time_interleaved(
    {"probed": sampler("probed"), "new": sampler("new")},
    inputs,
    count=lambda out: (3, 3),
    warm={"probed"},
  )
  assert [name for name, index in calls if index == timing.WARMUP_INDEX] == ["new"]
  assert [index for name, index in calls if name == "probed"] == [0, 1, 2]
  assert timed["probed"].compile_s == 0.0 and len(timed["new"].seconds) == 3


def test_a_timed_chain_is_as_long_as_its_calls_allow(monkeypatch, tiny_model):
  """``time_calls`` times chains that fit in CHAIN_SECONDS, 1 to 32 calls (a real model on a
  CPU: a chain of 32 made each measured cost take 17 s), or of ``num_calls`` when given; a
  one-call chain is the program that timed the first call, not warmed up again."""
  lengths = []
  chain = timing._chain

  def counted(graphdef, state, tokens_BT, cache, start, num_calls):
    lengths.append(num_calls)
    return chain(graphdef, state, tokens_BT, cache, start, num_calls)

  monkeypatch.setattr(timing, "_chain", counted)
  monkeypatch.setattr(timing, "CHAIN_SECONDS", 1e9)  # Every call is fast beside it.
  assert timing.time_calls(tiny_model, 1, 1, 16) > 0
  assert lengths == [1, 1] + [32] * 6  # Compile and time one; warm up and time 5 chains.
  lengths.clear()
  monkeypatch.setattr(timing, "CHAIN_SECONDS", 0.0)  # Every call is slow beside it.
  assert timing.time_calls(tiny_model, 1, 1, 16) > 0 and lengths == [1] * 7
  lengths.clear()
  assert timing.time_calls(tiny_model, 1, 1, 16, num_calls=5) > 0 and lengths == [5] * 6


def test_the_samplers_the_probes_warmed_are_named_only_when_every_batch_has_their_shape():
  """``sample_job._probed``: the probes ran the autoregressive loop and K in {2, 4} on the first
  batch; the speculative loop is warm only at a probed K, and nothing is when a batch has
  another shape or no probe ran (a timed call must never compile)."""
  from specsamp.experiments.jobs.sample_job import _probed

  probes = [{"num_draft_tokens": 2}, {"num_draft_tokens": 4}]
  same = [(np.zeros((1, 8), np.int32), np.ones(1, np.int32))] * 3
  both = {"autoregressive", "speculative"}
  assert _probed({"num_draft_tokens": 4, "probes": probes}, same) == both
  assert _probed({"num_draft_tokens": 3, "probes": probes}, same) == {"autoregressive"}
  assert _probed({"num_draft_tokens": 0, "probes": probes}, same) == {"autoregressive"}
  other = [*same, (np.zeros((1, 9), np.int32), np.ones(1, np.int32))]
  assert _probed({"num_draft_tokens": 4, "probes": probes}, other) == set()
  assert _probed(None, same) == set()


def test_the_paired_speedup_cancels_a_slow_moment_that_hits_both_calls():
  """A slow moment (3x) hit call 1 of both samplers and call 2 of the baseline only: the ratio
  of the medians reads 6x, the median of the call-by-call ratios the true 2x."""
  timed = lambda name, seconds: timing.Timed(name, seconds, [8] * 3, [8] * 3, 0.0, [])
  baseline = timed("autoregressive", [1.0, 3.0, 3.0])
  faster = timed("speculative", [0.5, 1.5, 0.5])
  assert faster.paired_speedup(baseline) == pytest.approx(2.0)  # 2, 2, 6: the median.
  assert baseline.ms_per_token / faster.ms_per_token == pytest.approx(6.0)


class _Calls:
  def __init__(self, target_calls):
    self.target_calls = np.int32(target_calls)


def test_an_iteration_is_a_calls_time_over_its_loop_iterations():
  """Not ms/token x tokens per call: at batch > 1 the loop runs until its slowest row is done,
  so that product is not one iteration's time (it was 1.3x too high at batch 8)."""
  timed = timing.Timed(
    "spec", [1.0, 3.0, 2.0], [80] * 3, [40] * 3, 0.0, [_Calls(11), _Calls(21), _Calls(11)]
  )
  assert benchmark.iteration_ms(timed) == pytest.approx(150.0)  # median of 100, 150, 200 ms


def test_the_sweeps_prediction_pays_the_slowest_rows_iterations():
  costs = speedup.StepCosts(1e-2, 1e-3, 1.2e-2, num_draft_tokens=4)
  one_row = costs.predicted_batch_speedup([0.8], 10_000)
  assert one_row == pytest.approx(costs.predicted_speedup(0.8), rel=1e-3)  # long rows: the formula
  # A row that never accepts sets the pace of the batch: N iterations of a K = 4 loop.
  assert costs.predicted_batch_speedup([0.8, 0.0], 64) == pytest.approx(1e-2 / (4e-3 + 1.2e-2))
  assert costs.predicted_batch_speedup([0.8] * 8, 64) < costs.predicted_batch_speedup([0.8], 64)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:num_draft_tokens=2 > max_new_tokens=1")
def test_the_automatic_k_is_autoregressive_when_the_probes_verify_no_draft(tiny_model):
  """max_new_tokens=1: the one new token comes from the prefill, so no probe verifies a draft.
  The choice printed 'alpha nan' (0 / 0) and took K=1 from the probes' timing noise; K <= N
  itself raised a broadcast error in the prediction (2026-11-30's review; tested in
  test_perf_model.py)."""
  import jax.numpy as jnp

  from specsamp.experiments.benchmarks import harness

  bench = _lookup_bench(tiny_model, cache_slots=16)
  batch = (jnp.array([[5, 6, 7, 5, 6, 7, 5, 6]], jnp.int32), jnp.array([8], jnp.int32))
  choice = bench.choose_draft_length("lookup", [batch], 2, probe_calls=1, max_new_tokens=1)
  assert choice["verified"] == 0 and choice["alpha"] == 0.0
  assert choice["num_draft_tokens"] == 0
  assert "the probes verified no draft" in harness.format_choice(choice)


@pytest.mark.slow
def test_the_automatic_k_probes_one_call_on_each_of_the_first_batches(tiny_model, monkeypatch):
  """The probes' calls run on the workload's first batches of the first one's shape, not on its
  first batch again and again (on SmolLM2 the first HumanEval prompt read 1.06-1.08x at T=0
  where the 8 read 1.27x), and the choice says how many batches it probed."""
  import statistics

  import jax.numpy as jnp

  from specsamp.experiments.benchmarks import harness

  bench = _lookup_bench(tiny_model, cache_slots=24)
  row = lambda *ids: (jnp.array([ids], jnp.int32), jnp.array([len(ids)], jnp.int32))
  batches = [row(5, 6, 7, 5, 6, 7, 5, 6), row(9, 8, 9, 8, 9, 8, 9, 8), row(3, 4, 3, 4, 3, 4, 3, 4)]
  batches.append((jnp.zeros((2, 8), jnp.int32), jnp.full((2,), 8, jnp.int32)))  # Another shape.
  seen, timed = [], []
  time_interleaved = timing.time_interleaved

  def spy(samplers, inputs, **kwargs):
    seen.append([int(tokens[0, 0]) for tokens, _ in inputs])
    timed.append(time_interleaved(samplers, inputs, **kwargs))
    return timed[-1]

  monkeypatch.setattr(timing, "time_interleaved", spy)
  choice = bench.choose_draft_length("lookup", batches, 2, probe_calls=4, max_new_tokens=4)
  assert seen == [[5, 9, 3]]  # Call i on batch i % 3: the three of the first one's shape.
  assert choice["probe_batches"] == 3
  assert "on the first 3 batches" in harness.format_choice(choice)
  # Ratios of means: each probe's measured speedup is the autoregressive loop's mean seconds
  # over its own, and its iterations the mean over its calls.
  (runs,) = timed
  ar = statistics.fmean(runs["autoregressive"].seconds)
  for probe in choice["probes"]:
    run = runs[probe["num_draft_tokens"]]
    assert len(run.seconds) == 4
    assert probe["measured"] == pytest.approx(ar / statistics.fmean(run.seconds))
    iterations = statistics.fmean(int(o.target_calls) - 1 for o in run.outputs)
    assert probe["iterations"] == pytest.approx(iterations)


def _lookup_bench(model, cache_slots: int):
  """A ``harness.Bench`` over ``model`` as the target with prompt lookup as its drafter: the
  automatic draft length's probes with no draft model to train."""
  import types

  from specsamp.experiments.benchmarks import harness
  from specsamp.sampling.drafters import PromptLookupDrafter

  pair = types.SimpleNamespace(
    target=model, drafts={}, mesh=None, tokenizer=types.SimpleNamespace(pad_id=0)
  )
  return harness.Bench(pair, cache_slots=cache_slots, drafters={"lookup": PromptLookupDrafter()})
