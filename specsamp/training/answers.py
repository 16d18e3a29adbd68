r"""Training on regenerated answers (``regenerate``): packed batches that weigh only the answer
tokens, and the offline acceptance estimate tau.

**Batches.** Each shard's sequences (chat prompt, then the target's answer) are laid back to back
and packed into rows of ``seq_len + 1`` tokens, as ``data.Batches.pack`` packs a corpus. A weight
per token says whether it is an answer token: the loss is taken where the *predicted* token is
the target's (the prompt is context, never a label), since a drafter only ever drafts answers.

**tau.** On greedy answers, the token after x_<=t *is* the target's argmax, so a chain drafter
whose greedy proposal after x_<=t equals x_{t+1} is accepted, and its next proposal is made from
x_<=t+1: the same context the data holds. So one teacher-forced pass of the drafter gives the
exact number of tokens a K-token greedy chain drafted from x_<=t would have accepted: the run of
correct predictions starting at t, capped at K. With acc_k = P(the k-th is accepted | the ones
before were),

  tau = 1 + sum_k prod_{i<=k} acc_i  = E[1 + accepted],

the tokens per target call at T=0 that a chain drafting after any answer position would get:
the per-position estimate EAGLE-3 and SpecForge report, exact position by position. Decoding
drafts only after the positions where the previous iteration stopped, right after a rejection,
where drafts fail more often than on average: the loop's tokens per call is lower, by 8-14% on
every drafter measured (2026-11-30). ``loop_tau`` walks the loop over the same counts (each
sequence from its prompt's end, moving on by 1 + what was accepted) and gives exactly what the
greedy speculative loop collects; train_drafter reports both and keeps the best by the position
mean (it weighs every position, so it varies less between evaluations). The mean is over
answer positions whose K next tokens are all answer tokens of the row; a packed row starts
mid-sequence, so its first positions see a shortened context (the loop's walk leaves such a
sequence out).

**One sequence's context.** A row holds several sequences back to back. Every training and tau
pass over a row keeps them apart (``packed_call``): a token attends to the tokens of its own
sequence only, at positions counted from that sequence's start, as a sampler's row holds one
prompt and its answer from position 0. A new sequence begins where a prompt token (weight 0)
follows an answer token (weight 1); ``stream`` refuses a sequence with an empty prompt or
answer, which would hide that boundary.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specsamp.models import attention
from specsamp.models.attention import TreeCall
from specsamp.training import data


def stream(
  shards: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray]:
  """(tokens, answer) streams: every shard's sequences back to back, and 1 on answer tokens."""
  tokens, answer = [], []
  for shard_tokens, offsets, prompt_lengths in shards:
    lengths = np.diff(offsets)
    if np.any(np.asarray(prompt_lengths) < 1) or np.any(lengths - prompt_lengths < 1):
      raise ValueError(
        "A regenerated shard holds a sequence with an empty prompt or an empty answer: a "
        "packed row's sequences are told apart where a prompt token follows an answer token."
      )
    tokens.append(shard_tokens)
    weights = np.ones(len(shard_tokens), np.float32)
    for start, length in zip(offsets[:-1], prompt_lengths):
      weights[start : start + length] = 0.0
    answer.append(weights)
  if not tokens:
    raise ValueError("No regenerated shard to train on.")
  return np.concatenate(tokens).astype(np.int32), np.concatenate(answer)


def _prompts(shard: tuple[np.ndarray, np.ndarray, np.ndarray]) -> list[bytes]:
  tokens, offsets, prompt_lengths = shard
  return [tokens[start : start + n].tobytes() for start, n in zip(offsets[:-1], prompt_lengths)]


def without_trained_prompts(
  held_out: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
  training: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
) -> tuple[list[tuple[np.ndarray, np.ndarray, np.ndarray]], int]:
  """The held-out shards without the sequences whose prompt tokens a training shard also holds
  (the same instruction under another id: the standard library has functions of the same source
  in two files), and how many were left out: tau is measured on prompts never trained on."""
  trained = {prompt for shard in training for prompt in _prompts(shard)}
  kept, removed = [], 0
  for shard in held_out:
    tokens, offsets, prompt_lengths = shard
    keep = [i for i, prompt in enumerate(_prompts(shard)) if prompt not in trained]
    removed += len(prompt_lengths) - len(keep)
    if keep:
      pieces = [tokens[offsets[i] : offsets[i + 1]] for i in keep]
      new_offsets = np.concatenate([[0], np.cumsum([len(p) for p in pieces])]).astype(offsets.dtype)
      kept.append((np.concatenate(pieces), new_offsets, np.asarray(prompt_lengths)[keep]))
  return kept, removed


def batches(
  shards: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
  seq_len: int,
  batch_size: int,
  seed: int = 0,
) -> data.Batches:
  """The shards packed into ``data.Batches`` with answer weights (module docstring)."""
  tokens, answer = stream(shards)
  packed = data.Batches.pack(tokens, seq_len, batch_size, seed)
  weights = answer[: packed.sequences.size].reshape(packed.sequences.shape)
  return data.Batches(packed.sequences, batch_size, seed, weights=weights)


# How a pass over packed rows reads them (module docstring): recorded with what is trained and
# measured, so that a checkpoint, a best tau or a target store made before the sequences of a
# row were kept apart (the fifteenth session, 2026-11-29) is not taken for one made since.
CONTEXT = "per_sequence"


def segments(weights_BL: jax.Array | np.ndarray) -> jax.Array:
  """[B, L] int32: which sequence of its packed row each token belongs to (module docstring):
  0 from the row's first token, one more at each prompt token that follows an answer token."""
  answer_BL = jnp.asarray(weights_BL) > 0
  begins_BL = ~answer_BL[:, 1:] & answer_BL[:, :-1]
  first_B1 = jnp.zeros((answer_BL.shape[0], 1), jnp.int32)
  return jnp.concatenate([first_B1, jnp.cumsum(begins_BL, axis=1, dtype=jnp.int32)], axis=1)


def packed_call(
  weights_BL: jax.Array | np.ndarray | None,
) -> tuple[jax.Array | None, TreeCall | None]:
  """(positions [B, L], tree call) for a model's pass over packed answer rows (no cache): token
  t sees the tokens of its own sequence up to itself, at positions from that sequence's start
  (module docstring; ``attention.segment_call``). ``weights_BL``: the answer weights of the
  tokens the pass reads; None (unweighted rows, a corpus): (None, None), the plain causal pass,
  so every caller passes the pair on as ``model(tokens, positions, tree=call)``."""
  if weights_BL is None:
    return None, None
  return attention.segment_call(segments(weights_BL))


def accepted_run(correct_BT: np.ndarray, valid_BT: np.ndarray, K: int) -> np.ndarray:
  """[B, T] tokens a K-token greedy chain drafted after position t accepts: the run of
  ``correct`` from t on (``correct[b, t]``: the drafter's argmax after x_<=t is x_{t+1}),
  capped at K; -1 where the K next tokens are not all ``valid`` (answer tokens)."""
  correct_BT = np.asarray(correct_BT, bool)
  valid_BT = np.asarray(valid_BT, bool)
  B, T = correct_BT.shape
  run = np.zeros((B, T + 1), np.int64)
  for t in range(T - 1, -1, -1):  # Run length of correct predictions from t on.
    run[:, t] = np.where(correct_BT[:, t], run[:, t + 1] + 1, 0)
  return np.where(_answer_windows(valid_BT, K), np.minimum(run[:, :T], K), -1)


def _answer_windows(valid_BT: np.ndarray, K: int) -> np.ndarray:
  """[B, T] whether ``valid`` holds at t..t+K-1: the chains drafted after position t that tau
  counts (the K tokens they propose are all answer tokens)."""
  valid_BT = np.asarray(valid_BT, bool)
  B, T = valid_BT.shape
  window = np.zeros((B, T), bool)
  if T >= K:
    window[:, : T - K + 1] = np.lib.stride_tricks.sliding_window_view(valid_BT, K, axis=1).all(-1)
  return window


def accepted_parallel(correct_KBT: np.ndarray, valid_BT: np.ndarray, K: int) -> np.ndarray:
  """[B, T] tokens a parallel draft's K-token greedy chain drafted after position t accepts,
  from its per-query flags (``parallel.greedy_correct``: ``correct[m, b, j]``, query (m, j) is
  right when it predicts x_{j+1}; the chain's k-th token comes from query (k - 1, t + k - 1)):
  the run of True over k, capped at K; -1 where the K next tokens are not all ``valid``, as
  ``accepted_run``, which this is when every segment is right where a chain draft is."""
  correct_KBT = np.asarray(correct_KBT, bool)
  if correct_KBT.shape[0] < K:
    raise ValueError(f"{correct_KBT.shape[0]} draft positions cannot measure a chain of K={K}.")
  _, B, T = correct_KBT.shape
  along_KBT = np.zeros((K, B, T), bool)  # [k - 1, b, t]: the k-th draft after x_<=t is right.
  for k in range(K):
    along_KBT[k, :, : T - k] = correct_KBT[k, :, k:]
  return np.where(_answer_windows(valid_BT, K), np.cumprod(along_KBT, axis=0).sum(0), -1)


def tau(accepted: np.ndarray | Sequence[np.ndarray], K: int) -> tuple[float, np.ndarray]:
  """(tau, acc [K]) from ``accepted_run``'s counts (-1 entries left out): one array, or a
  sequence of them (one per batch, of any shapes) pooled."""
  if not isinstance(accepted, np.ndarray):
    accepted = np.concatenate([np.asarray(a).ravel() for a in accepted])
  counts = np.asarray(accepted).ravel()
  counts = counts[counts >= 0]
  if not len(counts):
    raise ValueError("No position with K answer tokens after it to estimate tau on.")
  return float(1 + counts.mean()), _acceptance(counts, K)


def _acceptance(counts: np.ndarray, K: int) -> np.ndarray:
  """acc [K] from accepted counts: at position k, the chains that accepted k drafts over
  those that reached it (accepted k - 1)."""
  reached = np.array([(counts >= k).sum() for k in range(K + 1)], np.float64)
  return reached[1:] / np.maximum(reached[:-1], 1)


def loop_tau(
  accepted: Sequence[np.ndarray], weights: Sequence[np.ndarray], K: int
) -> tuple[float, np.ndarray, np.ndarray]:
  """(tokens per target call, acc [K], accepted-count histogram [K + 1]) of the greedy chain
  loop itself, walked over per-position counts in ``accepted_run``'s layout (``chain_layout``
  for an unrolled head's):
  each sequence whose prompt ends inside its row starts after its last prompt token, drafts,
  and moves on by 1 + what was accepted, as decoding does, until fewer than K answer tokens
  are left (the iterations the position mean leaves out too). ``weights``: each row's answer
  weights (``batches``), one array per batch as ``accepted``.

  The position mean (``tau``) weighs every answer position alike; the loop drafts only after
  the positions where the previous iteration stopped, right after a rejection, where drafts
  fail more often: on the shipped SmolLM2 head 2.00 against 1.92 over the held-out rows
  (2.03 against 1.77 on the first 64 tokens of 7 answers, which the real loop reproduced
  exactly; 2026-11-30). acc_k: accepted over reached at position k, pooled over the
  iterations."""
  counts = []
  for accepted_BT, weights_BL in zip(accepted, weights):
    accepted_BT = np.asarray(accepted_BT)
    answer_BL = np.asarray(weights_BL, np.float32) > 0
    T = accepted_BT.shape[1]
    for b in range(accepted_BT.shape[0]):
      # A sequence's last prompt token: a prompt token followed by an answer token.
      for t in np.flatnonzero(~answer_BL[b, :T] & answer_BL[b, 1 : T + 1]):
        while t < T and accepted_BT[b, t] >= 0:
          counts.append(int(accepted_BT[b, t]))
          t += 1 + int(accepted_BT[b, t])
  if not counts:
    raise ValueError("No held-out sequence starts inside a row with K answer tokens after it.")
  counts = np.asarray(counts)
  histogram = np.bincount(counts, minlength=K + 1)
  return float(1 + counts.mean()), _acceptance(counts, K), histogram


def chain_layout(unrolled_BL: np.ndarray) -> np.ndarray:
  """An unrolled head's counts (``accepted_unrolled``: [B, L], p drafts after x_<=p+1) in
  ``accepted_run``'s layout ([B, L - 1], t drafts after x_<=t; -1 at t = 0, which no head
  position drafts after)."""
  unrolled_BL = np.asarray(unrolled_BL)
  chain_BT = np.full((unrolled_BL.shape[0], unrolled_BL.shape[1] - 1), -1, unrolled_BL.dtype)
  chain_BT[:, 1:] = unrolled_BL[:, : unrolled_BL.shape[1] - 2]
  return chain_BT


def accepted_unrolled(correct_KBT: np.ndarray, weights_BT: np.ndarray, K: int) -> np.ndarray:
  """[B, L] tokens a K-token greedy chain of an unrolled drafter accepts, from its per-step
  flags (``feature_train.greedy_steps_correct``: ``correct[k, b, p]``, step k at row p drafts
  after x_<=p+1+k and is right when it predicts x_{p+2+k}): the run of True over k, capped at
  K, for the chain drafted after x_<=p+1; -1 where x_{p+2}..x_{p+1+K} are not all answer tokens
  (``weights`` 1) of row p's own sequence (the target's feature at p is the head's context: a
  one-token prompt would otherwise let row p of one sequence count the next one's answer, which
  training weighs 0, ``feature_train.step_weights``)."""
  correct_KBT = np.asarray(correct_KBT, bool)
  if correct_KBT.shape[0] < K:
    raise ValueError(f"{correct_KBT.shape[0]} unrolled steps cannot measure a chain of K={K}.")
  B, L = correct_KBT.shape[1:]
  accepted = np.cumprod(correct_KBT[:K], axis=0).sum(0)
  answer = np.zeros((B, L + K + 2), bool)
  answer[:, :L] = np.asarray(weights_BT, np.float32) > 0
  window = np.lib.stride_tricks.sliding_window_view(answer[:, 2:], K, axis=1)[:, :L].all(-1)
  sequence = np.full((B, L + K + 2), -1)
  sequence[:, :L] = np.asarray(segments(weights_BT))
  window &= sequence[:, :L] == sequence[:, 1 + K : 1 + K + L]  # x_{p+1+K} in p's sequence.
  return np.where(window, accepted, -1)


def lookup_accepted(
  tokens_BL: np.ndarray, weights_BL: np.ndarray, K: int, max_ngram: int = 3, min_ngram: int = 1
) -> tuple[np.ndarray, np.ndarray]:
  """(accepted [B, L - 1], matched [B, L - 1]) of prompt lookup (``PromptLookupDrafter``) on
  packed answer rows, in ``accepted_run``'s layout: at t, the K-token chain it copies after
  x_<=t (the tokens that followed the most recent earlier occurrence of x_<=t's last n-gram,
  n = ``max_ngram`` down to ``min_ngram``, as many as x_<=t holds, up to K) and the run of
  them equal to x_{t+1}.., -1 where the K next tokens are not all answer tokens; ``matched``:
  whether it found an occurrence (proposes anything). On greedy answers that run is what the
  target accepts. The occurrence must lie in x_<=t's own sequence of the row (a packed row
  holds several back to back: a new one begins where a prompt token follows an answer
  token), as the sampler's row holds its own prompt and answer only."""
  tokens_BL = np.asarray(tokens_BL)
  answer_BL = np.asarray(weights_BL, np.float32) > 0
  B, L = tokens_BL.shape
  segment_BL = np.asarray(segments(answer_BL))
  source_BL = np.full((B, L), -1)  # Where the copied continuation after x_<=t begins.
  for n in range(min_ngram, max_ngram + 1):  # Longer n-grams override shorter, as there.
    if n > L:
      break
    windows = np.lib.stride_tricks.sliding_window_view(tokens_BL, n, axis=1)  # [B, M, n]
    M = L - n + 1
    earlier = np.arange(M)[:, None] < np.arange(M)[None, :]  # [j, s]: window j before s
    for b in range(B):
      same = (windows[b][:, None, :] == windows[b][None, :, :]).all(-1) & earlier
      same &= segment_BL[b, :M][:, None] == segment_BL[b, n - 1 :][None, :]
      found = same.any(0)
      last = M - 1 - np.argmax(same[::-1], axis=0)  # The most recent j for each suffix s.
      ends = np.arange(M) + n - 1  # Suffix s ends at t = s + n - 1.
      source_BL[b, ends[found]] = last[found] + n
  accepted = np.zeros((B, L - 1), int)
  for b, t in zip(*np.nonzero(source_BL[:, : L - 1] >= 0)):
    start = source_BL[b, t]
    count = min(t + 1 - start, K, L - 1 - t)
    same = tokens_BL[b, start : start + count] == tokens_BL[b, t + 1 : t + 1 + count]
    accepted[b, t] = count if same.all() else int(np.argmin(same))
  window = _answer_windows(answer_BL[:, 1:], K)
  return np.where(window, accepted, -1), source_BL[:, : L - 1] >= 0


def lookup_first(lookup_BT: np.ndarray, matched_BT: np.ndarray, head_BT: np.ndarray) -> np.ndarray:
  """[B, T] accepted counts of drafter 'feature+lookup' (``lookup_feature_drafter``): prompt
  lookup's (``lookup_accepted``) where it matched, the head's (in ``accepted_run``'s layout:
  ``chain_layout`` of ``accepted_unrolled``) elsewhere; -1 outside the windows."""
  both = np.where(matched_BT, lookup_BT, head_BT)
  return np.where(lookup_BT >= 0, both, -1)


def lookup_beside(lookup_BT: np.ndarray, matched_BT: np.ndarray, head_BT: np.ndarray) -> np.ndarray:
  """[B, T] accepted counts of the head's greedy chain and prompt lookup's copy proposed side
  by side, as two branches of one tree call of depth K (``lookup_first``'s layouts): greedy tree
  verification keeps the longer path that matches the target, so the larger of the two runs
  where lookup matched, the head's elsewhere; -1 outside the windows: what 'feature+lookup'
  with ``tree='chains:2xK'`` accepts (docs/training_on_answers.md, section 15)."""
  both = np.where(matched_BT, np.maximum(lookup_BT, head_BT), head_BT)
  return np.where(lookup_BT >= 0, both, -1)
