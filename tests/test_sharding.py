"""Mesh, the rules table, born-sharded parameters, and sharded runs equal to 1 device."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_config
from flax import nnx
from jax.sharding import PartitionSpec as P

from specsamp import sharding
from specsamp.models import transformer
from specsamp.sampling import generate

PROMPTS = np.array(
  [[5, 9, 14, 3, 22, 7], [8, 8, 31, 0, 0, 0], [60, 2, 17, 90, 0, 0], [4, 4, 4, 4, 4, 4]]
)
LENGTHS = np.array([6, 3, 4, 6])


def test_make_mesh_fills_the_free_axis_and_checks_sizes():
  mesh = sharding.make_mesh({"data": -1, "tensor": 2})
  assert dict(mesh.shape) == {"data": 4, "fsdp": 1, "expert": 1, "tensor": 2}
  with pytest.raises(ValueError, match="need 6 devices"):
    sharding.make_mesh({"data": 3, "tensor": 2})
  with pytest.raises(ValueError, match="Unknown mesh axes"):
    sharding.make_mesh({"model": 8})
  with pytest.raises(ValueError, match="At most one"):
    sharding.make_mesh({"data": -1, "tensor": -1})
  # A size cut by int() (2.9 ran as 2), None (a bare TypeError), a device listed twice (it
  # sampled, then failed reading the output): the review of 2026-11-30.
  for bad in (2.9, None, True):
    with pytest.raises(ValueError, match="Mesh axis sizes must be ints"):
      sharding.make_mesh({"data": bad, "tensor": 4})
  with pytest.raises(ValueError, match=r"each device once, got \[0, 0\]"):
    sharding.make_mesh({"data": 2}, [jax.devices()[0]] * 2)


def test_rules_shard_only_dimensions_the_axes_divide():
  sizes = {"data": 2, "fsdp": 2, "tensor": 2}
  assert sharding.logical_to_spec(("embed", "heads", "head_dim"), (64, 4, 16), sizes) == P(
    "fsdp", "tensor", None
  )
  # Batch over data x fsdp; batch 2 only divides by data; batch 1 stays whole.
  assert sharding.logical_to_spec(("act_batch", None), (4, 3), sizes) == P(("data", "fsdp"), None)
  assert sharding.logical_to_spec(("act_batch", None), (2, 3), sizes) == P("data", None)
  assert sharding.logical_to_spec(("act_batch", None), (1, 3), sizes) == P(None, None)
  # One KV head (MQA) under tensor parallelism is replicated.
  assert sharding.logical_to_spec(
    ("cache_batch", "cache_sequence", "cache_kv_heads", "cache_head_dim"), (4, 32, 1, 16), sizes
  ) == P(("data", "fsdp"), None, None, None)
  with pytest.raises(ValueError, match="no rule"):
    sharding.logical_to_spec(("nonsense",), (4,), sizes)


def test_parameters_are_born_sharded():
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  model = transformer.create(tiny_config("llama"), mesh)
  q = model.blocks.attn.q_DNH[...]  # [L, D, N, H]: the layer axis is never split.
  assert q.sharding.spec == P(None, "fsdp", "tensor", None)
  assert model.blocks.mlp.down_FD[...].sharding.spec == P(None, "tensor", "fsdp")
  assert model.embedder.table_VD[...].sharding.spec == P("tensor", "fsdp")
  # Each device holds its shard only.
  assert q.addressable_shards[0].data.shape[1:] == (32, 2, 16)


@pytest.mark.slow
@pytest.mark.parametrize(
  "family,mode,batch_axis,block,unstacked",
  [
    # GSPMD's sharded logits stay in test_a_mask_per_row_is_split_with_its_rows[auto], its
    # sampled tokens in test_speculative.py's data mesh test, blocked reads in the llama case:
    # this one is the extended command's, as the shard_map twin below.
    pytest.param("chinchilla", "auto", "data", 4, False, marks=pytest.mark.extended),
    # The llama case below runs shard_map over data; this one is the extended command's.
    pytest.param("chinchilla", "shard_map", "data", 0, False, marks=pytest.mark.extended),
    ("llama", "shard_map", "data", 4, False),  # blocked cache reads under shard_map
    ("gemma", "shard_map", "data", 0, False),
    ("llama", "shard_map", "fsdp", 0, False),
    # Unstacked layers (transformer.unstack_layers, what a pair samples with on CPU): each
    # layer's arrays keep the stack's sharding of their other axes, under jit and shard_map.
    ("llama", "shard_map", "fsdp", 0, True),
    ("gemma", "auto", "data", 0, True),
  ],
)
def test_sharded_run_equals_one_device(family, mode, batch_axis, block, unstacked):
  """{data or fsdp} 2 x tensor 4 on 8 devices: same logits and greedy tokens as 1 device
  (with the cache read whole, or in live blocks of 4 slots; or the layers unstacked)."""
  config = tiny_config(family, tensor_parallel=mode, attention_block_size=block)
  single = transformer.create(config, seed=5)
  mesh = sharding.make_mesh({batch_axis: 2, "tensor": 4})
  sharded = transformer.create(config, mesh, seed=5)
  if unstacked:
    sharded = transformer.unstack_layers(sharded)
    specs = {a.sharding.spec for a in jax.tree.leaves(nnx.state(sharded.blocks))}
    assert any(spec != jax.sharding.PartitionSpec() for spec in specs)  # Still split.
  tokens = jnp.asarray(PROMPTS)
  expected_logits, _ = single(tokens)
  expected = generate(single, PROMPTS, LENGTHS, jax.random.key(0), max_new_tokens=6, temperature=0)
  with sharding.use_mesh(mesh):
    logits, _ = jax.jit(lambda model, t: model(t))(sharded, tokens)
    out = generate(sharded, PROMPTS, LENGTHS, jax.random.key(0), max_new_tokens=6, temperature=0)
  assert len(logits.sharding.device_set) == 8
  np.testing.assert_allclose(logits, expected_logits, atol=5e-5, rtol=1e-5)
  np.testing.assert_array_equal(out.tokens, expected.tokens)


@pytest.mark.parametrize("mode", ["auto", "shard_map"])
def test_a_mask_per_row_is_split_with_its_rows(mode):
  """A tree call with one mask per row (packed training sequences, ``attention.segment_call``;
  a dynamic tree) on a data x tensor mesh: each row keeps its own mask. shard_map replicated
  the [B, T, M] mask while splitting the rows (the review of 2026-11-29)."""
  from specsamp.models import attention

  config = tiny_config(tensor_parallel=mode)
  single = transformer.create(config, seed=5)
  mesh = sharding.make_mesh({"data": 2, "tensor": 4})
  sharded = transformer.create(config, mesh, seed=5)
  segments = jnp.asarray([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 2, 2], [0] * 6])
  positions, call = attention.segment_call(segments)
  tokens = jnp.asarray(PROMPTS)
  expected = single(tokens, positions, tree=call).logits
  with sharding.use_mesh(mesh):
    logits = jax.jit(lambda model, t, p, c: model(t, p, tree=c).logits)(
      sharded, tokens, positions, call
    )
  np.testing.assert_allclose(logits, expected, atol=5e-5, rtol=1e-5)
  alone = single(tokens[2:3, 1:4]).logits  # Row 2's second sequence, as a row of its own.
  np.testing.assert_allclose(logits[2, 1:4], alone[0], atol=5e-5, rtol=1e-5)


def _all_reduces(num_layers: int, mesh, scan_layers: bool = False) -> int:
  config = tiny_config(num_layers=num_layers, tensor_parallel="shard_map", scan_layers=scan_layers)
  model = transformer.create(config, mesh)
  with sharding.use_mesh(mesh):
    compiled = jax.jit(lambda m, t: m(t)).lower(model, jnp.asarray(PROMPTS)).compile()
  return compiled.as_text().count(" all-reduce(")


@pytest.mark.slow
def test_shard_map_has_two_reductions_per_layer():
  """Megatron: one psum after attention, one after the MLP, and nothing else per layer
  (counted unrolled). Scanned, the program holds ONE layer's body, whatever the depth: the
  same count as one unrolled layer."""
  mesh = sharding.make_mesh({"data": 2, "tensor": 4})
  one = _all_reduces(1, mesh)
  assert _all_reduces(3, mesh) - one == 2 * 2
  assert _all_reduces(1, mesh, scan_layers=True) == _all_reduces(3, mesh, scan_layers=True) == one


def test_shard_map_refuses_heads_the_tensor_axis_does_not_divide():
  config = tiny_config(num_heads=6, num_kv_heads=6, d_model=48, tensor_parallel="shard_map")
  mesh = sharding.make_mesh({"data": 2, "tensor": 4})
  model = transformer.create(config, mesh)
  with sharding.use_mesh(mesh), pytest.raises(ValueError, match="num_heads=6"):
    model(jnp.asarray(PROMPTS))


@pytest.mark.parametrize(
  "overrides, message",
  [
    ({"act_batch": "data"}, "'act_batch' \\('data',\\) and 'cache_batch'"),
    ({"cache_kv_heads": None}, "'cache_kv_heads' maps to \\(\\)"),
    ({"kv_heads": None}, "'kv_heads' maps to \\(\\)"),
    ({"act_length": "tensor"}, "'act_length' maps to"),
  ],
)
def test_shard_map_refuses_rules_its_layout_cannot_run(overrides, message):
  """Overrides jit partitions ('auto') but shard_map's blocks are not written for: one line,
  not an error from inside JAX (or rows of the batch summed together)."""
  config = tiny_config(tensor_parallel="shard_map")
  with sharding.use_rules(overrides):
    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    model = transformer.create(config, mesh)
    with sharding.use_mesh(mesh), pytest.raises(ValueError, match=message):
      model(jnp.asarray(PROMPTS))


def _per_layer_collectives(mesh) -> dict:
  """Result shapes of the all-gathers, and the all-reduces, one more layer adds to a cached
  forward pass."""
  import collections
  import re

  def gathers(num_layers):  # Unrolled: each layer's collectives appear in the program.
    config = tiny_config(num_layers=num_layers, tensor_parallel="shard_map", scan_layers=False)
    model = transformer.create(config, mesh)
    with sharding.use_mesh(mesh):
      cache = jax.jit(lambda: model.init_cache(len(PROMPTS), 16))()
      positions = jnp.broadcast_to(jnp.arange(len(PROMPTS[0])), jnp.asarray(PROMPTS).shape)
      text = (
        jax.jit(lambda m, t, c: m(t, positions, c))
        .lower(model, jnp.asarray(PROMPTS), cache)
        .compile()
        .as_text()
      )
    counts = collections.Counter(re.findall(r"= (\S+?)\{[^}]*\} all-gather\(", text))
    counts["all-reduce"] = text.count(" all-reduce(")
    return counts

  one, three = gathers(1), gathers(3)
  return {shape: (three[shape] - one[shape]) / 2 for shape in three if three[shape] != one[shape]}


def test_shard_map_with_fsdp_gathers_weights_never_the_batch():
  """{fsdp: 2, tensor: 4}: activations and the KV cache stay split over fsdp inside the
  shard_map blocks (each device computes its own rows); only weights are all-gathered, and
  the two psums per layer remain."""
  mesh = sharding.make_mesh({"fsdp": 2, "tensor": 4})
  per_layer = _per_layer_collectives(mesh)
  assert per_layer.pop("all-reduce") == 2  # Megatron's two psums per layer, nothing more.
  batch = len(PROMPTS)
  assert per_layer, "fsdp shards the weights: each layer must gather them"
  batch_shaped = {
    shape: n for shape, n in per_layer.items() if shape.split("[")[1].split(",")[0] == str(batch)
  }
  assert not batch_shaped, f"per-layer all-gathers of full-batch arrays: {batch_shaped}"


def test_rules_can_be_overridden_and_collisions_are_errors():
  sizes = {"data": 2, "fsdp": 2, "tensor": 2}
  assert sharding.logical_to_spec(("embed", "mlp"), (8, 8), sizes) == P("fsdp", "tensor")
  overrides = sharding.parse_rules("embed=none, act_batch=data+fsdp")
  assert overrides == {"embed": None, "act_batch": ("data", "fsdp")}
  with sharding.use_rules(overrides):
    assert sharding.logical_to_spec(("embed", "mlp"), (8, 8), sizes) == P(None, "tensor")
    with pytest.raises(ValueError, match="two dimensions to the mesh axis 'tensor'"):
      sharding.logical_to_spec(("heads", "mlp"), (8, 8), sizes)
  assert sharding.logical_to_spec(("embed", "mlp"), (8, 8), sizes) == P("fsdp", "tensor")
  with pytest.raises(ValueError, match="Unknown logical axis 'embd'"):
    sharding.parse_rules("embd=none")
  with pytest.raises(ValueError, match="unknown mesh axes \\['model'\\]"):
    sharding.parse_rules("embed=model")
  with pytest.raises(ValueError, match="use logical=mesh_axis"):
    sharding.parse_rules("embed")


def test_a_config_mesh_applies_its_rules():
  previous = sharding.rules()
  try:
    mesh = sharding.mesh_from_config({"data": 2, "fsdp": 2, "tensor": 2, "rules": "vocab=none"})
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "expert": 1, "tensor": 2}
    model = transformer.create(tiny_config(), mesh)
    assert model.embedder.table_VD[...].sharding.spec == P(None, "fsdp")
  finally:
    sharding.set_rules({name: rule for name, rule in previous.items()})
  # A mesh refused leaves the rules as they were (they were set before the mesh was checked).
  with pytest.raises(ValueError, match="need 3 devices"):
    sharding.mesh_from_config({"data": 3, "rules": "embed=none"})
  assert sharding.rules() == previous


def test_shard_map_reduces_over_the_axis_the_rules_give_heads():
  """The shard_map blocks take their psum axis from the rules: heads over 'fsdp' here."""
  config = tiny_config(tensor_parallel="shard_map")
  expected, _ = transformer.create(config, seed=3)(jnp.asarray(PROMPTS))
  with sharding.use_rules(
    {
      "heads": "fsdp",
      "kv_heads": "fsdp",
      "mlp": "fsdp",
      "vocab": "fsdp",
      "embed": None,
      "act_batch": "data",
      "cache_batch": "data",
      "cache_kv_heads": "fsdp",
      "act_heads": "fsdp",
      "act_mlp": "fsdp",
      "act_vocab": "fsdp",
    }
  ):
    mesh = sharding.make_mesh({"data": 2, "fsdp": 4})
    model = transformer.create(config, mesh, seed=3)
    with sharding.use_mesh(mesh):
      compiled = jax.jit(lambda m, t: m(t)).lower(model, jnp.asarray(PROMPTS)).compile()
      logits, _ = compiled(model, jnp.asarray(PROMPTS))
      text = compiled.as_text()
  np.testing.assert_allclose(logits, expected, atol=5e-5, rtol=1e-5)
  assert "all-reduce(" in text
