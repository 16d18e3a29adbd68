"""The target's outputs stored once per training row (training/target_store.py): the same
features and teacher as the online pass, a resumed build, a rebuilt stale store, and a head's
loss and tau counts unchanged when read from the store."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specsamp.models import feature_head, transformer
from specsamp.models.config import TransformerConfig
from specsamp.training import checkpoint, feature_train, target_store
from specsamp.training.data import Batches

CONFIG = TransformerConfig(
  vocab_size=64, num_layers=4, d_model=32, num_heads=4, num_kv_heads=2, ffn_dim=64
)
LAYERS = (1, 2, 3)


@pytest.fixture(scope="module")
def target():
  return transformer.create(CONFIG, seed=1)


def _rows(seed, count=5, length=17):
  return np.asarray(jax.random.randint(jax.random.key(seed), (count, length), 0, 64), np.int32)


def test_stored_features_and_teacher_are_the_online_pass(target, tmp_path):
  rows = _rows(0)
  stored = target_store.build(target, rows, LAYERS, str(tmp_path), target_id="t", chunk_rows=2)
  assert stored.shape == (5, 17, 4 * 32) and not stored.flags.writeable
  online = target(jnp.asarray(rows), capture_layers=LAYERS)
  split = len(LAYERS) * 32
  np.testing.assert_allclose(stored[..., :split], online.features, rtol=1e-5, atol=1e-5)
  teacher = target.output(jnp.asarray(stored[..., split:]))
  np.testing.assert_allclose(teacher, online.logits, rtol=1e-5, atol=1e-5)
  ids = jnp.asarray([3, 7, 60])  # A reduced vocabulary costs only its columns.
  np.testing.assert_allclose(
    target.output(jnp.asarray(stored[..., split:]), ids), online.logits[..., ids], atol=1e-5
  )


def test_a_stopped_build_resumes_and_a_stale_store_is_rebuilt(target, tmp_path):
  rows, logs = _rows(1, count=6), []
  full = np.array(
    target_store.build(target, rows, LAYERS, str(tmp_path), target_id="t", chunk_rows=2)
  )
  # As if stopped after 2 rows: the rest was never written.
  outputs = np.memmap(tmp_path / target_store.OUTPUTS, full.dtype, "r+", shape=full.shape)
  outputs[2:] = 0.0
  outputs.flush()
  del outputs
  (tmp_path / target_store.PROGRESS).write_text(json.dumps({"rows": 2}))
  resumed = target_store.build(
    target, rows, LAYERS, str(tmp_path), target_id="t", chunk_rows=2, log=logs.append
  )
  np.testing.assert_array_equal(resumed, full)
  assert "4 of 6 rows" in logs[0]
  # Other rows (new shards pack differently) or another target: rebuilt, never misread.
  for other_rows, target_id in ((_rows(2, count=6), "t"), (rows, "another")):
    logs.clear()
    rebuilt = target_store.build(
      target, other_rows, LAYERS, str(tmp_path), target_id=target_id, chunk_rows=2, log=logs.append
    )
    assert "rebuilding" in logs[0]
    meta = json.loads((tmp_path / target_store.META).read_text())
    assert meta["target"].split()[0] == target_id
  np.testing.assert_array_equal(rebuilt, full)
  # Another model of the same shape under the same id (another checkpoint): rebuilt, where
  # the other model's features were read before.
  other = transformer.create(CONFIG, seed=2)
  for model in (other, target):
    logs.clear()
    target_store.build(model, rows, LAYERS, str(tmp_path), target_id="t", log=logs.append)
    assert "rebuilding" in logs[0]
  assert sorted(os.listdir(tmp_path)) == sorted(
    [target_store.OUTPUTS, target_store.META, target_store.PROGRESS]
  )
  # A damaged copy (outputs cut short, a record that is not JSON) is derived data: rebuilt,
  # where numpy's mmap error or a JSONDecodeError without a path stopped the run before.
  with open(tmp_path / target_store.OUTPUTS, "r+b") as f:
    f.truncate(100)
  for damage in ("size", "record"):
    if damage == "record":
      (tmp_path / target_store.META).write_text("{not json")
    logs.clear()
    again = target_store.build(
      target, rows, LAYERS, str(tmp_path), target_id="t", chunk_rows=2, log=logs.append
    )
    np.testing.assert_array_equal(again, full)
    assert "rebuilding" in logs[0]


def test_a_head_reading_the_last_layer_stores_it_as_a_feature_and_as_the_last(target, tmp_path):
  """feature_layers may name the last layer's output (N): captured once, stored in both places
  (the store asked the model for layer N twice, refused as not distinct)."""
  rows, layers = _rows(5), (1, 2, CONFIG.num_layers)
  stored = target_store.build(target, rows, layers, str(tmp_path), target_id="t")
  online = target(jnp.asarray(rows), capture_layers=layers)
  np.testing.assert_allclose(stored[..., : 3 * 32], online.features, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(stored[..., 2 * 32 : 3 * 32], stored[..., 3 * 32 :])


def test_new_rows_after_the_stored_ones_extend_the_store(target, tmp_path):
  rows, logs = _rows(6, count=7), []
  fresh = np.array(
    target_store.build(target, rows, LAYERS, str(tmp_path / "fresh"), target_id="t", chunk_rows=2)
  )
  directory = str(tmp_path / "grown")
  first = target_store.build(target, rows[:3], LAYERS, directory, target_id="t", chunk_rows=2)
  # Mark a stored row: a store that kept its rows still holds the mark after growing.
  outputs = np.memmap(first.filename, first.dtype, "r+", shape=first.shape)
  outputs[0] = 7.0
  outputs.flush()
  del outputs, first
  grown = target_store.build(
    target, rows, LAYERS, directory, target_id="t", chunk_rows=2, log=logs.append
  )
  assert "holds the first 3 rows; extending" in logs[0] and "4 of 7 rows" in logs[1]
  assert (grown[0] == 7.0).all()  # Kept, not recomputed.
  np.testing.assert_allclose(grown[1:], fresh[1:], rtol=1e-6, atol=1e-6)
  meta = json.loads((tmp_path / "grown" / target_store.META).read_text())
  assert meta["shape"][0] == 7
  # The same rows again: nothing to compute. Fewer rows, or other first rows: rebuilt.
  logs.clear()
  target_store.build(target, rows, LAYERS, directory, target_id="t", chunk_rows=2, log=logs.append)
  assert logs == []
  for other in (rows[:5], np.concatenate([rows[1:], rows[:1]])):
    logs.clear()
    target_store.build(
      target, other, LAYERS, directory, target_id="t", chunk_rows=2, log=logs.append
    )
    assert "rebuilding" in logs[0]


def test_batches_carry_the_stored_rows_in_their_order(target, tmp_path):
  rows = _rows(3, count=8)
  stored = target_store.build(target, rows, LAYERS, str(tmp_path), target_id="t")
  batches = Batches(rows, 3, seed=4, weights=np.ones(rows.shape, np.float32), stored=stored)
  for step in range(4):
    tokens, _, outputs = batches.at(step)
    for token_row, output_row in zip(tokens, outputs):
      index = np.flatnonzero((rows == token_row).all(1))[0]
      np.testing.assert_array_equal(output_row, stored[index])
  with pytest.raises(ValueError, match="need weights"):
    Batches(rows, 3, stored=stored)
  with pytest.raises(ValueError, match="one entry per token"):
    Batches(rows[:, :-1], 3, weights=np.ones((8, 16), np.float32), stored=stored)


@pytest.mark.parametrize(  # The whole vocabulary's case is the extended command's.
  "draft_vocab_size", [pytest.param(0, marks=pytest.mark.extended), 40]
)
def test_a_heads_loss_and_greedy_counts_are_the_same_from_the_store(
  target, tmp_path, draft_vocab_size
):
  rows = _rows(5, count=4)
  weights = (np.arange(17)[None] % 5 != 0).astype(np.float32).repeat(4, 0)
  config = feature_train.FeatureTrainConfig(
    steps=2, batch_size=4, seq_len=16, learning_rate=1e-3, warmup_steps=1, ttt_steps=3
  )
  mapping = feature_train.frequent_tokens(rows, 64, draft_vocab_size) if draft_vocab_size else None
  trainer = feature_train.FeatureTrainer(
    feature_head.FeatureHeadConfig(feature_layers=LAYERS, draft_vocab_size=draft_vocab_size),
    target,
    config,
    checkpoint.default_mesh(),
    mapping,
  )
  stored = target_store.build(target, rows, LAYERS, str(tmp_path), target_id="t", weights=weights)
  online = Batches(rows, 4, weights=weights)
  offline = dataclasses.replace(online, stored=stored)
  state = trainer.init_state()
  params = state.params
  assert trainer.evaluate(params, offline.first(1)) == pytest.approx(
    trainer.evaluate(params, online.first(1)), rel=1e-5
  )
  np.testing.assert_array_equal(
    trainer.greedy_correct(params, offline.first(1)[0], 3),
    trainer.greedy_correct(params, online.first(1)[0], 3),
  )
  # One optimizer step each way lands on the same parameters.
  after_online, metrics_online = trainer.train_step(state, online.at(0))
  state = trainer.init_state()
  after_offline, metrics_offline = trainer.train_step(state, offline.at(0))
  assert float(metrics_offline["loss"]) == pytest.approx(float(metrics_online["loss"]), rel=1e-5)
  for a, b in zip(jax.tree.leaves(after_online.params), jax.tree.leaves(after_offline.params)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
