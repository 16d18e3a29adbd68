"""The Transformer and its KV cache: incremental decoding equals the full forward pass."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_config
from flax import nnx

from specsamp import sharding
from specsamp.models import TransformerConfig, transformer

ATOL = 2e-5


def _tokens(batch, length, vocab, seed=1):
  return jax.random.randint(jax.random.key(seed), (batch, length), 3, vocab, dtype=jnp.int32)


@pytest.mark.parametrize(
  "family,num_kv_heads",
  [
    ("chinchilla", 4),  # MHA, plain GELU MLP, untied
    ("llama", 2),  # GQA, SwiGLU
    ("llama", 1),  # MQA
    ("qwen2", 2),  # q/k/v biases
    ("gemma", 1),  # GeGLU, tied scaled embeddings, (1 + w) norm, head_dim 32, soft-caps
  ],
)
def test_incremental_decoding_equals_full_forward(family, num_kv_heads):
  config = tiny_config(family, num_kv_heads=num_kv_heads)
  model = transformer.create(config, seed=3)
  if config.qkv_bias:  # Biases start at zero; make them matter.
    for name in ("q_NH", "k_KH", "v_KH"):
      param = getattr(model.blocks.attn, name)  # [L, ...]: every layer's bias.
      param[...] = jax.random.normal(jax.random.key(7), param.shape)
  tokens = _tokens(2, 12, config.vocab_size)
  full, no_cache = jax.jit(model)(tokens)  # Compiled calls: one program each, not eager ops.
  assert no_cache is None and full.shape == (2, 12, config.vocab_size)
  assert full.dtype == jnp.float32

  call = jax.jit(lambda tokens, cache: model(tokens, None, cache))
  cache = model.init_cache(2, 16)
  prefill, cache = call(tokens[:, :5], cache)
  steps = [prefill]
  for t in range(5, 12):  # one token per call, positions from cache.lengths
    logits, cache = call(tokens[:, t : t + 1], cache)
    steps.append(logits)
  np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=ATOL, rtol=1e-5)
  np.testing.assert_array_equal(cache.lengths, [12, 12])


def test_multi_token_call_equals_token_by_token(tiny_model):
  tokens = _tokens(3, 10, tiny_model.vocab_size)
  cache_a = tiny_model.init_cache(3, 10)
  cache_b = tiny_model.init_cache(3, 10)
  _, cache_a = tiny_model(tokens[:, :4], None, cache_a)
  _, cache_b = tiny_model(tokens[:, :4], None, cache_b)
  chunk, cache_a = tiny_model(tokens[:, 4:9], None, cache_a)  # K+1 = 5 tokens at once
  singles = []
  for t in range(4, 9):
    logits, cache_b = tiny_model(tokens[:, t : t + 1], None, cache_b)
    singles.append(logits)
  np.testing.assert_allclose(chunk, jnp.concatenate(singles, axis=1), atol=ATOL, rtol=1e-5)
  for a, b in zip(cache_a.keys, cache_b.keys):
    np.testing.assert_allclose(a, b, atol=ATOL)


def test_per_row_positions_and_rollback(tiny_model):
  """Rows at different positions in one call; rejected entries are never read after rollback."""
  vocab = tiny_model.vocab_size
  tokens = _tokens(2, 9, vocab)
  full, _ = tiny_model(tokens)
  cache = tiny_model.init_cache(2, 16)
  # Row 0 holds 6 tokens, row 1 holds 3.
  _, cache = tiny_model(tokens[:, :6], None, cache)
  cache = cache.replace(lengths=jnp.array([6, 3]))
  # Write 4 "draft" tokens of garbage past each row's position, then roll back.
  garbage = _tokens(2, 4, vocab, seed=9)
  _, cache = tiny_model(garbage, None, cache)
  np.testing.assert_array_equal(cache.lengths, [10, 7])
  cache = cache.replace(lengths=jnp.array([6, 3]))
  # Continue each row with its true next token, each at its own position.
  positions = jnp.array([[6], [3]])
  next_tokens = jnp.take_along_axis(tokens, positions, axis=1)
  logits, cache = tiny_model(next_tokens, positions, cache)
  np.testing.assert_allclose(logits[0, 0], full[0, 6], atol=ATOL, rtol=1e-5)
  np.testing.assert_allclose(logits[1, 0], full[1, 3], atol=ATOL, rtol=1e-5)
  np.testing.assert_array_equal(cache.lengths, [7, 4])


def test_every_parameter_has_logical_axes(tiny_model):
  for path, variable in nnx.to_flat_state(nnx.state(tiny_model, nnx.Param)):
    axes = sharding.logical_axes_of(variable)
    assert len(axes) == variable.ndim, path
    sharding.logical_to_spec(axes, variable.shape, {"data": 2, "fsdp": 1, "tensor": 4})


def test_dtypes_follow_config():
  config = tiny_config("llama", dtype="bfloat16", param_dtype="bfloat16")
  model = transformer.create(config)
  assert model.blocks.mlp.up_DF[...].dtype == jnp.bfloat16
  cache = model.init_cache(1, 8)
  logits, cache = model(_tokens(1, 4, config.vocab_size), None, cache)
  assert cache.keys.dtype == jnp.bfloat16 and logits.dtype == jnp.float32


@pytest.mark.parametrize(
  "changes,message",
  [
    (dict(num_heads=6, num_kv_heads=4), "must divide num_heads"),
    (dict(d_model=60, num_heads=8), "not divisible by num_heads"),
    (dict(mlp_activation="tanh"), "mlp_activation"),
    (dict(tensor_parallel="magic"), "tensor_parallel"),
    (dict(num_layers=0), "num_layers"),
    (dict(dtype="int8"), "dtype"),
    (dict(rope_theta=0.0), "rope_theta must be a finite number > 0"),  # NaN logits before.
    (dict(rope_theta=-1e4), "rope_theta must be a finite number > 0"),
    (dict(experts_per_token=2), "experts_per_token=2 does nothing without num_experts"),
    (dict(sliding_window_pattern=2), "sliding_window_pattern=2 does nothing without"),
    (dict(rope_scaling_factor=8.0), "rope_scaling_factor=8.0 does nothing without rope_scaling"),
  ],
)
def test_bad_configs_are_refused(changes, message):
  with pytest.raises(ValueError, match=message):
    tiny_config(**changes)


def test_unknown_config_field_is_refused():
  with pytest.raises(ValueError, match="Unknown TransformerConfig fields"):
    TransformerConfig.from_config(
      dict(
        vocab_size=8, num_layers=1, d_model=8, num_heads=1, num_kv_heads=1, ffn_dim=8, num_expertz=4
      )
    )


def test_call_shape_errors(tiny_model):
  cache = tiny_model.init_cache(2, 8)
  with pytest.raises(ValueError, match="Cache holds 2 rows"):
    tiny_model(jnp.zeros((3, 1), jnp.int32), None, cache)
  with pytest.raises(ValueError, match="must match tokens"):
    tiny_model(jnp.zeros((2, 2), jnp.int32), jnp.zeros((2, 3), jnp.int32), cache)


_GEMMA2 = dict(
  post_norms=True,
  sliding_window=3,
  sliding_window_pattern=2,
  query_pre_attn_scalar=24.0,
  attn_logit_softcap=30.0,
  final_logit_softcap=20.0,
)


@pytest.mark.slow
@pytest.mark.parametrize(
  "family,changes",
  [  # The suite: Llama and Gemma 2; the other families are the extended command's.
    pytest.param("chinchilla", {}, marks=pytest.mark.extended),
    ("llama", {}),
    pytest.param("qwen2", {}, marks=pytest.mark.extended),
    pytest.param("gemma", {}, marks=pytest.mark.extended),
    ("gemma", _GEMMA2),  # Gemma 2: sandwich norms, alternating sliding windows, soft-caps.
    # A mixture of experts: its experts stay stacked inside the scan, sliced when unstacked.
    ("llama", dict(num_experts=4, experts_per_token=2, ffn_dim=16)),
  ],
)
def test_scanned_layers_equal_unrolled_and_unstacked_layers(family, changes):
  """One lax.scan over the stacked blocks computes what a Python loop over the same
  parameters does, and what the layers held one array per layer do (``unstack_layers``):
  logits and cache, for prefill, decode, an early exit and captured features."""
  config = tiny_config(family, num_layers=3, **changes)
  scanned = transformer.create(config, seed=5)
  graphdef, state = nnx.split(scanned)
  unrolled = nnx.merge(
    nnx.graphdef(transformer.create(config.replace(scan_layers=False), seed=5)), state
  )
  assert unrolled.config.scan_layers is False
  unstacked = transformer.unstack_layers(nnx.merge(graphdef, state))
  assert transformer.is_unstacked(unstacked) and not transformer.is_unstacked(scanned)
  assert transformer.unstack_layers(unstacked) is unstacked  # Already unstacked: as it is.
  layer_1 = jax.tree.leaves(nnx.state(transformer.layer_block(unstacked.blocks, 1)))
  stacked = jax.tree.leaves(nnx.state(scanned.blocks))
  assert [a.shape for a in layer_1] == [b.shape[1:] for b in stacked]
  tokens = _tokens(2, 9, config.vocab_size)
  results = {}
  for name, model in (("scanned", scanned), ("unrolled", unrolled), ("unstacked", unstacked)):

    @jax.jit  # One program per model, not an eager run of every operation.
    def calls(tokens, model=model):
      cache = model.init_cache(2, 12)
      prefill, cache = model(tokens[:, :6], None, cache)
      step = model(tokens[:, 6:], None, cache, capture_layers=(1, 3))
      early, _ = transformer.EarlyExit(model, 2)(tokens)
      return prefill, step.logits, step.cache.keys, step.cache.values, step.features, early

    results[name] = calls(tokens)
  for other in ("unrolled", "unstacked"):
    for got, want in zip(results["scanned"], results[other]):
      np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=ATOL)


@pytest.mark.slow
@pytest.mark.parametrize(
  "family,changes",
  [  # The suite: GQA and Gemma 2's windows; the other families are the extended command's.
    pytest.param("chinchilla", {}, marks=pytest.mark.extended),
    ("llama", {"num_kv_heads": 2}),  # GQA
    pytest.param("qwen2", {}, marks=pytest.mark.extended),
    ("gemma", _GEMMA2),  # windows (of 3 slots, so early blocks drop out) and soft-caps
  ],
)
def test_blocked_attention_reads_live_blocks_and_equals_dense(family, changes):
  """The cache read in blocks of 4 slots, only up to the live ones, gives the dense result:
  prefill of ragged rows, then decode and scoring steps at positions across block edges."""
  config = tiny_config(family, num_layers=2, **changes)
  blocked = transformer.create(config.replace(attention_block_size=4), seed=2)
  dense = nnx.merge(nnx.graphdef(transformer.create(config.replace(attention_block_size=0))),
                    nnx.state(blocked))  # fmt: skip
  tokens = _tokens(2, 11, config.vocab_size)
  results = {}
  for name, model in (("blocked", blocked), ("dense", dense)):
    cache = model.init_cache(2, 22)  # 6 blocks, the last partial; calls reach slot 10.
    positions = jnp.array([[0, 1, 2, 3, 4], [0, 1, 2, 0, 0]])  # row 1 is 3 long (then pad)
    prefill, cache = model(tokens[:, :5], positions, cache)
    cache = cache.replace(lengths=jnp.array([5, 3]))
    step, cache = model(tokens[:, 5:6], None, cache)
    score, cache = model(tokens[:, 6:11], None, cache)  # 5 tokens: slots 6-10 and 4-8
    results[name] = (prefill, step, score)
  for got, want in zip(results["blocked"], results["dense"]):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=ATOL)


def test_an_unstacked_step_copies_no_weight_on_cpu():
  """XLA's CPU backend may lay a weight out again, a copy of it in every call, when an
  einsum's operand order does not match its product's: attention's output projection did
  (o [N, H, D] transposed to [H, N, D] in every layer; 8-18% of a call, docs/benchmarks.md).
  The compiled decode step of unstacked layers (CPU's layout) copies no array of a weight's
  size."""
  config = tiny_config("llama", num_layers=2, num_heads=4, num_kv_heads=2, d_model=64)
  model = transformer.unstack_layers(transformer.create(config, seed=0))
  graphdef, state = nnx.split(model)
  weight_sizes = {a.size for a in jax.tree.leaves(state) if a.ndim >= 2}

  @jax.jit
  def step(state, tokens, cache):
    return nnx.merge(graphdef, state)(tokens, None, cache)

  hlo = step.lower(state, _tokens(1, 1, config.vocab_size), model.init_cache(1, 16))
  copies = []
  for line in hlo.compile().as_text().splitlines():
    name, _, rest = line.strip().partition(" = ")
    if "copy" in name.split(".")[0] and not line.startswith(" " * 4):
      shape = rest.split("{")[0].split("[")[-1].rstrip("]")
      size = int(np.prod([int(d) for d in shape.split(",") if d])) if shape else 1
      copies.append((name, size))
  assert copies  # The parse sees the program's copies (the cache's, this test's control).
  assert not [c for c in copies if c[1] in weight_sizes], copies


def test_blocked_attention_reads_only_its_layers_live_blocks():
  """A layer reads its own slots of the stacked cache, up to the batch's furthest position:
  NaN in the other layers, or past that position, changes nothing."""
  from specsamp.models.attention import LayerCache, attend

  q = jax.random.normal(jax.random.key(0), (1, 2, 4, 8))
  k, v = (jax.random.normal(jax.random.key(i), (3, 1, 18, 2, 8)) for i in (1, 2))
  positions = jnp.array([[4, 5]])
  clean = attend(q, LayerCache(k, v, 1), positions)
  poisoned_k = k.at[1, :, 8:].set(jnp.nan).at[0].set(jnp.nan).at[2].set(jnp.nan)
  poisoned_v = v.at[1, :, 8:].set(jnp.nan).at[0].set(jnp.nan).at[2].set(jnp.nan)
  out = attend(q, LayerCache(poisoned_k, poisoned_v, 1), positions, block_size=4)
  np.testing.assert_allclose(out, clean, rtol=1e-5, atol=1e-6)
  dense = attend(q, LayerCache(poisoned_k, poisoned_v, 1), positions)  # reads every slot
  assert np.isnan(np.asarray(dense)).any()
  # Near the end of a cache 4 does not divide: the last block (slots 14-17) overlaps the one
  # before (12-15), and each slot still counts once.
  late = jnp.array([[13, 17]])
  np.testing.assert_allclose(
    attend(q, LayerCache(k, v, 2), late, block_size=4),
    attend(q, LayerCache(k, v, 2), late),
    rtol=1e-5,
    atol=1e-6,
  )


def test_logits_at_gives_each_rows_chosen_logits_and_the_same_cache(tiny_model):
  """The decode protocol's part (h): logits at one token per row equal that row of the full
  call's logits, and the cache is written for every token. The prefill uses it."""
  from specsamp.sampling import autoregressive, model_protocol

  assert model_protocol.takes_logits_at(tiny_model)
  tokens = jax.random.randint(jax.random.key(3), (3, 9), 0, tiny_model.vocab_size)
  positions = jnp.broadcast_to(jnp.arange(9), (3, 9))
  cache = tiny_model.init_cache(3, 16)
  full, full_cache = tiny_model(tokens, positions, cache)
  at = jnp.asarray([8, 0, 4])
  chosen, chosen_cache = tiny_model(tokens, positions, cache, logits_at=at)
  assert chosen.shape == (3, 1, tiny_model.vocab_size)
  np.testing.assert_allclose(chosen[:, 0], full[jnp.arange(3), at], rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(chosen_cache.keys, full_cache.keys)
  np.testing.assert_array_equal(chosen_cache.lengths, full_cache.lengths)
  lengths = jnp.asarray([9, 1, 5])
  last, _ = autoregressive.prefill(tiny_model, tokens, lengths, cache)
  np.testing.assert_allclose(last, full[jnp.arange(3), lengths - 1], rtol=1e-6, atol=1e-6)


def test_a_call_returns_one_output_type_with_or_without_features(tiny_model):
  """One type whatever the call asks: it unpacks as the decode protocol's (logits, cache)
  pair, carries features only when captured, and crosses jit as a pytree."""
  from specsamp.models import output

  tokens = jnp.array([[3, 1, 4, 1]], jnp.int32)
  plain = tiny_model(tokens, None, tiny_model.init_cache(1, 8))
  captured = tiny_model(tokens, None, tiny_model.init_cache(1, 8), capture_layers=(0, 1))
  for out in (plain, captured):
    assert isinstance(out, output.ModelOutput) and len(out) == 2
    logits, cache = out
    assert logits is out.logits and cache is out.cache
  assert plain.features is None
  assert captured.features.shape == (1, 4, 2 * tiny_model.config.d_model)
  np.testing.assert_array_equal(plain.logits, captured.logits)
  through = jax.jit(lambda out: out)(captured)
  assert isinstance(through, output.ModelOutput)
  np.testing.assert_array_equal(through.features, captured.features)
  # A user's model may return a plain pair; ``of`` reads it as the same type.
  pair = output.of((plain.logits, plain.cache))
  assert isinstance(pair, output.ModelOutput) and pair.features is None
  assert output.of(captured) is captured


def test_a_call_past_the_caches_last_slot_is_refused_where_it_can_be_told(tiny_model):
  """6 tokens into 4 slots, or a decode at position 4 of a 4-slot cache: the writes past the
  end were dropped and the logits wrong (errors of 1.6-2.5 against a reference) with no error
  (2026-11-30's review). Refused from the shapes, and from positions known outside a trace."""
  cache = tiny_model.init_cache(1, 4)
  with pytest.raises(ValueError, match="writes 6 tokens up to position 5 into a KV cache of 4"):
    tiny_model(jnp.ones((1, 6), jnp.int32), None, cache)
  _, cache = tiny_model(jnp.ones((1, 4), jnp.int32), None, cache)  # Exactly full: fine.
  with pytest.raises(ValueError, match="up to position 4 into a KV cache of 4 slots"):
    tiny_model(jnp.ones((1, 1), jnp.int32), None, cache)
