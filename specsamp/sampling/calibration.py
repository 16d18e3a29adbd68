r"""How confident a drafter should be: temperature scaling for a dynamic tree's ranking.

A dynamic tree (``tree.dynamic``, EAGLE-2) keeps, per depth, the paths of highest joint draft
confidence. That ranking is only as good as the confidence is calibrated: at temperature 0 a
chosen token is accepted exactly when it is the target's argmax, and a distilled draft's
softmax, trained to match the target's whole distribution, spreads far more mass over the
runner-up tokens than the chance that one of them is the argmax. A beam over it trades the
draft's greedy path for prefixes that the target's argmax almost never takes (measured on the
default pair's feature head: ``dynamic:4x8`` accepted 4.34 tokens per call, fewer than the
greedy chain of the same depth, 6.92).

Temperature scaling (Guo et al. 2017, "On Calibration of Modern Neural Networks") fixes it
with one number: tau minimising the negative log-likelihood of the target's argmax a_t under
softmax(z_t / tau), z_t the drafter's logits at a context the target also scored:

  NLL(tau) = mean_t [ logsumexp(z_t / tau) - z_t[a_t] / tau ],

convex in beta = 1 / tau (a log-sum-exp of linear functions of beta, minus a linear one), so a
golden-section search over beta finds the minimum. The tree then ranks children by
softmax(log c / tau) (``proposals.rank_confidence``), and ``dynamic:WxD@tau`` names it.

Only the ranking changes: the tree's tokens are still chosen deterministically and verified
with their one-hot q, so tau can move acceptance, never exactness.

Functions:
  rank_nll(logits_NV, labels_N, tau)          the mean NLL above
  fit_rank_temperature(logits_NV, labels_N)   the tau that minimises it
  fit_drafter(drafter, target, tokens_BT)     the same, from a drafter and its target
  needs_fit(spec) / fitted(spec, tau) / unfitted(spec)   a tree spec 'dynamic:WxD@fit', whose
      tau is fitted where it runs (the drafter benchmark, the sample job)
  drafter.first_draft_logits(target, tokens_BT)   a drafter's first-draft-position logits
      along a text the target scores in the same pass, with the target's argmax there
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

TAU_RANGE = (0.01, 10.0)  # The search interval of fit_rank_temperature.
FIT = "@fit"  # A dynamic tree spec's suffix: rank at the drafter's fitted temperature.


def needs_fit(spec: str) -> bool:
  """Whether a tree spec asks for its rank temperature to be fitted ('dynamic:WxD@fit')."""
  return spec.strip().endswith(FIT)


def unfitted(spec: str) -> str:
  """The spec without '@fit' (ranking at tau = 1): its shape, for checks before the fit."""
  return spec.strip()[: -len(FIT)] if needs_fit(spec) else spec


def fitted(spec: str, tau: float) -> str:
  """The spec with '@fit' replaced by the fitted temperature."""
  return f"{unfitted(spec)}@{tau:.4g}" if needs_fit(spec) else spec


def rank_nll(logits_NV: Any, labels_N: Any, tau: float) -> float:
  """Mean negative log-likelihood of ``labels_N`` under softmax(logits_NV / tau)."""
  scaled_NV = jnp.asarray(logits_NV, jnp.float32) / tau
  log_p_NV = jax.nn.log_softmax(scaled_NV, axis=-1)
  picked_N = jnp.take_along_axis(log_p_NV, jnp.asarray(labels_N)[:, None], axis=-1)[:, 0]
  return float(-jnp.mean(picked_N))


def fit_rank_temperature(
  logits_NV: Any, labels_N: Any, *, tau_range: tuple[float, float] = TAU_RANGE, steps: int = 60
) -> float:
  """The temperature tau in ``tau_range`` minimising ``rank_nll`` (golden-section search over
  beta = 1/tau, where the NLL is convex; module docstring)."""
  logits_NV, labels_N = np.asarray(logits_NV, np.float32), np.asarray(labels_N)
  if logits_NV.ndim != 2 or labels_N.shape != logits_NV.shape[:1] or not len(labels_N):
    raise ValueError(
      f"fit_rank_temperature needs logits [N, V] and labels [N] with N >= 1, got "
      f"{logits_NV.shape} and {labels_N.shape}."
    )
  if not np.isfinite(logits_NV).all():
    raise ValueError("fit_rank_temperature: the drafter's logits are not all finite.")
  low, high = 1.0 / tau_range[1], 1.0 / tau_range[0]
  golden = (math.sqrt(5.0) - 1.0) / 2.0

  def loss(beta: float) -> float:
    return rank_nll(logits_NV, labels_N, 1.0 / beta)

  a, b = low + (1 - golden) * (high - low), low + golden * (high - low)
  loss_a, loss_b = loss(a), loss(b)
  for _ in range(steps):
    if loss_a <= loss_b:
      high, b, loss_b = b, a, loss_a
      a = low + (1 - golden) * (high - low)
      loss_a = loss(a)
    else:
      low, a, loss_a = a, b, loss_b
      b = low + golden * (high - low)
      loss_b = loss(b)
  return 1.0 / ((low + high) / 2.0)


def fit_drafter(drafter: Any, target: Any, tokens_BT: Any) -> float:
  """The rank temperature of ``drafter`` against ``target``'s argmax on ``tokens_BT``."""
  logits_BSV, labels_BS = drafter.first_draft_logits(target, tokens_BT)
  return fit_rank_temperature(
    np.asarray(logits_BSV).reshape(-1, logits_BSV.shape[-1]), np.asarray(labels_BS).reshape(-1)
  )
