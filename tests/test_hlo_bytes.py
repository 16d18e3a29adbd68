"""The HBM byte count read from optimized HLO (experiments/proofs/hlo_bytes.py): exact on
CPU programs whose traffic is known, and on TPU programs compiled ahead of time (libtpu,
no TPU), where it finds the per-layer cache copy that slicing the kv head caused."""

import jax
import jax.numpy as jnp
import pytest

from specsamp.experiments.benchmarks import perf_model
from specsamp.experiments.proofs import aot, hlo_bytes
from specsamp.models import attention
from specsamp.models.config import TransformerConfig

aot.quiet_libtpu()

LAYERS, WIDTH = 4, 128


def _compiled(function, *arguments, donate=()) -> str:
  return jax.jit(function, donate_argnums=donate).lower(*arguments).compile().as_text()


def test_a_scan_reads_each_layer_of_a_stacked_weight_once():
  """A scan over 4 stacked [128, 128] float32 matrices: the weights are read exactly once in
  all (each trip slices its layer), whatever the CPU materialises on the way."""
  weights = jnp.ones((LAYERS, WIDTH, WIDTH), jnp.float32)
  x = jnp.ones((8, WIDTH), jnp.float32)

  def network(w, x):
    return jax.lax.scan(lambda h, layer: (jnp.tanh(h @ layer), None), x, w)[0]

  counted = hlo_bytes.count(_compiled(network, weights, x), min_bytes=WIDTH * WIDTH * 4)
  [weights_name, x_name] = sorted(counted.arguments, key=lambda k: -counted.arguments[k])
  assert counted.arguments[weights_name] == weights.nbytes
  assert counted.reads[weights_name] == weights.nbytes  # Not 4x: a layer per trip.
  assert counted.reads[x_name] == x.nbytes
  # Whatever a layer's slice costs on this backend is an intermediate run once per layer.
  for item in counted.materialised:
    assert item.bytes == WIDTH * WIDTH * 4 and item.times == LAYERS


def test_an_in_place_update_writes_only_its_slot():
  """A donated [4, 64, 128] cache, one row written per layer inside a scan: 4 rows written
  into it, not 4 caches; nothing cache-sized is materialised."""
  cache = jnp.zeros((LAYERS, 64, WIDTH), jnp.float32)
  row = jnp.ones((WIDTH,), jnp.float32)

  def write(cache, row):
    def body(c, layer):
      return jax.lax.dynamic_update_slice(c, (row * layer)[None, None], (layer, 3, 0)), None

    return jax.lax.scan(body, cache, jnp.arange(LAYERS))[0]

  counted = hlo_bytes.count(_compiled(write, cache, row, donate=(0,)), min_bytes=cache.nbytes)
  cache_name = max(counted.arguments, key=counted.arguments.get)
  assert counted.writes[cache_name] == LAYERS * WIDTH * 4
  assert counted.materialised == []


def test_the_parser_reads_memory_spaces_tuples_and_trip_counts():
  [array] = hlo_bytes.parse_type("bf16[80,1,2048,8,128]{4,3,2,1,0:T(8,128)(2,1)S(1)}")
  assert array.dims == (80, 1, 2048, 8, 128) and array.memory_space == 1 and not array.in_hbm
  assert array.bytes == 80 * 2048 * 8 * 128 * 2
  elements = hlo_bytes.parse_type("(s32[]{:T(128)}, /*index=1*/f32[4,8]{1,0}, pred[2])")
  assert [(a.dtype, a.dims) for a in elements] == [("s32", ()), ("f32", (4, 8)), ("pred", (2,))]
  line = (
    '  ROOT %w = (s32[], f32[4]) while(%init), condition=%cond, body=%body, metadata={op_name="x"}'
  )
  instruction = hlo_bytes.parse_instruction(line)
  assert instruction.root and instruction.opcode == "while" and instruction.operands == ["init"]
  assert instruction.attribute("body") == "body" and instruction.op_name == "x"


def _tiny_on_v4_8(axes: dict[str, int], **changes):
  """(config, mesh, abstract model): a 4-layer bfloat16 model in shard_map mode on the 4
  chips of a TPU v4-8, over the mesh ``axes`` (the rest 1)."""
  mesh = aot.make_mesh(
    aot.slice_devices("v4-8"), {"data": 1, "fsdp": 1, "expert": 1, "tensor": 1, **axes}
  )
  config = TransformerConfig(
    **{
      "vocab_size": 512,
      "num_layers": LAYERS,
      "d_model": 256,
      "num_heads": 4,
      "ffn_dim": 512,
      "param_dtype": "bfloat16",
      "dtype": "bfloat16",
      "tensor_parallel": "shard_map",
      **changes,
    }
  )
  return config, mesh, aot.abstract_model(config, mesh)


def _sliced_head_read(self, start, size):
  """``LayerCache.read`` as it was: the device's kv head taken by a dynamic slice along K."""

  def one(cache_LBSKH):
    _, batch, _, kv_heads, head_dim = cache_LBSKH.shape
    block = jax.lax.dynamic_slice(
      cache_LBSKH, (self.layer, 0, start, 0, 0), (1, batch, size, kv_heads, head_dim)
    )[0]
    return jax.lax.dynamic_slice_in_dim(block, self.kv_head, 1, axis=2)

  return one(self.keys), one(self.values)


def _tpu_call(tokens: int, sliced_head: bool, monkeypatch):
  """A tiny model on 4 TPU v4 chips, 2 kv heads under 4-way tensor parallelism (each chip
  keeps one kv head of the cache it reads), compiled for ``tokens`` per call."""
  if sliced_head:
    monkeypatch.setattr(attention.LayerCache, "read", _sliced_head_read)
  config, mesh, model = _tiny_on_v4_8(
    {"tensor": 4}, num_kv_heads=2, head_dim=128, attention_block_size=16
  )
  _, counted = aot.count_call_bytes(config, model, mesh, tokens, 64)
  return aot.call_bytes_row(counted)


def test_tpu_step_and_scoring_read_each_weight_once(monkeypatch):
  step, scoring = (_tpu_call(tokens, False, monkeypatch) for tokens in (1, 5))
  for row in (step, scoring):
    assert row["materialised"] == []
    assert row["weights_read_ratio"] == pytest.approx(1.0, abs=0.05)
    assert all(0.95 <= r <= 1.05 for r in row["per_weight_ratio"].values()), row
  table = "m.embedder.table_VD.value"
  assert step["gathered"] == [table]  # A lookup reads its row, not the table.
  # Scoring 5 tokens reads every other weight exactly as a step does. (The compiler may read
  # this tiny 64 KB table whole for 5 rows: it does here.)
  scored = {k: v for k, v in scoring["per_weight_ratio"].items() if k != table}
  assert scored == step["per_weight_ratio"]


def test_tpu_a_dynamic_slice_of_the_kv_head_copies_the_cache_in_every_layer(monkeypatch):
  """Negative control: with the kv head taken by a dynamic slice along K (as the attention
  did), the TPU compiler copies the whole stacked cache (keys and values) in each of the 4
  layers of a scoring call; the count finds it."""
  row = _tpu_call(5, True, monkeypatch)
  copies = [m for m in row["materialised"] if m["times"] == LAYERS]
  assert len(copies) == 2, row["materialised"]
  assert all(m["shape"].endswith("[4,64,2,128]") for m in copies)


def test_tpu_moe_step_reads_only_the_experts_it_selects():
  """A tiny mixture of experts, 8 experts (2 per token) split over 4 chips: a step's expert
  loop reads the selected experts of each chip's 2 (here 1: the peeled first one, since a
  step selects 2 of 8, half an expert per chip), straight from the stacked weights: no layer
  of experts is copied first."""
  config, mesh, model = _tiny_on_v4_8(
    {"expert": 4}, num_kv_heads=4, head_dim=64, num_experts=8, experts_per_token=2
  )
  _, counted = aot.count_call_bytes(config, model, mesh, 1, 64, experts_per_chip=0.5)
  row = aot.call_bytes_row(counted)
  assert row["materialised"] == []
  for name in ("gate_EDF", "up_EDF", "down_EFD"):
    assert row["per_weight_ratio"][f"m.blocks.mlp.{name}.value"] == pytest.approx(0.5)
  assert row["per_weight_ratio"]["m.blocks.attn.q_DNH.value"] == pytest.approx(1.0)


def test_an_async_slice_reads_only_its_slice():
  """TPU programs read a table in async slices (slice-start/-done): each reads its rows."""
  hlo = """HloModule m

ENTRY %main (p: f32[100,8]) -> f32[25,8] {
  %p = f32[100,8]{1,0} parameter(0), metadata={op_name="table"}
  %s = (f32[100,8]{1,0}, f32[25,8]{1,0:S(1)}, s32[]) slice-start(%p), slice={[0:25], [0:8]}
  ROOT %d = f32[25,8]{1,0:S(1)} slice-done(%s)
}
"""
  counted = hlo_bytes.count(hlo)
  assert counted.reads == {"table": 25 * 8 * 4}
  assert counted.writes == {}  # The slice lands in VMEM.


@pytest.mark.parametrize("kv_heads", [2, 8])  # Of 8 query heads.
def test_the_performance_model_counts_what_the_tpu_step_moves(kv_heads):
  """The performance model's bytes per chip of a step (the weights once, and kv heads that
  do not divide the tensor axis whole on every chip, projections and cache) equal the HLO
  count of the compiled step: 2 kv heads over 4 chips are replicated, 8 are split, 2 a chip.
  (With exactly one kv head per chip, 4 over 4, this tiny step writes its cache whole once,
  7% more than the model: a lead, docs/benchmarks.md.)"""
  config, mesh, model = _tiny_on_v4_8(
    {"tensor": 4}, num_heads=8, num_kv_heads=kv_heads, head_dim=128, attention_block_size=16
  )
  _, counted = aot.count_call_bytes(config, model, mesh, 1, 64)
  hardware = perf_model.PRESETS["tpu_v4"]
  call = perf_model.call_cost(config, hardware, perf_model.MeshShape(tensor=4), 1, 1, 64)
  moved = counted.read_bytes + counted.written_bytes
  assert moved == pytest.approx(call.weight_bytes + call.kv_bytes, rel=0.02)
