"""Packed answer rows keep their sequences apart (training/answers.py): every training and tau
pass over a row that holds several sequences computes, for each of them, what a pass over that
sequence alone computes. Before the fix (2026-11-29, fifteenth session) a row's later sequences
attended to the ones before (the review of 2026-11-29); the plain causal pass is checked to
differ, so these can fail."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from specsamp.models import feature_head, transformer
from specsamp.models.config import TransformerConfig
from specsamp.training import answers, feature_train, parallel, target_store, train

CONFIG = TransformerConfig(
  vocab_size=64, num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, ffn_dim=64
)
# Row 0: the tail of an answer the row starts in (2 tokens), a sequence of a 3-token prompt
# and a 5-token answer, then a 2-token prompt and a 4-token answer. Row 1: 2 + 6, 1 + 3, and a
# last sequence the row cuts after its 2-token prompt and 2 answer tokens.
WEIGHTS = np.array(
  [
    [1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1],
    [0, 0, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 0, 0, 1, 1],
  ],
  np.float32,
)
SEQUENCES = {0: [(0, 2), (2, 10), (10, 16)], 1: [(0, 8), (8, 12), (12, 16)]}
TOKENS = np.asarray(jax.random.randint(jax.random.key(3), WEIGHTS.shape, 0, 64), np.int32)


@pytest.fixture(scope="module")
def target():
  return transformer.create(CONFIG, seed=1)


def test_a_new_sequence_begins_where_a_prompt_token_follows_an_answer_token():
  np.testing.assert_array_equal(
    answers.segments(WEIGHTS),
    [[0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2], [0] * 8 + [1] * 4 + [2] * 4],
  )
  positions, call = answers.packed_call(WEIGHTS)
  np.testing.assert_array_equal(
    positions, [[0, 1, *range(8), *range(6)], [*range(8), *range(4), *range(4)]]
  )
  assert call.mask_TM.shape == (2, 16, 16) and not bool(call.mask_TM[0, 2, 1])
  assert bool(call.mask_TM[0, 9, 2]) and not bool(call.mask_TM[0, 9, 10])


def test_tau_counts_a_heads_chain_only_within_its_rows_sequence():
  """Row p of a head drafts from the target's feature at p: its chain counts only where the
  tokens it drafts are answer tokens of p's own sequence. Row 1's second sequence has a
  one-token prompt (x_8): row 7, the end of the first sequence, would otherwise count x_9 and
  x_10, which training weighs 0."""
  correct = np.ones((2, 2, 16), bool)  # [K, B, L]: every step right.
  accepted = answers.accepted_unrolled(correct, WEIGHTS, 2)
  assert accepted[1, 7] == -1 and accepted[1, 8] == 2 and accepted[1, 2] == 2
  assert accepted[1, 10] == -1  # x_12, a prompt token.


def test_a_sequence_with_an_empty_prompt_or_answer_is_refused():
  """Its boundary could not be told from the weights."""
  tokens = np.arange(6, dtype=np.int32)
  with pytest.raises(ValueError, match="empty prompt or an empty answer"):
    answers.stream([(tokens, np.array([0, 3, 6]), np.array([1, 3]))])  # The second: no answer.
  with pytest.raises(ValueError, match="empty prompt or an empty answer"):
    answers.stream([(tokens, np.array([0, 3, 6]), np.array([0, 1]))])


SPANS = [(b, start, stop) for b, spans in SEQUENCES.items() for start, stop in spans]


def _alone() -> np.ndarray:
  """Every sequence as a row of its own from position 0, padded after its end to the row's
  width (in one call: a causal pass's positions never see what follows them)."""
  rows = np.zeros((len(SPANS), TOKENS.shape[1]), np.int32)
  for i, (b, start, stop) in enumerate(SPANS):
    rows[i, : stop - start] = TOKENS[b, start:stop]
  return rows


def _each_sequence(row_value, alone_value):
  """Compares a packed row's values with each sequence's own (``alone_value`` of ``_alone``'s
  rows), sequence by sequence."""
  alone = alone_value(_alone())
  for i, (b, start, stop) in enumerate(SPANS):
    np.testing.assert_allclose(
      row_value[b, start:stop], alone[i, : stop - start], rtol=2e-5, atol=2e-5
    )


def test_the_draft_and_the_teacher_read_each_sequence_as_if_alone(target):
  packed = train.packed_logits(target, jnp.asarray(TOKENS), jnp.asarray(WEIGHTS))
  _each_sequence(np.asarray(packed), lambda tokens: np.asarray(target(jnp.asarray(tokens)).logits))
  # The plain causal pass (what training did before) reads the sequences before.
  causal = np.asarray(target(jnp.asarray(TOKENS)).logits)
  alone = np.asarray(target(jnp.asarray(TOKENS[0, 10:16][None])).logits)
  assert not np.allclose(causal[0, 10:16], alone[0], atol=1e-3)


def test_a_sliding_window_counts_within_each_packed_sequence():
  """A model whose window (4) is shorter than the row: each packed sequence still reads as if
  alone, its window counted within it (a packed call of more slots than the window was
  refused as a tree the window could not see, review of 2026-11-29)."""
  windowed = transformer.create(CONFIG.replace(sliding_window=4), seed=1)
  packed = train.packed_logits(windowed, jnp.asarray(TOKENS), jnp.asarray(WEIGHTS))
  _each_sequence(np.asarray(packed), lambda t: np.asarray(windowed(jnp.asarray(t)).logits))
  whole = np.asarray(transformer.create(CONFIG, seed=1)(jnp.asarray(TOKENS[0, 2:10][None])).logits)
  assert not np.allclose(np.asarray(packed)[0, 2:10], whole[0], atol=1e-3)  # The window acts.


def test_a_parallel_drafts_queries_read_their_anchors_sequence_only(target):
  K, mask = 3, 63
  packed = np.asarray(
    parallel.parallel_logits(target, jnp.asarray(TOKENS), K, mask, jnp.asarray(WEIGHTS))
  )
  alone = np.asarray(parallel.parallel_logits(target, jnp.asarray(_alone()), K, mask))
  checked = 0
  for i, (b, start, stop) in enumerate(SPANS):
    for m in range(K):
      for j in range(start + m, stop):  # Query (m, j): its anchor j - m inside the sequence.
        np.testing.assert_allclose(packed[b, m, j], alone[i, m, j - start], rtol=2e-5, atol=2e-5)
        checked += 1
  assert checked == 78  # Every query whose anchor lies in the row.
  # A query counts only where the token it predicts, x_{j+1}, is in its anchor's sequence.
  weights_BL1 = np.concatenate([WEIGHTS, np.ones((2, 1), np.float32)], axis=1)
  counted = np.asarray(parallel.query_weights(jnp.asarray(weights_BL1), K))
  assert counted.shape == (2, K, 16)
  assert counted[0, 0, 13] == 1.0 and counted[0, 2, 13] == 1.0  # Anchors 13, 11: x_14.
  assert counted[0, 0, 1] == 0.0  # x_2 is a prompt token.
  # Row 1's second sequence has a 1-token prompt: x_9 is an answer token of it, which
  # anchor 8 drafts (m = 0) and anchor 6, in the sequence before, must not (m = 2).
  assert counted[1, 0, 8] == 1.0 and counted[1, 2, 8] == 0.0


def test_a_heads_unrolled_steps_and_its_targets_outputs_read_each_sequence_alone(target):
  """Row p of step k has read x_<=p+1+k: compared where those all lie in p's sequence."""
  head = feature_head.create(
    feature_head.FeatureHeadConfig(feature_layers=(0, 1, 2)), CONFIG, seed=2
  )
  model = feature_head.FeatureDraftModel(head, target)
  steps = 3
  # Each compiled as one program (run eagerly, they were 182 small compiles).
  unrolled = nnx.jit(feature_train._unrolled_hidden, static_argnums=2)
  outputs = nnx.jit(feature_train.target_outputs)
  teacher, packed = unrolled(model, jnp.asarray(TOKENS), steps, weights_BT=jnp.asarray(WEIGHTS))
  _each_sequence(
    np.asarray(teacher), lambda tokens: np.asarray(outputs(model, jnp.asarray(tokens))[0])
  )
  _, alone = unrolled(model, jnp.asarray(_alone()), steps)
  checked = 0
  for i, (b, start, stop) in enumerate(SPANS):
    for k in range(steps):
      for p in range(start, stop - 2 - k):  # Row p's chain has read x_<=p+1+k, in its sequence.
        np.testing.assert_allclose(packed[k][b, p], alone[k][i, p - start], rtol=2e-5, atol=2e-5)
        checked += 1
  assert checked > 20
  # A step's weight is 0 where the token it predicts, x_{p+2+k}, is in another sequence.
  weight = np.asarray(feature_train.step_weights(jnp.asarray(WEIGHTS), 16, 0))
  assert weight[0, 7] == 1.0 and weight[0, 8] == 0.0  # x_9 in p's sequence; x_10 begins one.
  answer_after_prompt = WEIGHTS.copy()
  answer_after_prompt[1, 8] = 1.0  # Row 1's second sequence now has no prompt: one sequence.
  assert (
    np.asarray(feature_train.step_weights(jnp.asarray(answer_after_prompt), 16, 2))[1, 5] == 1.0
  )
  one_prompt = np.asarray(feature_train.step_weights(jnp.asarray(WEIGHTS), 16, 2))
  assert one_prompt[1, 5] == 0.0  # x_9: an answer token of the next sequence, after x_8.


def test_the_store_reads_each_sequence_apart_and_a_store_of_whole_rows_is_rebuilt(target, tmp_path):
  layers = (1, 2)
  rows = np.repeat(TOKENS, 2, axis=0)
  weights = np.repeat(WEIGHTS, 2, axis=0)
  logs = []
  whole = np.array(
    target_store.build(target, rows, layers, str(tmp_path), target_id="t", log=logs.append)
  )
  stored = np.array(
    target_store.build(
      target, rows, layers, str(tmp_path), target_id="t", weights=weights, log=logs.append
    )
  )
  assert any("rebuilding" in line for line in logs)
  positions, call = answers.packed_call(weights)
  online = target(jnp.asarray(rows), positions, tree=call, capture_layers=layers)
  np.testing.assert_allclose(stored[..., :64], online.features, rtol=1e-5, atol=1e-5)
  assert not np.allclose(whole[2, 10:, :64], stored[2, 10:, :64], atol=1e-3)
  # Other weights (other sequences in the same tokens) are other rows.
  other = weights.copy()
  other[:, 5] = 0.0
  logs.clear()
  target_store.build(
    target, rows, layers, str(tmp_path), target_id="t", weights=other, log=logs.append
  )
  assert any("rebuilding" in line for line in logs)
