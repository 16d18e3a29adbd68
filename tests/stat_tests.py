"""Goodness-of-fit helpers for the exact-distribution tests."""

import numpy as np
from scipy import stats


def g_test_p_value(observed: dict, expected: dict, min_expected: float = 5.0) -> float:
  """G-test of observed counts against exact probabilities.

  Cells expected fewer than ``min_expected`` times are pooled into one cell, so
  the chi-square approximation holds. An observed cell of probability 0 gives
  p-value 0.
  """
  total = sum(observed.values())
  if any(expected.get(cell, 0.0) <= 0 for cell in observed):
    return 0.0
  big = [cell for cell, p in expected.items() if p * total >= min_expected]
  small = [cell for cell, p in expected.items() if 0 < p * total < min_expected]
  f_obs = [observed.get(cell, 0) for cell in big]
  f_exp = [expected[cell] * total for cell in big]
  if small:
    f_obs.append(sum(observed.get(cell, 0) for cell in small))
    f_exp.append(sum(expected[cell] for cell in small) * total)
  f_obs, f_exp = np.asarray(f_obs, np.float64), np.asarray(f_exp, np.float64)
  f_exp *= f_obs.sum() / f_exp.sum()
  return float(stats.power_divergence(f_obs, f_exp, lambda_="log-likelihood").pvalue)


def count_rows(rows: np.ndarray) -> dict:
  cells, counts = np.unique(rows, axis=0, return_counts=True)
  return {tuple(int(t) for t in cell): int(n) for cell, n in zip(cells, counts)}
