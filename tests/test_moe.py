"""The routed mixture-of-experts MLP (specsamp/models/moe.py): its two compute paths against a
float64 per-token reference, the sparse path reading only the selected experts, expert
parallelism on a mesh, and speculative sampling over an MoE target staying exact.
(Parity with transformers' Qwen3-MoE is in test_hf.py.)"""

import collections
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import EXACT_VOCAB, assert_follows, sampled_counts, tiny_config

from specsamp import sharding
from specsamp.experiments.benchmarks import perf_model
from specsamp.models import moe, transformer
from specsamp.models.layers import activation_fn
from specsamp.sampling import warping


def moe_config(**changes):
  fields = dict(
    family="llama", num_experts=6, experts_per_token=2, ffn_dim=16, normalize_expert_weights=True
  )
  fields.update(changes)
  return tiny_config(fields.pop("family"), **fields)


def reference(x_ND, weights, config):
  """Token by token in float64: softmax over the router's logits, the top k experts (their
  weights renormalised when asked), each a SwiGLU MLP."""
  w = {name: np.asarray(value, np.float64) for name, value in weights.items()}
  x = np.asarray(x_ND, np.float64)
  out = np.zeros_like(x)
  for n in range(x.shape[0]):
    logits = x[n] @ w["router_DE"]
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    top = np.argsort(-probs)[: config.experts_per_token]
    weights_k = probs[top] / (probs[top].sum() if config.normalize_expert_weights else 1.0)
    for e, weight in zip(top, weights_k):
      gate = x[n] @ w["gate_EDF"][e]
      hidden = gate / (1 + np.exp(-gate)) * (x[n] @ w["up_EDF"][e])
      out[n] += weight * (hidden @ w["down_EFD"][e])
  return out


@pytest.mark.parametrize("normalize", [True, False])
def test_sparse_and_dense_paths_equal_a_float64_reference(normalize):
  config = moe_config(normalize_expert_weights=normalize)
  mlp = transformer.create(config, seed=3).blocks.mlp
  weights = {name: param[...][1] for name, param in mlp.weights().items()}  # Layer 1's.
  x_BTD = jax.random.normal(jax.random.key(0), (3, 5, config.d_model))
  expected = reference(x_BTD.reshape(15, -1), weights, config).reshape(3, 5, -1)
  act = activation_fn(config)
  for compute in ("sparse", "dense"):
    out = jax.jit(lambda x, w, c=compute: moe.moe_forward(x, w, config, act, c))(x_BTD, weights)
    np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-6, err_msg=compute)


def test_an_expert_a_token_did_not_choose_never_reaches_its_output():
  """Experts no token of the call selected are poisoned with NaN: both paths' outputs stay
  exact (that the sparse loop does not even read them is test_hlo_bytes.py's, on a TPU's
  program). And one token's output does not depend on the experts only its batch mates chose:
  an expert that overflows (inf, as float16 can) on a token that did not choose it was weighed
  by 0, and 0 x inf made that token's output NaN (2026-11-30's review)."""
  config = moe_config()
  mlp = transformer.create(config, seed=3).blocks.mlp
  weights = {name: param[...][0] for name, param in mlp.weights().items()}
  x_ND = jax.random.normal(jax.random.key(1), (1, config.d_model))  # One token: k experts.
  _, selected_NE = moe.route(x_ND, weights["router_DE"], config)
  unused = ~np.asarray(selected_NE[0])
  assert unused.sum() == config.num_experts - config.experts_per_token
  poisoned = dict(weights)
  for name in ("gate_EDF", "up_EDF", "down_EFD"):
    poisoned[name] = jnp.where(unused[:, None, None], jnp.nan, weights[name])
  act = activation_fn(config)
  x_BTD = x_ND[None]
  clean = moe.moe_forward(x_BTD, weights, config, act, "sparse")
  sparse = moe.moe_forward(x_BTD, poisoned, config, act, "sparse")
  np.testing.assert_array_equal(sparse, clean)
  dense = moe.moe_forward(x_BTD, poisoned, config, act, "dense")
  np.testing.assert_allclose(dense, moe.moe_forward(x_BTD, weights, config, act, "dense"))
  # Two tokens: an expert only the second chose overflows everywhere.
  x_ND = jax.random.normal(jax.random.key(2), (40, config.d_model))
  _, selected_NE = moe.route(x_ND, weights["router_DE"], config)
  selected = np.asarray(selected_NE)
  pairs = [(i, e) for i in range(1, 40) for e in range(config.num_experts)]
  other, expert = next((i, e) for i, e in pairs if selected[i, e] and not selected[0, e])
  overflowing = dict(weights)
  overflowing["down_EFD"] = weights["down_EFD"].at[expert].set(jnp.inf)
  both = x_ND[jnp.array([0, other])][None]
  for compute in ("sparse", "dense"):
    alone = moe.moe_forward(x_ND[:1][None], overflowing, config, act, compute)[0, 0]
    together = moe.moe_forward(both, overflowing, config, act, compute)[0]
    assert np.isfinite(np.asarray(alone)).all(), compute
    np.testing.assert_allclose(together[0], alone, rtol=1e-5, atol=1e-6, err_msg=compute)
    assert not np.isfinite(np.asarray(together[1])).all()  # The token that chose it.


PROMPTS = np.array([[5, 9, 14, 5, 9, 7, 40], [8, 8, 31, 0, 0, 0, 0]])


@pytest.mark.slow
@pytest.mark.parametrize(  # jit's partitioner's case is the extended command's.
  "mode", [pytest.param("auto", marks=pytest.mark.extended), "shard_map"]
)
def test_expert_parallel_mesh_equals_one_device(mode):
  """Experts split 2 ways over the 'expert' axis (x tensor 2 x data 2 on 8 devices): the
  logits of the whole model equal one device's; 'auto' runs the dense path under jit's
  partitioner, 'shard_map' each device's sparse loop over its own experts and one psum."""
  config = moe_config(tensor_parallel=mode)
  single = transformer.create(config, seed=5)
  mesh = sharding.make_mesh({"data": 2, "expert": 2, "tensor": 2})
  sharded = transformer.create(config, mesh, seed=5)
  gate = sharded.blocks.mlp.gate_EDF[...]
  assert gate.sharding.spec[1] == "expert" and gate.addressable_shards[0].data.shape[1] == 3
  tokens = jnp.asarray(PROMPTS)
  expected, _ = single(tokens)
  with sharding.use_mesh(mesh):
    logits, _ = jax.jit(lambda model, t: model(t))(sharded, tokens)
  np.testing.assert_allclose(logits, expected, atol=5e-5, rtol=1e-5)


def test_shard_map_refuses_experts_on_a_batch_axis():
  """Each device would hold other rows and other experts, and the psum over that axis would
  add outputs of different rows together (logits off by 2.0, no error, before the check)."""
  config = moe_config(tensor_parallel="shard_map")
  with sharding.use_rules({"expert": "data"}):
    mesh = sharding.make_mesh({"data": 2, "tensor": 4})
    model = transformer.create(config, mesh, seed=5)
    with sharding.use_mesh(mesh), pytest.raises(ValueError, match="expert axis 'data' also"):
      model(jnp.asarray(PROMPTS))


@pytest.mark.slow
def test_speculative_sampling_over_an_moe_target_is_exact():
  """A target whose every layer routes among 4 experts (top 2) and a dense draft of the same
  vocabulary: the sampled continuations follow the target's exactly enumerated distribution.
  (A dense draft: the target's sparse path is what is certified, and an MoE draft compiled it
  a second time.)"""
  config = moe_config(
    vocab_size=EXACT_VOCAB, d_model=32, num_heads=4, num_kv_heads=2, num_experts=4
  )
  target = transformer.create(config, seed=10)
  dense = config.replace(num_experts=0, experts_per_token=0)
  draft = transformer.create(dense, seed=11)
  prompt = [1, 5, 2]
  counts, stats = sampled_counts(target, draft, prompt, num_draft_tokens=3, temperature=1.0)
  assert 0.05 < stats["acceptance_rate"] < 0.98, stats
  assert_follows(counts, target, prompt, warping.SamplingConfig(1.0))


@pytest.mark.slow
@pytest.mark.extended  # scripts/benchmark_moe.py's measurement: a benchmark's own check (the
# MoE target's exactness and its expert-parallel mesh stay in the suite).
def test_the_scoring_benchmark_counts_the_experts_each_call_selects():
  """scripts/benchmark_moe.py's measurement on a tiny MoE: a 1-token call selects exactly k
  experts per layer, a 5-token call between k and min(E, 5k); both paths time every call."""
  from specsamp.experiments.benchmarks import moe_scoring, perf_model

  config = moe_config(num_experts=8, experts_per_token=2)
  rows = moe_scoring.measure(config, [1, 5], prompt_tokens=4, rounds=1, reps=1)
  assert [(r["compute"], r["tokens"]) for r in rows] == [
    ("sparse", 1),
    ("sparse", 5),
    ("dense", 1),
    ("dense", 5),
  ]
  assert all(r["ms"] > 0 for r in rows)
  one, five = rows[0]["experts"], rows[1]["experts"]
  assert one == 2 and 2 <= five <= 8 and rows[3]["experts"] == five
  assert perf_model.expected_experts(config, 1) == 2
  assert perf_model.expected_experts(config, 5) == pytest.approx(8 * (1 - 0.75**5))
  # The model reads k experts for a step and more for a scoring call; a dense model reads the
  # same weights for both.
  hardware, mesh = perf_model.PRESETS["tpu_v5e"], perf_model.MeshShape()
  step, score = (perf_model.call_cost(config, hardware, mesh, 1, t, 64) for t in (1, 5))
  assert score.weight_bytes > step.weight_bytes
  dense = config.replace(num_experts=0, experts_per_token=0)
  step, score = (perf_model.call_cost(dense, hardware, mesh, 1, t, 64) for t in (1, 5))
  assert score.weight_bytes - step.weight_bytes == 4 * dense.d_model * 4  # The 4 more inputs.


def _busiest_chip_by_enumeration(experts: int, k: int, chips: int) -> float:
  """E[max over chips of the experts one token selects there]: every k-subset, equally likely."""
  per_chip = experts // chips
  total = 0
  subsets = list(itertools.combinations(range(experts), k))
  for subset in subsets:
    total += max(collections.Counter(e // per_chip for e in subset).values())
  return total / len(subsets)


def test_a_call_waits_for_the_chip_that_holds_the_most_selected_experts():
  """``perf_model.busiest_chip_experts``: one token's k experts land unevenly on the expert
  axis's chips, and the call waits for the chip holding the most (exact enumeration: 12 experts
  on 4 chips, 3 per token; and Qwen3-30B-A3B's 8 of 128 on 8 chips by the multivariate
  hypergeometric, 2.5297); more tokens select more, up to every expert of a chip; one chip is
  ``expected_experts``; ``call_cost`` reads the busiest chip's experts, not the mean."""
  small = moe_config(num_experts=12, experts_per_token=3)
  exact = _busiest_chip_by_enumeration(12, 3, 4)
  assert perf_model.busiest_chip_experts(small, 1, 4) == pytest.approx(exact, abs=0.02)
  assert exact > perf_model.expected_experts(small, 1) / 4
  qwen3 = moe_config(num_experts=128, experts_per_token=8)
  assert perf_model.busiest_chip_experts(qwen3, 1, 8) == pytest.approx(2.5297, abs=0.02)
  counts = [perf_model.busiest_chip_experts(qwen3, t, 8) for t in (1, 2, 5, 9, 400)]
  assert counts == sorted(counts) and counts[-1] == 16.0
  assert perf_model.busiest_chip_experts(qwen3, 5, 1) == perf_model.expected_experts(qwen3, 5)
  with pytest.raises(ValueError, match="do not split evenly"):
    perf_model.busiest_chip_experts(qwen3, 1, 3)
  hardware = perf_model.PRESETS["tpu_v5e"]
  call = perf_model.call_cost(small, hardware, perf_model.MeshShape(expert=4), 1, 1, 64)
  mean = perf_model.call_cost(small, hardware, perf_model.MeshShape(expert=1), 1, 1, 64)
  per_expert = perf_model.parameter_counts(small)["expert_per_layer"] * 4 * small.num_layers
  # One chip reads expected_experts(1) = 3 experts; the busiest of 4 reads `exact` of them.
  assert call.weight_bytes - (mean.weight_bytes - 3 * per_expert) == pytest.approx(
    exact * per_expert, rel=0.01
  )
