r"""The exactness certificate on a real pretrained target (SmolLM2-135M-Instruct).

The main certificate (``certify.py``) enumerates every continuation of a vocabulary-8 model.
A real model's 49,152 tokens are far too many to enumerate, so here the sampling is
restricted with top-k = k (default 4) for N = 3 new tokens: the warped target puts all its
mass on at most k^N continuations, which a tree of forward passes enumerates exactly:

  level 0   the prompt                         -> its k next tokens and their warped p
  level t   each of the k^t supported prefixes -> its k next tokens and their warped p
  P(x_1..x_N) = prod_t p(x_t | prompt, x_<t), the factors in float64.

Every factor comes from the target's own logits through the same decode protocol and
``warping.probabilities`` the sampler uses, one batched causal pass per level. The
speculative loop then draws ``n`` continuations (the rows of batched calls, each row
its own draws) with a real draft of the same weights (self-speculative: the target's first layers,
its final norm and head), and a G-test compares the counts with the enumeration
(``exactness.calibrated_g_test``: small cells pooled, the threshold from G's bootstrap
null; a draw outside the support fails outright). A
planted bug (``exactness.planted``: residual_from_p, resampling from p after a rejection)
must be rejected by the same test. It can only show where the draft's and the target's warped
supports overlap (sum min(p, q) > 0): SmolLM2's first 4 layers put their top 4 elsewhere at
the prompt, every draft token was rejected and the bug was invisible, hence the default of 12
layers (docs/certificate.md).
"""

from __future__ import annotations

import hashlib
import io
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specsamp import files
from specsamp.sampling import drafters, speculative, warping
from specsamp.testing import exactness


def support_distribution(
  target: Any, prompt: list[int], sampling: warping.SamplingConfig, new_tokens: int
) -> dict[tuple[int, ...], float]:
  """{continuation: probability} of every continuation of ``new_tokens`` tokens the warped
  target can produce after ``prompt`` (module docstring), in float64."""
  prefixes: dict[tuple[int, ...], float] = {(): 1.0}
  for _ in range(new_tokens):
    keys = list(prefixes)
    tokens = np.asarray([list(prompt) + list(key) for key in keys], np.int32)
    probs = np.asarray(exactness.last_distributions(target, jnp.asarray(tokens), sampling, 1))
    probs = probs[:, 0].astype(np.float64)
    probs /= probs.sum(-1, keepdims=True)
    grown = {}
    for key, row in zip(keys, probs):
      for token in np.flatnonzero(row > 0):
        grown[key + (int(token),)] = prefixes[key] * row[token]
    prefixes = grown
  return prefixes


def draw(
  target: Any,
  draft_layers: int,
  prompt: list[int],
  sampling: warping.SamplingConfig,
  *,
  new_tokens: int,
  num_draft_tokens: int,
  num_samples: int,
  seed: int,
  chunk: int = 256,
  cache_dir: str | None = None,
  cache_tag: str = "",
  log: Callable[[str], None] | None = None,
) -> np.ndarray:
  """[num_samples, new_tokens] continuations: the rows of batched speculative calls (``chunk``
  rows of the same prompt per call, each row its own draws; a batch-1 loop vmapped over keys
  turns every cache access into a gather and is 5x slower here). The draft is the target's
  first ``draft_layers`` layers. The weights enter the compiled program as arguments (a
  closure would bake 540 MB of constants into it).

  Chunk i draws with ``fold_in(key(seed), i)``. With ``cache_dir`` each chunk is saved there
  under a name that digests every setting it depends on (``chunk_file``; ``cache_tag`` for
  what the arguments do not show, such as a planted bug), and a rerun loads the
  chunks it has: a 10^5 run can be stopped and resumed without changing a single draw. A
  chunk of 512 rows peaked at 13.5 GB of host memory on a CPU (the [rows, 49,152]
  distributions of every scored and drafted position); 256 rows keep it about half that."""
  prompts = np.tile(np.asarray([prompt], np.int32), (chunk, 1))
  lengths = np.full((chunk,), len(prompt), np.int32)
  graphdef, state = nnx.split(target)

  @jax.jit
  def sample(state, key):
    model = nnx.merge(graphdef, state)
    out = speculative.speculative_generate(
      model,
      drafters.self_speculative(model, draft_layers),
      prompts,
      lengths,
      key,
      max_new_tokens=new_tokens,
      num_draft_tokens=num_draft_tokens,
      temperature=sampling.temperature,
      top_k=sampling.top_k,
      top_p=sampling.top_p,
      check_nan=False,
    )
    return out.tokens[:, len(prompt) : len(prompt) + new_tokens]

  settings = dict(
    prompt=prompt,
    sampling=sampling,
    draft_layers=draft_layers,
    new_tokens=new_tokens,
    num_draft_tokens=num_draft_tokens,
    seed=seed,
    chunk=chunk,
    tag=cache_tag,  # What else changes the draws, e.g. a planted bug.
  )
  chunks, start = [], time.perf_counter()
  for index in range(-(-num_samples // chunk)):
    path = cache_dir and os.path.join(cache_dir, chunk_file(settings, index))
    if path and os.path.exists(path):
      chunks.append(np.load(path))
      continue
    rows = np.asarray(sample(state, jax.random.fold_in(jax.random.key(seed), index)))
    if path:
      buffer = io.BytesIO()
      np.save(buffer, rows)
      files.write_atomically(path, buffer.getvalue())
    chunks.append(rows)
    if log:
      log(f"  chunk {index + 1}: {(index + 1) * chunk:,} rows, {time.perf_counter() - start:.0f} s")
  return np.concatenate(chunks)[:num_samples]


def chunk_file(settings: dict[str, Any], index: int) -> str:
  """The cache file name of one chunk of draws: a digest of every setting it depends on."""
  digest = hashlib.sha256(repr(sorted(settings.items())).encode()).hexdigest()[:16]
  return f"draws_{digest}_{index:05d}.npy"


def certify_real(
  target: Any,
  prompt: list[int],
  *,
  name: str = "SmolLM2",
  top_k: int = 4,
  temperature: float = 1.0,
  new_tokens: int = 3,
  num_draft_tokens: int = 2,
  draft_layers: int = 12,
  num_samples: int = 100_000,
  bug_samples: int | None = None,
  level: float = 1e-4,
  bugs: tuple[str, ...] = ("residual_from_p",),
  seed: int = 0,
  chunk: int = 256,
  cache_dir: str | None = None,
  log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
  """The real case, then each planted bug; a list of result dicts (``passed`` for each:
  the real case not rejected, a bug rejected). A bug draws ``bug_samples`` sequences
  (default ``num_samples``): a fault's G grows in proportion to n, so one rejected far above
  its threshold at fewer draws is rejected further at more."""
  sampling = warping.SamplingConfig(temperature, top_k=top_k)
  start = time.perf_counter()
  exact = support_distribution(target, prompt, sampling, new_tokens)
  log(
    f"enumerated {len(exact)} continuations of {new_tokens} tokens (top-k {top_k}, T "
    f"{temperature:g}) in {time.perf_counter() - start:.1f} s; total mass "
    f"{sum(exact.values()):.12f}"
  )
  cells = {key: i for i, key in enumerate(exact)}
  probs = np.append(np.asarray(list(exact.values())), 0.0)  # The last cell: outside.
  results = []
  for index, bug in enumerate((None,) + tuple(bugs)):
    start = time.perf_counter()
    with exactness.planted(bug):
      drawn = draw(
        target,
        draft_layers,
        prompt,
        sampling,
        new_tokens=new_tokens,
        num_draft_tokens=num_draft_tokens,
        num_samples=num_samples if bug is None or bug_samples is None else bug_samples,
        seed=seed + index,
        chunk=chunk,
        cache_dir=cache_dir,
        cache_tag=f"{name} {bug or ''}",
        log=log,
      )
    codes = np.asarray([cells.get(tuple(row), len(exact)) for row in drawn.tolist()])
    counts = np.bincount(codes, minlength=len(probs))
    null = exactness.fit_null(probs[None], int(counts.sum()), seed=seed + index)
    test = exactness.calibrated_g_test(counts, probs, level, null)
    rejected = test["rejected"]
    result = dict(
      test,
      case=f"{name} top-k={top_k} T={temperature:g} self{draft_layers} K={num_draft_tokens}"
      + (f" BUG={bug}" if bug else ""),
      n=int(counts.sum()),
      support=len(exact),
      seconds=time.perf_counter() - start,
      passed=rejected if bug else not rejected,
    )
    results.append(result)
    log(
      f"{result['case']}: n={result['n']:,} G={test['G']:.1f} threshold "
      f"{test['threshold']:.1f} -> {'PASS' if result['passed'] else 'FAIL'} "
      f"({result['seconds']:.0f} s)"
    )
  return results


def format_table(results: list[dict[str, Any]], level: float) -> str:
  lines = [
    f"| case | n | continuations | G | threshold (level {level:g}) | result |",
    "|---|---|---|---|---|---|",
  ]
  for r in results:
    verdict = (
      ("rejected, as it must be" if "BUG" in r["case"] else "pass") if r["passed"] else ("FAIL")
    )
    lines.append(
      f"| {r['case']} | {r['n']:,} | {r['support']} | {r['G']:.1f} | {r['threshold']:.1f} | "
      f"{verdict} |"
    )
  return "\n".join(lines)
