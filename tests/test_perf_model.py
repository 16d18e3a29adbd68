"""The analytic performance model: byte and FLOP counts, calibration, inversion, advice."""

import math

import numpy as np
import pytest
from conftest import tiny_config
from test_configs import load_config

from specsamp import sharding
from specsamp.experiments.benchmarks import perf_model, speedup
from specsamp.models import Transformer, TransformerConfig

CPU = perf_model.cpu_hardware(memory_bandwidth=20e9, peak_flops=100e9)


@pytest.mark.parametrize("family", ["chinchilla", "llama", "qwen2", "gemma"])
def test_parameter_counts_match_the_model(family):
  config = tiny_config(family)
  counts = perf_model.parameter_counts(config)
  total = (
    config.num_layers * (counts["matmul_per_layer"] + counts["small_per_layer"])
    + counts["embedding"]
    + counts["head"]
    + counts["final_norm"]
  )
  assert total == sharding.count_parameters(lambda rngs: Transformer(config, rngs=rngs))


@pytest.mark.parametrize("family", ["chinchilla", "llama"])
@pytest.mark.parametrize("draft_vocab_size", [0, 24])
def test_a_feature_head_costs_what_its_equivalent_config_reads(family, draft_vocab_size):
  """The head's matmul weights (fc, the 2D-wide q/k/v, o, the MLP, and the output head it
  reads: its own, or the target's shared one) are what the equivalent one-layer config's
  call charges, to within the rounding of the folded width (one MLP column)."""
  from specsamp.models import feature_head

  config = tiny_config(family)
  head = feature_head.create(
    feature_head.FeatureHeadConfig(feature_layers=(0, 1, 2), draft_vocab_size=draft_vocab_size),
    config,
  )
  matrices = [head.fc_FD, head.q_ENH, head.k_EKH, head.v_EKH, head.o_NHD]
  matrices += list(head.mlp.weights().values())
  read = sum(int(np.prod(m[...].shape)) for m in matrices)
  read += config.d_model * (draft_vocab_size or config.vocab_size)  # The output head.
  equivalent = perf_model.feature_head_equivalent(config, 3, draft_vocab_size)
  counts = perf_model.parameter_counts(equivalent)
  charged = counts["matmul_per_layer"] + counts["head"]
  column = config.d_model * (3 if config.gated_mlp else 2)
  assert read <= charged < read + column


def test_call_cost_terms():
  config = TransformerConfig.from_config(load_config("chinchilla_70b").model)
  tpu = perf_model.PRESETS["tpu_v4"]
  one = perf_model.call_cost(config, tpu, perf_model.MeshShape(tensor=1), 1, 1, 1024)
  sixteen = perf_model.call_cost(config, tpu, perf_model.MeshShape(tensor=16), 1, 1, 1024)
  assert one.bound == "memory" and one.collectives_s == 0
  assert math.isclose(sixteen.weight_bytes * 16, one.weight_bytes)
  assert math.isclose(sixteen.kv_bytes * 16, one.kv_bytes)
  # 2 ring all-reduces of [1, 1, D] bf16 per layer and one all-gather of [1, 1, V] f32 logits;
  # at decode sizes that is mostly latency.
  ring = 15 / 16
  expected = (
    config.num_layers
    * 2
    * (tpu.collective_latency_s + 2 * ring * 8192 * 2 / tpu.interconnect_bandwidth)
    + tpu.collective_latency_s
    + ring * 32_000 * 4 / tpu.interconnect_bandwidth
  )
  assert math.isclose(sixteen.collectives_s, expected, rel_tol=1e-12)
  assert sixteen.collectives_s < 1.02 * (2 * config.num_layers + 1) * tpu.collective_latency_s
  # Weights are read once per call, however many tokens it scores; FLOPs grow with tokens.
  five = perf_model.call_cost(config, tpu, perf_model.MeshShape(tensor=16), 1, 5, 1024)
  assert five.memory_s < 1.001 * sixteen.memory_s and five.flops > 4.9 * sixteen.flops
  big_batch = perf_model.call_cost(config, tpu, perf_model.MeshShape(tensor=16), 512, 8, 1024)
  assert big_batch.bound == "compute"
  with pytest.raises(ValueError):
    perf_model.call_cost(config, tpu, perf_model.MeshShape(), 0, 1, 1024)
  for axis in ("data", "tensor", "expert"):  # A chip count below one is refused, not divided by.
    for chips in (0, -2):
      with pytest.raises(ValueError, match=f"{axis}={chips}"):
        perf_model.MeshShape(**{axis: chips})


def test_calibration_recovers_known_efficiencies():
  truth = perf_model.Efficiency(eta=0.62, tau_s=0.4e-3)
  observations = []
  for layers in (1, 4, 12):
    config = tiny_config(
      num_layers=layers, d_model=512, ffn_dim=2048, num_heads=8, num_kv_heads=8, head_dim=64
    )
    for batch, tokens in ((1, 1), (4, 5), (16, 9)):
      call = perf_model.call_cost(config, CPU, perf_model.MeshShape(), batch, tokens, 128)
      observations.append(
        perf_model.Observation(f"{layers}/{batch}/{tokens}", call, call.seconds(truth))
      )
  fit = perf_model.calibrate(observations)
  assert math.isclose(fit.efficiency.eta, truth.eta, rel_tol=1e-9)
  assert math.isclose(fit.efficiency.tau_s, truth.tau_s, rel_tol=1e-9)
  assert max(abs(e) for e in fit.relative_errors) < 1e-9
  with pytest.raises(ValueError, match="at least 2"):
    perf_model.calibrate(observations[:1])


@pytest.mark.parametrize("alpha", [0.3, 0.7, 0.95])
def test_implied_acceptance_inverts_the_speedup_formula(alpha):
  k, draft_ms, score_ms = 4, 1.8, 14.2
  ms = (k * draft_ms + score_ms) / speedup.expected_tokens_per_call(alpha, k)
  assert math.isclose(perf_model.implied_acceptance(ms, k, draft_ms, score_ms), alpha, abs_tol=1e-9)


def test_implied_acceptance_refuses_impossible_times():
  with pytest.raises(ValueError, match="outside"):
    perf_model.implied_acceptance(0.1, 4, 1.8, 14.1)  # Would need 100 tokens per call.


def test_recommend_picks_the_best_draft_and_k():
  target = tiny_config(
    num_layers=12, d_model=512, ffn_dim=2048, num_heads=8, num_kv_heads=8, head_dim=64
  )
  small = tiny_config(
    num_layers=1, d_model=512, ffn_dim=2048, num_heads=8, num_kv_heads=8, head_dim=64
  )
  eff = perf_model.Efficiency(eta=0.8, tau_s=1e-5)
  common = dict(batch_size=1, cache_length=128, max_num_draft_tokens=12)
  choices = perf_model.speedup_by_k(
    target, small, 0.9, CPU, perf_model.MeshShape(), eff, name="small", **common
  )
  best = perf_model.recommend(
    target,
    {"small": (small, 0.9), "target": (target, 1.0)},
    CPU,
    perf_model.MeshShape(),
    eff,
    **common,
  )
  assert best == max(
    choices, key=lambda c: c.predicted_speedup
  )  # The target as its own draft loses.
  assert 1 < best.num_draft_tokens < 12
  low = perf_model.recommend(
    target, {"small": (small, 0.05)}, CPU, perf_model.MeshShape(), eff, **common
  )
  assert low.num_draft_tokens == 1 and low.predicted_speedup < 1


def test_paper_check_fits_and_implies_ordered_acceptance():
  target = TransformerConfig.from_config(load_config("chinchilla_70b").model)
  draft = TransformerConfig.from_config(load_config("chinchilla_4b").model)
  check = perf_model.paper_check(target, draft)
  assert all(abs(row["error"]) < 1e-9 for row in check["fit"]["table"])
  assert 0.3 < check["fit"]["eta"] <= 1 and check["fit"]["tau_ms"] > 0
  assert 1 <= check["score_ratio"] < 1.1  # Memory-bound: 5 tokens cost about one.
  implied = check["implied"]
  alphas = [implied[t]["alpha"] for t in ("HumanEval nucleus", "XSum greedy", "XSum nucleus")]
  assert alphas == sorted(alphas, reverse=True) and 0.5 < alphas[-1] and alphas[0] < 1
  for task, values in implied.items():
    iteration = 4 * 1.8 + 14.1 * check["score_ratio"]
    assert math.isclose(
      iteration / values["tokens_per_call"], values["speculative_ms"], rel_tol=1e-6
    ), task


def test_the_automatic_draft_length_picks_the_best_predicted_k_or_none():
  from specsamp.experiments.benchmarks import speedup

  assert speedup.choose_draft_length({1: 1.3, 2: 1.6, 3: 1.6, 4: 1.2}) == 2  # Ties: smaller K.
  # Nothing predicted to pay by the margin: K = 0 (autoregressive).
  assert speedup.choose_draft_length({1: 1.04, 2: 0.9}) == 0
  assert speedup.choose_draft_length({1: 1.04}, min_speedup=1.0) == 1
  with pytest.raises(ValueError, match=">= 0"):
    speedup.choose_draft_length({-1: 2.0})


def _iterations_over_every_count(row_tokens, n_max: int) -> float:
  """The reference: the dynamic programming over every token count 0..N at every one of the N
  iterations (draft_length's until 2026-11-30, O(N^2 K) per row)."""
  all_done = np.ones(n_max + 1)
  for probs in row_tokens:
    tokens = np.zeros(n_max + 1)
    tokens[0] = 1.0
    done = [0.0]
    for _ in range(n_max):
      after = np.zeros(n_max + 1)
      after[n_max] = tokens[n_max]
      for j, p in enumerate(probs):
        if j + 1 < n_max:
          after[j + 1 : n_max] += p * tokens[: n_max - j - 1]
        after[n_max] += p * tokens[max(n_max - j - 1, 0) : n_max].sum()
      tokens = after
      done.append(tokens[n_max])
    all_done *= np.asarray(done)
  return float((1.0 - all_done[:-1]).sum())


def test_iterations_until_done_keeps_only_the_live_counts_and_loses_nothing():
  """The live window (the counts of non-negligible mass, each row until it is done) gives the
  whole-range dynamic programming's expectation: i.i.d. rows at the edges of alpha (0, 1, 1e-9,
  0.999) and measured histograms truncated to K, K = 0..8, N = 1..150, 1-5 rows."""
  from specsamp.sampling import draft_length

  rng = np.random.default_rng(0)
  for case in range(150):
    K, N, R = int(rng.integers(0, 9)), int(rng.integers(1, 151)), int(rng.integers(1, 6))
    if case % 3:
      alphas = rng.choice([0.0, 1.0, 1e-9, 0.999, rng.random(), rng.random()], size=R)
      rows = [draft_length.iteration_tokens(float(a), K) for a in alphas]
    else:
      rows = [
        draft_length.truncated(rng.integers(0, 5, size=K + 3) + np.eye(K + 3)[0], K)
        for _ in range(R)
      ]
    expected = _iterations_over_every_count(rows, N)
    got = draft_length.iterations_until_done(rows, N)
    assert got == pytest.approx(expected, rel=1e-12), (K, N, R)


def test_slowest_row_iterations_is_exact_at_the_edges_and_matches_simulation():
  from specsamp.experiments.benchmarks import speedup

  # alpha = 0: one token per iteration; alpha = 1: K + 1 per iteration, the last one capped.
  assert math.isclose(speedup.slowest_row_iterations([0.0], 4, 64), 64)
  assert math.isclose(speedup.slowest_row_iterations([1.0, 1.0], 4, 64), 13)
  assert math.isclose(speedup.slowest_row_iterations([1.0, 0.0], 4, 64), 64)
  # K + 1 >= N (the sample job allows K = N): one iteration can finish a row; it raised a
  # broadcast error before 2026-11-30, in the automatic K and the sweep's prediction.
  assert math.isclose(speedup.slowest_row_iterations([0.5], 2, 2), 1.5)
  assert math.isclose(speedup.slowest_row_iterations([1.0], 8, 8), 1.0)
  assert math.isclose(speedup.slowest_row_iterations([0.0], 8, 8), 8.0)
  assert speedup.predicted_batch_speedup([0.9], 8, 8, 1.0, 0.1, 1.2) > 1.0
  # One row, long output: N / (tokens per iteration), plus the overshoot of the last one.
  one = speedup.slowest_row_iterations([0.8], 4, 640)
  assert abs(one - 640 / speedup.expected_tokens_per_call(0.8, 4)) < 1.5
  # A Monte Carlo of the batched loop: rows advance by 1 + (accepted drafts) until all have N.
  rng = np.random.default_rng(0)
  alphas, k, n = [0.6, 0.8, 0.9, 0.7], 3, 40
  probs = speedup.iteration_tokens(0.0, k)
  assert probs.tolist() == [1.0, 0.0, 0.0, 0.0]
  num_runs = 20_000
  needed = []
  for alpha in alphas:  # Per run, the iterations until the cumulative tokens reach n.
    steps = 1 + rng.choice(k + 1, size=(num_runs, n), p=speedup.iteration_tokens(alpha, k))
    needed.append(np.argmax(np.cumsum(steps, axis=1) >= n, axis=1) + 1)
  runs = np.max(needed, axis=0)
  exact = speedup.slowest_row_iterations(alphas, k, n)
  assert abs(exact - np.mean(runs)) < 4 * np.std(runs) / np.sqrt(len(runs)), (exact, np.mean(runs))
  # More rows never need fewer iterations; the batched prediction at one row is the formula's
  # up to the last iteration's overshoot.
  assert speedup.slowest_row_iterations(alphas, k, n) > speedup.slowest_row_iterations([0.8], k, n)
  single = speedup.predicted_batch_speedup([0.8], 4, 640, 1.0, 0.05, 1.3)
  assert math.isclose(single, speedup.predicted_speedup(0.8, 4, 1.0, 0.05, 1.3), rel_tol=0.01)
  assert speedup.predicted_batch_speedup([0.8], 0, 64, 1.0, 0.05, 1.3) == 1.0


def test_the_cpu_report_gives_the_median_error_and_the_weights_alone():
  """``perf_report.cpu_report``: the median absolute error of the fit (it took the upper middle
  value of an even count), and ``weights_mb`` without the KV cache (it added the cache read)."""
  import dataclasses
  import statistics

  from specsamp.experiments.benchmarks import perf_report

  config = tiny_config()
  hardware = perf_model.cpu_hardware(20e9, 50e9)
  roofline = {}
  for i, (batch, tokens) in enumerate([(1, 1), (1, 4), (4, 1), (4, 4)]):
    call = perf_model.call_cost(config, hardware, perf_model.MeshShape(), batch, tokens, 64)
    roofline[f"target/{batch}/{tokens}"] = dict(
      model="target",
      config=dataclasses.asdict(config),
      batch_size=batch,
      num_tokens=tokens,
      cache_length=64,
      measured_ms=(0.05 + 0.02 * i * i) * (1 + tokens * batch / 8),
      memory_bandwidth=20e9,
      matmul_flops=50e9,
      bytes=call.weight_bytes + call.kv_bytes,
      weight_bytes=call.weight_bytes,
      floor_ms=call.memory_s * 1e3,
      fraction_of_floor=0.5,
      bound=call.bound,
    )
  machine = {"memory_bandwidth": 20e9, "matmul_flops": 50e9}
  results = {"machine": machine, "roofline": roofline, "records": {}}
  report = perf_report.cpu_report(results)
  errors = perf_model.calibrate(perf_report._observations(results, hardware)).relative_errors
  assert len(errors) == 4
  assert report["fit"]["median_abs_error"] == pytest.approx(statistics.median(map(abs, errors)))
  (floor,) = report["floor"]
  assert floor["weights_mb"] == pytest.approx(roofline["target/1/1"]["weight_bytes"] / 1e6)
  assert roofline["target/1/1"]["bytes"] > roofline["target/1/1"]["weight_bytes"]
