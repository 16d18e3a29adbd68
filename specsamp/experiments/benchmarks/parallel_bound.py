r"""Where a distilled parallel drafter tends: the target's own marginals (issue 39).

A parallel drafter draws every draft token x~_k of a call from a q_k fixed before the call, so
q_k cannot depend on x~_1 .. x~_{k-1}. Trained with the target as teacher on the target's own
continuations, its q_k tends to the target's marginal of the k-th token,

  m_k(x) = E_{y ~ p}[ p(x | c, y_1 .. y_{k-1}) ]        (m_1 = p(. | c)),

the law of what the target says at position k averaged over what it said before, which the
drafter does not see. The verifier, though, accepts x~_k against p(. | c, x~_<k), the target
given the drafts themselves, with probability min(1, p / m_k). At T > 0 the two differ wherever
the target's next token depends on the one before, so even this drafter is rejected: the
intrinsic loss of distilling a parallel drafter, which longer training toward m_k cannot
remove. At T = 0 the target is deterministic, m_k is the one-hot of its greedy path, and the
bound is K + 1.

It is the limit of a drafter trained toward the marginals, not a cap on every parallel drafter:
a q_k fixed before the call may accept more than m_k does. With x_1 = A or B at 1/3 and 2/3,
and x_2 = 0 after A and 1 after B, the marginal q_2 = (1/3, 2/3) accepts x~_2 with
probability 1/3 * 1/3 + 2/3 * 2/3 = 5/9, the point mass q_2 = (0, 1) with probability 2/3
(the sequential head, ``models/sequential_head.py``, gets past it by letting q_k see x~_<k).

``marginal_drafter`` measures it at one context: m_k from ``paths`` continuations the target
samples (the target's probabilities along each path, averaged: ``m^_k``), then ``chains`` draft
chains drawn from m^_1 x ... x m^_K, each verified token-wise against the target exactly, the
coins integrated out: E[accepted | chain] = sum_k prod_{i<=k} min(1, p_i(x~_i) / m^_i(x~_i)).
That is the exact expected count of the parallel drafter whose q_k is m^_k (a valid drafter:
m^_k is fixed before its draws), which tends to the marginal drafter's as ``paths`` grows.
scripts/parallel_bound.py runs it over the pair's held-out prompts.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specsamp.sampling import model_protocol, verification, warping


def tree_nodes(widths: Sequence[int]) -> int:
  """The drafts a tree of ``widths`` children per depth scores in one call."""
  return int(np.cumprod(widths).sum())


def _check(context: Sequence[int], paths: int, chains: int) -> None:
  if not len(context):
    raise ValueError("The context must hold at least one token.")
  if paths < 1 or chains < 1:
    raise ValueError(f"paths and chains must be >= 1, got {paths} and {chains}.")


def _prefill_and_marginals(model, context_T, path_key, depth, sampling, paths, rows):
  """(cache after the context at ``rows`` rows, p(. | c) [V], m^ [depth, V])."""
  length = context_T.shape[0]
  positions = jnp.broadcast_to(jnp.arange(length), (rows, length))
  cache = model.init_cache(rows, length + depth)
  logits_BTV, cache = model(jnp.broadcast_to(context_T, (rows, length)), positions, cache)[:2]
  p1_V = warping.probabilities(logits_BTV[0, -1][None], sampling)[0]
  # The target's own continuations: m^_k is the mean of its distributions along them.
  marginals, step_p_NV, path_cache = [p1_V], jnp.broadcast_to(p1_V, (paths, p1_V.shape[0])), cache
  for k in range(1, depth):
    token_N = jax.random.categorical(jax.random.fold_in(path_key, k), jnp.log(step_p_NV))
    at = jnp.full((rows, 1), length + k - 1)
    fed = jnp.zeros((rows, 1), jnp.int32).at[:paths, 0].set(token_N)
    logits_B1V, path_cache = model(fed, at, path_cache)[:2]
    step_p_NV = warping.probabilities(logits_B1V[:paths, 0], sampling)
    marginals.append(jnp.mean(step_p_NV, axis=0))
  return cache, p1_V, jnp.stack(marginals)


@functools.partial(jax.jit, static_argnums=(0, 4, 5, 6, 7))
def _marginal_drafter(
  model_static: Any,
  model_dynamic: Any,
  context_T: jax.Array,
  key: jax.Array,
  num_draft_tokens: int,
  sampling: warping.SamplingConfig,
  paths: int,
  chains: int,
) -> tuple[jax.Array, jax.Array]:
  model = model_protocol.merge_model(model_static, model_dynamic)
  rows = max(paths, chains)
  length = context_T.shape[0]
  path_key, chain_key = jax.random.split(key)
  cache, p1_V, m_KV = _prefill_and_marginals(
    model, context_T, path_key, num_draft_tokens, sampling, paths, rows
  )

  # Draft chains from m^_1 x ... x m^_K, verified against the target given the chain.
  draws_MK = jax.random.categorical(
    chain_key, jnp.log(m_KV)[None], shape=(chains, num_draft_tokens)
  )
  fed = jnp.zeros((rows, num_draft_tokens), jnp.int32).at[:chains].set(draws_MK)
  at = jnp.broadcast_to(length + jnp.arange(num_draft_tokens), (rows, num_draft_tokens))
  logits_BKV = model(fed, at, cache)[0][:chains, :-1]  # Position k + 1 given drafts 1..k.
  vocab = p1_V.shape[0]
  p_MKV = jnp.concatenate(
    [
      jnp.broadcast_to(p1_V, (chains, 1, vocab)),
      warping.probabilities(logits_BKV.reshape(-1, vocab), sampling).reshape(
        chains, num_draft_tokens - 1, vocab
      ),
    ],
    axis=1,
  )
  p_MK = jnp.take_along_axis(p_MKV, draws_MK[..., None], axis=2)[..., 0]
  m_MK = m_KV[jnp.arange(num_draft_tokens)[None], draws_MK]
  accept_MK = jnp.minimum(1.0, p_MK / m_MK)
  reached_MK = jnp.cumprod(accept_MK, axis=1)  # P(drafts 1..k all accepted | chain).
  return reached_MK.mean(axis=0), m_KV


@functools.partial(jax.jit, static_argnums=(0, 4, 5, 6, 7))
def _marginal_tree(
  model_static: Any,
  model_dynamic: Any,
  context_T: jax.Array,
  key: jax.Array,
  widths: tuple[int, ...],
  sampling: warping.SamplingConfig,
  paths: int,
  chains: int,
) -> jax.Array:
  model = model_protocol.merge_model(model_static, model_dynamic)
  rows = max(paths, chains)
  length = context_T.shape[0]
  path_key, chain_key = jax.random.split(key)
  cache, p1_V, m_DV = _prefill_and_marginals(
    model, context_T, path_key, len(widths), sampling, paths, rows
  )
  # Recursive rejection down the tree, one chain per row: at depth d the node's w_d children
  # are i.i.d. draws from m^_d; each is accepted with min(1, r / m^_d) against the node's
  # residual r, which a rejection turns into norm(max(0, r - m^_d)).
  r_MV = jnp.broadcast_to(p1_V, (chains, p1_V.shape[0]))
  alive_M = jnp.ones((chains,), bool)
  reached = []
  for d, width in enumerate(widths):
    m_V = m_DV[d]
    accepted_M = jnp.zeros((chains,), bool)
    token_M = jnp.zeros((chains,), jnp.int32)
    for j in range(width):
      draw_key, coin_key = jax.random.split(jax.random.fold_in(chain_key, 1000 * d + j))
      x_M = jax.random.categorical(draw_key, jnp.log(m_V), shape=(chains,))
      u_M = jax.random.uniform(coin_key, (chains,))
      trying_M = alive_M & ~accepted_M
      take_M = trying_M & (u_M * m_V[x_M] < r_MV[jnp.arange(chains), x_M])
      token_M = jnp.where(take_M, x_M, token_M)
      accepted_M = accepted_M | take_M
      residual_MV = verification.residual(r_MV, jnp.broadcast_to(m_V, r_MV.shape))
      r_MV = jnp.where((trying_M & ~take_M)[:, None], residual_MV, r_MV)
    alive_M = alive_M & accepted_M
    reached.append(alive_M.mean())
    if d + 1 < len(widths):  # The target after the accepted child.
      fed = jnp.zeros((rows, 1), jnp.int32).at[:chains, 0].set(token_M)
      logits_B1V, cache = model(fed, jnp.full((rows, 1), length + d), cache)[:2]
      r_MV = warping.probabilities(logits_B1V[:chains, 0], sampling)
  return jnp.stack(reached)


def marginal_tree(
  model: Any,
  context: Sequence[int],
  widths: Sequence[int],
  sampling: warping.SamplingConfig,
  key: jax.Array,
  *,
  paths: int = 64,
  chains: int = 64,
) -> dict[str, Any]:
  """The marginal drafter on a tree whose nodes at depth d have ``widths[d]`` children, drawn
  i.i.d. from m^_d and verified by recursive rejection (coins drawn, not integrated: a Monte
  Carlo estimate over ``chains``): {'accepted': [D] P(depth d reached), 'tokens_per_call',
  'nodes': sum_d prod_{i<=d} widths[i]}. Widths of 1 are ``marginal_drafter``'s chain."""
  widths = tuple(int(w) for w in widths)
  if not widths or min(widths) < 1:
    raise ValueError(f"widths must be one or more counts >= 1, got {widths}.")
  _check(context, paths, chains)
  reached = np.asarray(
    _marginal_tree(
      *model_protocol.split_model(model),
      jnp.asarray(context, jnp.int32),
      key,
      widths,
      sampling,
      paths,
      chains,
    ),
    np.float64,
  )
  return {
    "accepted": reached,
    "tokens_per_call": 1.0 + float(reached.sum()),
    "nodes": tree_nodes(widths),
  }


def marginal_drafter(
  model: Any,
  context: Sequence[int],
  num_draft_tokens: int,
  sampling: warping.SamplingConfig,
  key: jax.Array,
  *,
  paths: int = 64,
  chains: int = 64,
) -> dict[str, Any]:
  """The target-marginal parallel drafter at one context (module docstring): {'accepted': [K]
  P(draft token k accepted), 'tokens_per_call': 1 + their sum, 'marginals': [K, V] m^_k}.

  ``model`` follows the decode protocol (``model(tokens_BT, positions_BT, cache)``,
  ``init_cache``); ``context`` is a nonempty token sequence."""
  if num_draft_tokens < 1:
    raise ValueError(f"num_draft_tokens must be >= 1, got {num_draft_tokens}.")
  _check(context, paths, chains)
  reached_K, m_KV = _marginal_drafter(
    *model_protocol.split_model(model),
    jnp.asarray(context, jnp.int32),
    key,
    num_draft_tokens,
    sampling,
    paths,
    chains,
  )
  reached = np.asarray(reached_K, np.float64)
  return {
    "accepted": reached,
    "tokens_per_call": 1.0 + float(reached.sum()),
    "marginals": np.asarray(m_KV, np.float64),
  }


def over_contexts(
  model: Any,
  contexts: Sequence[Sequence[int]],
  num_draft_tokens: int,
  sampling: warping.SamplingConfig,
  *,
  widths: Sequence[int] | None = None,
  paths: int = 64,
  chains: int = 64,
  seed: int = 0,
) -> dict[str, Any]:
  """``marginal_drafter`` (or with ``widths``, ``marginal_tree`` of depth ``num_draft_tokens``)
  averaged over ``contexts``, with the standard error of the tokens per call over contexts."""
  if widths is not None and len(widths) != num_draft_tokens:
    raise ValueError(
      f"widths {tuple(widths)} must have num_draft_tokens={num_draft_tokens} depths."
    )

  def measure(context, key):
    if widths is None:
      return marginal_drafter(
        model, context, num_draft_tokens, sampling, key, paths=paths, chains=chains
      )
    return marginal_tree(model, context, widths, sampling, key, paths=paths, chains=chains)

  per_context = [
    measure(context, jax.random.fold_in(jax.random.key(seed), index))
    for index, context in enumerate(contexts)
  ]
  tokens = np.array([r["tokens_per_call"] for r in per_context])
  return {
    "num_draft_tokens": num_draft_tokens,
    "widths": list(widths) if widths is not None else [1] * num_draft_tokens,
    "contexts": len(per_context),
    "tokens_per_call": float(tokens.mean()),
    "standard_error": float(tokens.std(ddof=1) / np.sqrt(len(tokens))) if len(tokens) > 1 else 0.0,
    "accepted": np.mean([r["accepted"] for r in per_context], axis=0).tolist(),
  }
