r"""The exactness certificate: speculative samples against the exactly enumerated target.

For a small target (vocabulary 8), every continuation of NEW_TOKENS tokens has a
probability we can compute exactly: the product of the warped target's
conditionals, from forward passes over every prefix (float64 products). The
certificate draws ``n`` continuations with the speculative loop for each case,
counts them, and runs a G-test of the counts against that distribution:

  G = 2 sum_cells O log(O / E),  cells expected < 5 times pooled into one,
  pass  <=>  G < threshold,

where the threshold is G's own (1 - level) quantile when the counts are drawn from the exact
distribution itself: a parametric bootstrap of the same rows and draws, fitted by a scaled
chi-square (``exactness.fit_null``). With many sparse cells (16 ragged rows x 4,096
continuations) the plain chi2.isf(level, cells - 1) sits below that quantile, and a case
would fail about 100 times more often than ``level`` says (docs/certificate.md, "Calibrated
thresholds"); the chi-square's threshold is kept in each result beside it.

A case is one choice of verifier (token, block) x drafter (a draft model, prompt
lookup, self-speculative, a draft model with a confidence stop) x draft-length
schedule (fixed, heuristic) x warping (T = 1, T = 0.7, top-k, top-p, all three)
x batch (1 row; 16 ragged rows of prompt lengths 1..6, whose cells are
(row, continuation)) x mesh (1 device; 2 data x 4 tensor with the target and
draft tensor-parallel under shard_map). Batch-1 runs are vmapped over keys:
each instance is a batch-1 loop with its own key.

Each family of cases has PLANTED BUGS that the same test must reject (G far above its
threshold), showing that it has the power to see a real fault: ``exactness.BUGS`` lists them
(``specsamp/testing/exactness.py``, the toolkit this certificate, the tests and the peer
comparisons share: the exact enumeration, the G-test and the bugs).

Proposal modes (``proposal_cases``): the feature head's chains and trees, its tokens
sampled from its real q or chosen greedily with one-hot q (``proposals.py``), shared head
and reduced draft vocabulary. Two faults that look like bugs are not, and no G-test can see
them: a head fed a wrong feature (a rejected branch's) stays exact, since q is still what it
drew from (tests/test_feature_drafter.py checks the head's inputs against the target's
features of the accepted sequence directly); and a SAMPLED token verified with a one-hot q
stays exact too (given the draws, each token is a point-mass proposal, independent of the
target's coins; it only accepts p(x) instead of min(1, p/q)): measured, G = 1498.5 against a
threshold of 1681.3 at 10^5 (docs/certificate.md).

Tree proposals (``tree_cases``): multi-draft chains, a token tree with distinct
siblings and a wide level of i.i.d. siblings, each verified by recursive
rejection sampling ('token') and traversal verification, at T = 1, T = 0.7 with
top-p, and top-k. The Trigram reads the token before each node from its
parent's slot, so a tree call that wires a node to the wrong parent, or a
compaction that leaves the accepted path out of place, samples from the wrong
distribution.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specsamp import sharding
from specsamp.models import TransformerConfig, transformer
from specsamp.sampling import drafters, speculative, warping
from specsamp.testing import exactness

VOCAB = 8
NEW_TOKENS = 4
NUM_DRAFT = 3
WARPINGS = {
  "T=1": warping.SamplingConfig(1.0),
  "T=0.7": warping.SamplingConfig(0.7),
  "top-k=3": warping.SamplingConfig(1.0, top_k=3),
  "top-p=0.8": warping.SamplingConfig(1.0, top_p=0.8),
  "T=0.7,k=4,p=0.9": warping.SamplingConfig(0.7, top_k=4, top_p=0.9),
  "T=0.7,p=0.9": warping.SamplingConfig(0.7, top_p=0.9),
}
CHAIN_WARPINGS = ("T=1", "T=0.7", "top-k=3", "top-p=0.8", "T=0.7,k=4,p=0.9")
VERIFIERS = ("token", "block")
DRAFTERS = ("model", "lookup", "self_speculative", "confidence_stop", "feature", "feature_vocab")
# Drafters that read the target Transformer (its layers or its features): not on the trigram.
TRANSFORMER_DRAFTERS = ("self_speculative", "feature", "feature_vocab")
SCHEDULES = ("fixed", "heuristic")
BATCHES = ("1", "ragged16")
MESHES = ("1", "2x4")
# Tree proposals (depth NUM_DRAFT): multi-draft chains, a token tree with distinct siblings,
# and a wide first level with i.i.d. siblings (duplicates happen, and must merge correctly).
TREES = ("chains:2x3", "tree:2,2,1", "tree:3,1,1/iid")
TREE_VERIFIERS = ("token", "traversal")
TREE_WARPINGS = ("T=1", "T=0.7,p=0.9", "top-k=3")
# Proposal modes (proposals.py): the feature head's chains and trees, sampled from its real q
# or greedy with one-hot q; the draft model's greedy proposals on the trigram.
PROPOSAL_DRAFTERS = ("feature", "feature_greedy", "feature_vocab", "feature_vocab_greedy")
# Prompt lookup where a row's last token or 2-gram occurred before, the head elsewhere
# (lookup_feature_drafter.py): copied tokens (point-mass q) and drawn ones in one proposal. Its
# n-grams start at 1 here, so that about half the short prompts' rows copy (the batch-1
# prompt's last token occurred before) and the others draw from the head.
LOOKUP_FEATURE_DRAFTERS = (
  "feature_lookup",
  "feature_lookup_greedy",
  "feature_lookup_confident",
  "feature_lookup_capped",  # The head drafts at most 2 of the K = 3 a copy proposes.
)
PROPOSAL_TREE = "tree:2,2,1"
# feature+lookup's copy (chain 0, point-mass q) beside the head's chain (chain 1, its real q).
SIDE_BY_SIDE_TREE = f"chains:2x{NUM_DRAFT}"
DYNAMIC_TREE = "dynamic:3,2,2"  # EAGLE-2: 3 nodes at depth 1, then the 2 best of 6 per depth.
PROPOSAL_WARPINGS = ("T=1", "T=0.7,k=4,p=0.9")
TREE_BUG = "tree:3,1,1"  # Where the tree bugs show: three distinct siblings, then chains.
# Parallel drafting (parallel_drafter.py): every q_k from one call, before any draft is drawn.
PARALLEL_DRAFTERS = ("parallel", "parallel_greedy", "parallel_seq", "parallel_head")
PARALLEL_WARPINGS = ("T=1", "T=0.7,k=4,p=0.9")
PARALLEL_MASK = VOCAB - 1  # The placeholder: a real row of the 8-token tables stands in.
SCOPES = ("full", "quick", "trees", "proposals", "parallel", "narrow")
# Batch-1 prompt: its last token occurred before, so prompt lookup proposes from the start.
PROMPT = (3, 6, 1, 3)
RAGGED_ROWS = 16
PROMPT_WIDTH = 6


@dataclasses.dataclass(frozen=True)
class Case:
  """One sampler configuration (and optionally a planted bug that must be rejected)."""

  model: str
  verifier: str
  drafter: str
  schedule: str
  warping: str
  batch: str
  mesh: str
  bug: str | None = None
  tree: str | None = None
  narrow: bool = False  # Narrow scoring (chain_step.score_narrow).

  @property
  def name(self) -> str:
    parts = [
      self.model,
      self.verifier,
      self.drafter,
      self.schedule,
      self.warping,
      f"batch={self.batch}",
      f"mesh={self.mesh}",
    ]
    if self.tree:
      parts.insert(1, f"tree={self.tree}")
    if self.narrow:
      parts.insert(1, "narrow")
    return " ".join(parts) + (f" BUG={self.bug}" if self.bug else "")


def all_cases(scope: str = "full") -> list[Case]:
  """The cases of a certificate, then the planted bugs (``bug_cases``).

  'full' (274 cases: 150 single-chain, 44 tree, 36 proposal-mode, 26 parallel, 5 narrow
  scoring, 13 bugs):
    trigram, 1 device: every verifier x drafter (model, lookup, confidence stop) x
      schedule x warping x batch (1, ragged 16): 120 cases;
    transformer, 1 device: every verifier x drafter (all six: self-speculative and the two
      feature heads included) x schedule, warpings in rotation, batches alternating: 24 cases;
    proposal modes (``proposal_cases``): 16 feature-head cases and 2 trigram ones, 5 of lookup
      where the context repeats with the head elsewhere, 4 of its copy beside the head's chain
      in one tree (``SIDE_BY_SIDE_TREE``) and that tree's planted ``copied_drawn_q``, and
      dynamic trees
      (``dynamic_cases``): 4 feature-head and 4 trigram cases;
    transformer, 2x4 mesh (shard_map tensor parallelism, 8 simulated devices on a CPU,
      ~10x slower again): every drafter at ragged batch 16, verifiers, schedules and
      warpings in rotation: 6 cases;
    narrow scoring (``narrow_cases``): 2 trigram and 2 transformer cases.
  'quick' (30 cases, what the test suite runs: 9 single-chain, 6 tree, 2 parallel, 1 narrow
  scoring, 12 bugs):
    each verifier x drafter once on the trigram (schedules, warpings and batches in rotation),
    self-speculative and the reduced-vocabulary feature head on the transformer, the quick
    tree cases (``tree_cases``) and proposal cases (``proposal_cases``: lookup with the head
    elsewhere on ragged rows, the shared-head feature tree, greedy proposals on the trigram, a
    dynamic tree on ragged rows), and the
    parallel drafter's quick cases (``parallel_cases``), the quick narrow-scoring case
    (``narrow_cases``). The mesh is left to the full
    certificate: the suite checks that the 2x4 mesh samples the same tokens as one device for
    the same key (tests/test_speculative.py), so its exactness follows from one device's.
    The tree bug 'sibling_against_p' is left to the full certificate:
    tests/test_tree_verification.py rejects the same fault by exact enumeration.
  'trees': the full certificate's tree cases and tree bugs only.
  'parallel': the full certificate's parallel-drafter cases and the bugs 'parallel_wrong_q' and
  'sequential_head_pass_q'.
  'narrow': the full certificate's narrow-scoring cases and the bug 'narrow_one_short'.
  'proposals': the full certificate's proposal-mode cases (``proposal_cases``, dynamic trees
  included) and the bugs 'chosen_real_q' (chain and dynamic tree) and 'copied_drawn_q' only.
  The transformer costs ~25x the trigram per sequence on a CPU, so its cases are the
  covering set above rather than the full product.
  """
  if scope not in SCOPES:
    raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}.")
  if scope == "trees":  # The full certificate's tree cases and tree bugs only.
    return tree_cases("full") + [c for c in bug_cases() if c.tree]
  if scope == "proposals":
    bugs = ("chosen_real_q", "copied_drawn_q")
    return proposal_cases("full") + [c for c in bug_cases() if c.bug in bugs]
  if scope == "narrow":
    return narrow_cases("full") + [c for c in bug_cases() if c.bug == "narrow_one_short"]
  if scope == "parallel":
    parallel_bugs = ("parallel_wrong_q", "sequential_head_pass_q")
    return parallel_cases("full") + [c for c in bug_cases() if c.bug in parallel_bugs]
  warpings = list(CHAIN_WARPINGS)
  table_drafters = [d for d in DRAFTERS if d not in TRANSFORMER_DRAFTERS]
  if scope == "full":
    cases = [
      Case("trigram", v, d, s, w, b, "1")
      for b in BATCHES
      for v in VERIFIERS
      for d in table_drafters
      for s in SCHEDULES
      for w in warpings
    ]
    cases += [
      Case("transformer", v, d, s, warpings[i % len(warpings)], BATCHES[i % 2], "1")
      for i, (v, d, s) in enumerate(itertools.product(VERIFIERS, DRAFTERS, SCHEDULES))
    ]
    cases += [
      Case(
        "transformer",
        VERIFIERS[i % 2],
        d,
        SCHEDULES[i // 2 % 2],
        warpings[(i + 2) % len(warpings)],
        "ragged16",
        "2x4",
      )
      for i, d in enumerate(DRAFTERS)
    ]
  else:
    cases = [
      Case("trigram", v, d, SCHEDULES[i % 2], warpings[i % len(warpings)], BATCHES[i // 2 % 2], "1")
      for i, (v, d) in enumerate(itertools.product(VERIFIERS, table_drafters))
    ]
    cases += [
      Case("transformer", "block", "self_speculative", "heuristic", "T=0.7", "ragged16", "1"),
      Case(
        "transformer", "block", "feature_vocab", "heuristic", "T=0.7,k=4,p=0.9", "ragged16", "1"
      ),
    ]
  bugs = bug_cases()
  if scope == "quick":  # The verifier's residual bug is enumerated exactly in the suite.
    bugs = [bug for bug in bugs if bug.bug != "sibling_against_p"]
  return (
    cases
    + tree_cases(scope)
    + proposal_cases(scope)
    + parallel_cases(scope)
    + narrow_cases(scope)
    + bugs
  )


def narrow_cases(scope: str = "full") -> list[Case]:
  """Narrow scoring (``chain_step.score_narrow``): each iteration scores the narrowest of
  1..K + 1 positions that holds every row's proposal, so proposals that stop early choose the
  call. 'full': prompt lookup (width 1 where no n-gram matches) on the trigram; the draft
  model's confidence stop on the trigram on ragged rows with the warping, block-verified, with
  HF's schedule; lookup with the confident head elsewhere on the transformer, token-verified
  at T=1 on ragged rows and block-verified with the warping at batch 1, and with the head
  capped at 2 of K = 3 (``head_draft_tokens``) token-verified at T=1 at batch 1 (5). 'quick':
  the trigram's confidence stop."""
  warped = "T=0.7,k=4,p=0.9"
  stop = Case("trigram", "block", "confidence_stop", "heuristic", warped, "ragged16", "1")
  stop = dataclasses.replace(stop, narrow=True)
  if scope == "quick":
    return [stop]
  cases = [
    Case("trigram", "token", "lookup", "fixed", "T=1", "1", "1"),
    stop,
    Case("transformer", "token", "feature_lookup_confident", "fixed", "T=1", "ragged16", "1"),
    Case("transformer", "block", "feature_lookup_confident", "heuristic", warped, "1", "1"),
    Case("transformer", "token", "feature_lookup_capped", "fixed", "T=1", "1", "1"),
  ]
  return [dataclasses.replace(c, narrow=True) for c in cases]


def parallel_cases(scope: str = "full") -> list[Case]:
  """The parallel drafter (one call, K placeholders' q). 'full': on the trigram, chain (token
  and block verification) and a small tree (token and traversal) x warping (T=1; T=0.7 with
  top-k and top-p) x batch (1, ragged 16), sampled (16); greedy proposals, a chain and a
  dynamic tree (2); on the transformer a chain and a tree (2), the sequential head's chains
  (token on ragged rows at T=1, block at the warping: 2) and trees (token on ragged rows at T=1,
  traversal at T=0.7 / top-p 0.9: 2), and the parallel feature head's chain and tree (2).
  'quick': a block-verified chain on ragged rows with the warping, and a token-verified tree at
  T=1."""
  if scope == "quick":
    return [
      Case("trigram", "block", "parallel", "heuristic", "T=0.7,k=4,p=0.9", "ragged16", "1"),
      Case("trigram", "token", "parallel", "fixed", "T=1", "1", "1", tree=PROPOSAL_TREE),
    ]
  cases = []
  for tree in (None, PROPOSAL_TREE):
    verifiers = VERIFIERS if tree is None else TREE_VERIFIERS
    for i, (v, w, b) in enumerate(itertools.product(verifiers, PARALLEL_WARPINGS, BATCHES)):
      schedule = SCHEDULES[i % 2] if tree is None else "fixed"
      cases.append(Case("trigram", v, "parallel", schedule, w, b, "1", tree=tree))
  cases += [
    Case("trigram", "block", "parallel_greedy", "fixed", "T=0.7,k=4,p=0.9", "ragged16", "1"),
    Case("trigram", "token", "parallel_greedy", "fixed", "T=1", "1", "1", tree=DYNAMIC_TREE),
    Case("transformer", "token", "parallel", "heuristic", "T=1", "ragged16", "1"),
    Case(
      "transformer", "traversal", "parallel", "fixed", "T=0.7,p=0.9", "1", "1", tree=PROPOSAL_TREE
    ),
    Case("transformer", "token", "parallel_seq", "heuristic", "T=1", "ragged16", "1"),
    Case("transformer", "block", "parallel_seq", "fixed", "T=0.7,k=4,p=0.9", "1", "1"),
    Case(
      "transformer", "token", "parallel_seq", "fixed", "T=1", "ragged16", "1", tree=PROPOSAL_TREE
    ),
    Case(
      "transformer",
      "traversal",
      "parallel_seq",
      "fixed",
      "T=0.7,p=0.9",
      "1",
      "1",
      tree=PROPOSAL_TREE,
    ),  # fmt: skip
    Case("transformer", "block", "parallel_head", "fixed", "T=0.7,k=4,p=0.9", "1", "1"),
    Case(
      "transformer", "token", "parallel_head", "fixed", "T=1", "ragged16", "1", tree=PROPOSAL_TREE
    ),
  ]
  return cases


def proposal_cases(scope: str = "full") -> list[Case]:
  """The feature head's chains and trees in both proposal modes (sampled from its real q;
  greedy with one-hot q), shared head and reduced vocabulary alternating. 'full': chain and
  tree x proposal x warping (T=1; T=0.7 with top-k and top-p) x batch (1, ragged 16) on the
  transformer (16), and the draft model's greedy proposals on the trigram, chain and tree
  (2). 'quick': the head's sampled tree, and greedy proposals in a tree on ragged rows on the
  trigram (the draft model's proposals go through the same ``proposals`` functions). Lookup
  where the context repeats and the head elsewhere (``feature_lookup``): 'full': a chain x
  verifier x warping x batch, sampled (4 on the transformer), and greedy proposals (1); the
  copy beside the head's chain in one tree, tree verifier x warping x batch (4), and its
  planted bug; 'quick': a sampled chain on ragged rows with the warping, block-verified."""
  lookup_quick = Case(
    "transformer", "block", "feature_lookup", "heuristic", "T=0.7,k=4,p=0.9", "ragged16", "1"
  )
  if scope == "quick":
    return [
      lookup_quick,
      Case("transformer", "token", "feature", "fixed", "T=1", "1", "1", tree=PROPOSAL_TREE),
      Case(
        "trigram",
        "traversal",
        "model_greedy",
        "fixed",
        "T=0.7,k=4,p=0.9",
        "ragged16",
        "1",
        tree=PROPOSAL_TREE,
      ),
    ] + dynamic_cases(scope)
  cases = []
  shapes = itertools.product((None, PROPOSAL_TREE), ("", "_greedy"), PROPOSAL_WARPINGS, BATCHES)
  for i, (tree, greedy, warping_name, batch) in enumerate(shapes):
    verifiers = VERIFIERS if tree is None else TREE_VERIFIERS
    drafter = ("feature", "feature_vocab")[(i >> 1 ^ i >> 2) & 1] + greedy
    schedule = SCHEDULES[i % 2] if tree is None else "fixed"
    verifier = verifiers[(i ^ i >> 1) & 1]
    cases.append(
      Case("transformer", verifier, drafter, schedule, warping_name, batch, "1", tree=tree)
    )
  cases += [
    Case("trigram", "block", "model_greedy", "heuristic", "T=0.7,k=4,p=0.9", "ragged16", "1"),
    Case("trigram", "token", "model_greedy", "fixed", "top-p=0.8", "1", "1", tree=PROPOSAL_TREE),
  ]
  for i, (warping_name, batch) in enumerate(itertools.product(PROPOSAL_WARPINGS, BATCHES)):
    verifier, schedule = VERIFIERS[(i ^ i >> 1) & 1], SCHEDULES[i % 2]
    cases.append(
      Case("transformer", verifier, "feature_lookup", schedule, warping_name, batch, "1")
    )
  cases.append(
    Case("transformer", "token", "feature_lookup_greedy", "fixed", "T=1", "ragged16", "1")
  )
  for i, (warping_name, batch) in enumerate(itertools.product(PROPOSAL_WARPINGS, BATCHES)):
    verifier = TREE_VERIFIERS[(i ^ i >> 1) & 1]
    cases.append(
      Case(
        "transformer",
        verifier,
        "feature_lookup",
        "fixed",
        warping_name,
        batch,
        "1",
        tree=SIDE_BY_SIDE_TREE,
      )
    )
  # Copied tokens verified with the head's q: rejected in the tree as in the chain.
  cases.append(
    Case(
      "transformer",
      "token",
      "feature_lookup",
      "fixed",
      "T=1",
      "1",
      "1",
      "copied_drawn_q",
      SIDE_BY_SIDE_TREE,
    )
  )
  return cases + dynamic_cases(scope)


def dynamic_cases(scope: str = "full") -> list[Case]:
  """Dynamic trees (EAGLE-2, greedy proposals with one-hot q, the token verifier). 'full': the
  head (shared and reduced vocabulary) x warping x batch on the transformer (4), and the draft
  model on the trigram x warping x batch (4). 'quick': the trigram on ragged rows."""
  if scope == "quick":
    return [
      Case("trigram", "token", "model_greedy", "fixed", "T=1", "ragged16", "1", tree=DYNAMIC_TREE)
    ]
  shapes = list(itertools.product(PROPOSAL_WARPINGS, BATCHES))
  return [
    Case(
      "transformer",
      "token",
      ("feature_greedy", "feature_vocab_greedy")[i % 2],
      "fixed",
      warping_name,
      batch,
      "1",
      tree=DYNAMIC_TREE,
    )
    for i, (warping_name, batch) in enumerate(shapes)
  ] + [
    Case("trigram", "token", "model_greedy", "fixed", w, b, "1", tree=DYNAMIC_TREE)
    for w, b in shapes
  ]


def tree_cases(scope: str = "full") -> list[Case]:
  """Tree proposals. 'full': every tree verifier x shape x warping x batch on the trigram
  (36), each verifier x shape once on the transformer (6; drafters and schedules in
  rotation), and two on the 2x4 mesh. 'quick' (the test suite): each shape once on the
  trigram at batch 1, with the verifiers and warpings in rotation (3; ragged rows under a
  tree are checked deterministically in tests/test_tree.py); every verifier x shape
  is checked by exact enumeration in tests/test_tree_verification.py, and the transformer's
  tree calls against plain sequences in tests/test_tree.py."""
  combos = list(itertools.product(TREE_VERIFIERS, TREES))
  if scope == "quick":
    return [
      Case("trigram", TREE_VERIFIERS[i % 2], "model", "fixed", w, "1", "1", tree=t)
      for i, (t, w) in enumerate(zip(TREES, TREE_WARPINGS))
    ]
  cases = [
    Case("trigram", v, "model", "fixed", w, b, "1", tree=t)
    for b in BATCHES
    for v, t in combos
    for w in TREE_WARPINGS
  ]
  cases += [
    Case(
      "transformer",
      v,
      ("model", "self_speculative", "confidence_stop")[i % 3],
      SCHEDULES[i % 2],
      TREE_WARPINGS[i % 3],
      BATCHES[i % 2],
      "1",
      tree=t,
    )
    for i, (v, t) in enumerate(combos)
  ]
  cases += [
    Case("transformer", v, "model", "heuristic", "T=0.7,p=0.9", "ragged16", "2x4", tree=t)
    for v, t in zip(TREE_VERIFIERS, TREES[1:])
  ]
  return cases


def bug_cases() -> list[Case]:
  """One planted bug per family, each in a setting where the fault has room to show."""
  return [
    Case("trigram", "token", "model", "fixed", "T=1", "1", "1", bug="residual_from_p"),
    Case("trigram", "block", "model", "fixed", "top-k=3", "1", "1", bug="unweighted_block"),
    Case("trigram", "block", "model", "fixed", "top-p=0.8", "1", "1", bug="coarse_le"),
    Case("trigram", "token", "model", "fixed", "T=0.7", "1", "1", bug="bits8"),
    Case("trigram", "token", "lookup", "fixed", "T=1", "1", "1", bug="misreported_q"),
    Case("trigram", "token", "model", "fixed", "T=1", "1", "1", "sibling_against_p", TREE_BUG),
    Case("trigram", "token", "model", "fixed", "top-k=3", "1", "1", "siblings_full_q", TREE_BUG),
    Case("trigram", "token", "model_greedy", "fixed", "T=1", "1", "1", bug="chosen_real_q"),
    Case(
      "trigram", "token", "model_greedy", "fixed", "T=1", "1", "1", "chosen_real_q", DYNAMIC_TREE
    ),
    Case("trigram", "token", "parallel", "fixed", "T=1", "1", "1", bug="parallel_wrong_q"),
    Case(
      "transformer", "token", "parallel_seq", "fixed", "T=1", "1", "1", "sequential_head_pass_q"
    ),
    Case("transformer", "token", "feature_lookup", "fixed", "T=1", "1", "1", "copied_drawn_q"),
    Case(
      "trigram",
      "token",
      "confidence_stop",
      "fixed",
      "T=1",
      "1",
      "1",
      "narrow_one_short",
      narrow=True,
    ),
  ]


# --- Models and prompts. ------------------------------------------------------------------------


@struct.dataclass
class TokenCache:
  """The tokens a Trigram has been fed, by position: its KV cache."""

  tokens: jax.Array  # [B, S]
  lengths: jax.Array  # [B]


@struct.dataclass
class Trigram:
  """A decode-protocol model whose next-token logits depend on the last TWO tokens:
  ``logits_PVV[previous, current]`` (previous = V at position 0). The token before the ones
  fed is read from the cache, so a loop that left a rejected draft token there, or fed a
  row at the wrong position, samples from the wrong distribution and fails the test; yet it
  costs a table lookup, so 10^6 sequences take seconds."""

  logits_PVV: jax.Array  # [V + 1, V, V]

  @property
  def vocab_size(self) -> int:
    return self.logits_PVV.shape[1]

  def init_cache(self, batch_size: int, max_length: int) -> TokenCache:
    return TokenCache(
      tokens=jnp.zeros((batch_size, max_length), jnp.int32),
      lengths=jnp.zeros((batch_size,), jnp.int32),
    )

  def __call__(self, tokens_BT, positions_BT, cache, tree=None):
    rows_B1 = jnp.arange(tokens_BT.shape[0])[:, None]
    if tree is None:
      slots_BT, previous_slots_BT = positions_BT, positions_BT - 1
      lengths_B = positions_BT[:, -1] + 1
    else:  # A tree call: the token before a node is its parent's, in the parent's slot.
      tree_slots = jnp.arange(tree.num_slots)
      mask_BTM = tree.mask_BTM(tokens_BT.shape[0])
      earlier_BTM = mask_BTM & (tree_slots[None, None, :] < tree.offsets_T[None, :, None])
      parent_BT = jnp.max(jnp.where(earlier_BTM, tree_slots, -1), axis=2)
      slots_BT = tree.root_B[:, None] + tree.offsets_T[None, :]
      previous_slots_BT = tree.root_B[:, None] + parent_BT
      lengths_B = tree.root_B + tree.num_slots
    fed_BS = cache.tokens.at[rows_B1, slots_BT].set(tokens_BT)
    previous_BT = jnp.where(
      previous_slots_BT >= 0,
      fed_BS[rows_B1, jnp.maximum(previous_slots_BT, 0)],
      self.vocab_size,
    )
    return (
      self.logits_PVV[previous_BT, tokens_BT],
      cache.replace(tokens=fed_BS, lengths=lengths_B),
    )

  def compact_cache(self, cache: TokenCache, source_BD, start_B) -> TokenCache:
    """Moves the tokens in slots ``source_BD`` to ``start_B`` onwards (decode protocol (f))."""
    rows_B1 = jnp.arange(source_BD.shape[0])[:, None]
    moved_BD = jnp.take_along_axis(cache.tokens, source_BD, axis=1)
    slots_BD = start_B[:, None] + jnp.arange(source_BD.shape[1])
    return cache.replace(tokens=cache.tokens.at[rows_B1, slots_BD].set(moved_BD, mode="drop"))


def model_config(num_layers: int = 2, tensor_parallel: str = "auto") -> TransformerConfig:
  """The certificate's tiny Transformer: vocabulary 8, 2 layers, grouped-query attention."""
  return TransformerConfig(
    vocab_size=VOCAB,
    num_layers=num_layers,
    d_model=32,
    num_heads=4,
    num_kv_heads=2,
    ffn_dim=64,
    dtype="float32",
    param_dtype="float32",
    tensor_parallel=tensor_parallel,
  )


def noisy_copy(model: Any, scale: float, seed: int) -> Any:
  """``model`` with Gaussian noise of ``scale`` x each tensor's std: a draft that agrees with
  the target often but not always. Keeps each parameter's sharding."""
  if isinstance(model, Trigram):
    noise = jax.random.normal(jax.random.key(seed), model.logits_PVV.shape)
    return Trigram(model.logits_PVV + scale * jnp.std(model.logits_PVV) * noise)
  return exactness.noisy_copy(model, scale, seed)


def feature_drafter_for(
  target: Any, reduced_vocabulary: bool, mesh: Any = None, parallel: bool = False
) -> Any:
  """A feature head (random weights, fixed seed) on ``target``'s layers 0 and 1: sharing the
  target's head, or over a reduced draft vocabulary of 5 of the 8 tokens in a scrambled map,
  so q is zero on three tokens the target can emit; ``parallel``: a parallel head (K drafts
  from one call)."""
  from specsamp.models import feature_head
  from specsamp.sampling.feature_drafter import FeatureDrafter

  config = feature_head.FeatureHeadConfig(
    feature_layers=(0, 1), draft_vocab_size=5 if reduced_vocabulary else 0, parallel=parallel
  )
  head = feature_head.create(config, target.config, mesh, seed=11)
  if reduced_vocabulary:
    head.draft_to_target[...] = jax.device_put(
      jnp.asarray([6, 1, 4, 0, 3], jnp.int32), head.draft_to_target[...].sharding
    )
  return FeatureDrafter(feature_head.FeatureDraftModel(head, target))


@dataclasses.dataclass
class Setup:
  """Target, draft and mesh for one (model, mesh) choice."""

  target: Any
  draft: Any
  mesh: jax.sharding.Mesh | None

  def drafter(self, name: str) -> drafters.Drafter:
    if name == "model":
      return drafters.ModelDrafter(self.draft)
    if name == "lookup":
      return drafters.PromptLookupDrafter(max_ngram=2)
    if name == "self_speculative":
      return drafters.self_speculative(self.target, 1)
    if name == "confidence_stop":
      return drafters.ModelDrafter(self.draft, confidence_threshold=0.3)
    if name == "model_greedy":
      return drafters.ModelDrafter(self.draft, proposal="greedy")
    if name == "parallel_head":  # The parallel feature head (transformer only).
      return feature_drafter_for(self.target, False, self.mesh, parallel=True)
    if name in PARALLEL_DRAFTERS:
      from specsamp.sampling.parallel_drafter import ParallelDrafter

      proposal = "greedy" if name.endswith("greedy") else "sampled"
      head = None
      if name == "parallel_seq":  # A sequential head over the pass (transformer only).
        head = exactness.perturbed_sequential_head(self.draft.config.d_model, seed=12)
      return ParallelDrafter(self.draft, mask_token_id=PARALLEL_MASK, proposal=proposal, head=head)
    if name in LOOKUP_FEATURE_DRAFTERS:
      from specsamp.sampling.lookup_feature_drafter import LookupFeatureDrafter

      head = feature_drafter_for(self.target, True, self.mesh).model
      proposal = "greedy" if name.endswith("greedy") else "sampled"
      stop = 0.3 if name.endswith("confident") else 0.0  # The head stops where unsure.
      return LookupFeatureDrafter(
        head,
        proposal=proposal,
        max_ngram=2,
        min_ngram=1,
        confidence_threshold=stop,
        head_draft_tokens=2 if name.endswith("capped") else 0,
      )
    if name in PROPOSAL_DRAFTERS:
      drafter = feature_drafter_for(self.target, "vocab" in name, self.mesh)
      return dataclasses.replace(drafter, proposal="greedy" if "greedy" in name else "sampled")
    known = DRAFTERS + PROPOSAL_DRAFTERS + PARALLEL_DRAFTERS + LOOKUP_FEATURE_DRAFTERS
    raise ValueError(f"Unknown drafter {name!r}; known: {known}.")

  def context(self) -> contextlib.AbstractContextManager:
    return sharding.use_mesh(self.mesh) if self.mesh is not None else contextlib.nullcontext()


def make_setup(model: str, mesh_name: str) -> Setup:
  """A trigram table pair (one device), or a tiny Transformer pair on one device or on a
  2 data x 4 tensor mesh (shard_map blocks), with the same weights either way."""
  if model == "trigram":
    if mesh_name != "1":
      raise ValueError("The trigram pair runs on one device.")
    target = Trigram(1.5 * jax.random.normal(jax.random.key(10), (VOCAB + 1, VOCAB, VOCAB)))
    return Setup(target, noisy_copy(target, 0.5, seed=11), None)
  if model != "transformer":
    raise ValueError(f"Unknown model {model!r}: 'trigram' or 'transformer'.")
  if mesh_name == "1":
    target = transformer.create(model_config(), seed=10)
    return Setup(target, noisy_copy(target, 0.6, seed=11), None)
  if len(jax.devices()) < 8:
    raise ValueError(
      f"The 2x4 mesh needs 8 devices, found {len(jax.devices())}; on a CPU set "
      "XLA_FLAGS=--xla_force_host_platform_device_count=8 before jax starts."
    )
  mesh = sharding.make_mesh({"data": 2, "tensor": 4}, jax.devices()[:8])
  target = transformer.create(model_config(tensor_parallel="shard_map"), mesh, seed=10)
  return Setup(target, noisy_copy(target, 0.6, seed=11), mesh)


def prompts(batch: str) -> tuple[np.ndarray, np.ndarray]:
  """(prompts [B, T], lengths [B]): the batch-1 prompt, or 16 ragged rows of lengths 1..6."""
  if batch == "1":
    return np.asarray([PROMPT], np.int32), np.asarray([len(PROMPT)], np.int32)
  rng = np.random.default_rng(0)
  lengths = np.asarray([1 + i % PROMPT_WIDTH for i in range(RAGGED_ROWS)], np.int32)
  rows = rng.integers(0, VOCAB, (RAGGED_ROWS, PROMPT_WIDTH)).astype(np.int32)
  rows[np.arange(PROMPT_WIDTH)[None, :] >= lengths[:, None]] = 0
  return rows, lengths


# --- Sampling. ----------------------------------------------------------------------------------


def _sampler(
  setup: Setup, case: Case, prompts_BT: np.ndarray, lengths_B: np.ndarray
) -> Callable[[jax.Array], jax.Array]:
  """keys [I] -> continuations [I, B, NEW_TOKENS]: I independent runs of the loop."""
  sampling = WARPINGS[case.warping]
  drafter = setup.drafter(case.drafter)
  rows_B = jnp.arange(len(lengths_B))
  offsets = jnp.arange(NEW_TOKENS)

  def one(key):
    out = speculative.speculative_generate(
      setup.target,
      drafter,
      prompts_BT,
      lengths_B,
      key,
      max_new_tokens=NEW_TOKENS,
      num_draft_tokens=NUM_DRAFT,
      tree=case.tree,
      temperature=sampling.temperature,
      top_k=sampling.top_k,
      top_p=sampling.top_p,
      verifier=case.verifier,
      schedule=case.schedule,
      check_nan=False,
      narrow_scoring=case.narrow,
    )
    return out.tokens[rows_B[:, None], jnp.asarray(lengths_B)[:, None] + offsets[None, :]]

  return exactness.throughput_compiled(jax.vmap(one))


def draw_counts(
  setup: Setup, case: Case, num_samples: int, seed: int = 0, chunk_rows: int = 1 << 16
) -> np.ndarray:
  """[B, V^N] counts of ``num_samples`` continuations (over all rows) drawn by the loop."""
  prompts_BT, lengths_B = prompts(case.batch)
  rows = len(lengths_B)
  runs = -(-num_samples // rows)
  # Equal chunks of at most ``chunk_rows`` rows: 10^5 draws at batch 1 are two of 50,000, not
  # 65,536 and a padded 65,536 (31% more sampling than asked for).
  chunks = -(-runs // max(chunk_rows // rows, 1))
  per_chunk = -(-runs // chunks)
  counts = np.zeros((rows, VOCAB**NEW_TOKENS), np.int64)
  with setup.context():
    sample = _sampler(setup, case, prompts_BT, lengths_B)
    keys = jax.random.split(jax.random.key(seed), runs)
    for start in range(0, runs, per_chunk):
      chunk = keys[start : start + per_chunk]
      if len(chunk) < per_chunk:  # One compiled shape: pad the last chunk, drop the extra.
        chunk = jnp.concatenate([chunk, keys[: per_chunk - len(chunk)]])
      drawn = exactness.codes(np.asarray(sample(chunk)), VOCAB)[: min(per_chunk, runs - start)]
      for row in range(rows):
        counts[row] += np.bincount(drawn[:, row], minlength=VOCAB**NEW_TOKENS)
  return counts


# --- The certificate. ---------------------------------------------------------------------------


@dataclasses.dataclass
class Result:
  case: Case
  n: int
  G: float
  cells: int
  threshold: float  # The calibrated one (exactness.fit_null); the chi-square's below.
  p_value: float
  impossible: int
  rejected: bool  # The G-test's verdict: G >= threshold (exactness.calibrated_g_test).
  seconds: float
  chi2_threshold: float = math.nan
  null_mean: float = math.nan
  null_sd: float = math.nan

  @property
  def z(self) -> float:
    """G in standard deviations of its null distribution, from the null's mean."""
    return (self.G - self.null_mean) / self.null_sd if self.null_sd > 0 else math.nan

  @property
  def passed(self) -> bool:
    """A real case passes when not rejected; a planted bug when rejected."""
    return self.rejected if self.case.bug else not self.rejected


def exact_rows(setup: Setup, batch: str, warping: str) -> np.ndarray:
  """[B, V^N]: each prompt row's exactly enumerated continuations under the warped target."""
  prompts_BT, lengths_B = prompts(batch)
  with setup.context():
    return np.stack(
      [
        exactness.exact_distribution(setup.target, tuple(row[:n]), WARPINGS[warping], NEW_TOKENS)
        for row, n in zip(prompts_BT.tolist(), lengths_B.tolist())
      ]
    )


def certify(
  cases: list[Case],
  num_samples: int,
  level: float,
  seed: int = 0,
  log: Callable[[str], None] = print,
  null_repeats: int = 1000,
) -> list[Result]:
  """Runs every case; ``level`` is each G-test's false-rejection probability, its threshold
  calibrated by ``null_repeats`` bootstrap values of G on the case's own rows and draws (one
  fit per exact distribution and number of draws, shared by the cases that have both)."""
  setups: dict[str, Setup] = {}
  exact: dict[tuple[str, ...], np.ndarray] = {}
  nulls: dict[tuple[Any, ...], exactness.NullFit] = {}
  results = []
  for index, case in enumerate(cases):
    start = time.perf_counter()
    if (case.model, case.mesh) not in setups:
      setups[case.model, case.mesh] = make_setup(case.model, case.mesh)
    setup = setups[case.model, case.mesh]
    key = (case.model, case.mesh, case.batch, case.warping)
    if key not in exact:
      exact[key] = exact_rows(setup, case.batch, case.warping)
    with exactness.planted(case.bug):
      counts = draw_counts(setup, case, num_samples, seed=seed + index)
    # Rows are sampled equally often: each row's exact distribution, weighted 1/B.
    draws_B = counts.sum(axis=-1)
    null_key = (*key, tuple(draws_B.tolist()))
    if null_key not in nulls:
      nulls[null_key] = exactness.fit_null(exact[key], draws_B, null_repeats, seed=seed)
    test = exactness.calibrated_g_test(counts, exact[key] / len(draws_B), level, nulls[null_key])
    result = Result(case=case, n=int(counts.sum()), seconds=time.perf_counter() - start, **test)
    results.append(result)
    log(
      f"[{index + 1}/{len(cases)}] {case.name}: G={result.G:.1f} ({result.z:+.2f} sd) threshold="
      f"{result.threshold:.1f} (chi-square {result.chi2_threshold:.1f}) -> "
      f"{'PASS' if result.passed else 'FAIL'} ({result.seconds:.1f} s)"
    )
  return results


def null_check(
  cases: list[Case],
  num_samples: int,
  level: float,
  fresh: int = 20_000,
  null_repeats: int = 1000,
  log: Callable[[str], None] = print,
) -> str:
  """Are the thresholds honest? For each exact distribution the real ``cases`` test (model x
  batch x warping: the mesh changes nothing exact), fits the calibrated threshold as
  ``certify`` does and counts how many of ``fresh`` other bootstrap values of G exceed it and
  the chi-square's, at ``num_samples`` draws. Returns a Markdown table and, weighted by the
  cases that share each distribution, the false failures a whole run should expect."""
  shared: dict[tuple[str, str, str], list[Case]] = {}
  for case in cases:
    if case.bug is None:
      shared.setdefault((case.model, case.batch, case.warping), []).append(case)
  setups: dict[str, Setup] = {}
  lines = [
    "| model | batch | warping | cases | cells | null mean, sd | calibrated threshold | "
    "exceeded | chi-square's | exceeded |",
    "|---|---|---|---|---|---|---|---|---|---|",
  ]
  expected = {"calibrated": 0.0, "chi-square": 0.0}
  for (model, batch, warped), group in shared.items():
    if model not in setups:
      setups[model] = make_setup(model, "1")
    probs_BC = exact_rows(setups[model], batch, warped)
    draws = -(-num_samples // len(probs_BC))
    fit = exactness.fit_null(probs_BC, draws, null_repeats, seed=0)
    values = exactness.null_g_values(probs_BC, draws, fresh, seed=1)
    weighted = probs_BC / len(probs_BC)  # The expected counts pool the case's cells.
    plain = exactness.g_test(weighted * draws * len(probs_BC), weighted, level)
    rates = {
      "calibrated": float(np.mean(values >= fit.threshold(level))),
      "chi-square": float(np.mean(values >= plain["threshold"])),
    }
    for name, rate in rates.items():
      expected[name] += rate * len(group)
    line = (
      f"| {model} | {batch} | {warped} | {len(group)} | {plain['cells']:,} | {fit.mean:,.0f}, "
      f"{fit.sd:,.0f} | {fit.threshold(level):,.1f} | {rates['calibrated']:.3%} | "
      f"{plain['threshold']:,.1f} | {rates['chi-square']:.3%} |"
    )
    log(line)
    lines.append(line)
  real = sum(len(group) for group in shared.values())
  return "\n".join(lines) + (
    f"\n\n{real} real cases, {num_samples:,} draws each, {fresh:,} fresh null values per "
    f"distribution: false failures expected per run {expected['calibrated']:.3f} with the "
    f"calibrated thresholds, {expected['chi-square']:.3f} with the chi-square's "
    f"(level {level:g} promises {real * level:.3f})."
  )


def format_table(results: list[Result], level: float) -> str:
  """The certificate as a Markdown table: case, n, G, G's distance from its null mean in null
  standard deviations, cells, the calibrated threshold and the chi-square's, verdict."""
  lines = [
    f"| case | n | G | z | cells | threshold (level {level:g}) | chi-square's | result |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for r in results:
    verdict = (
      ("rejected, as it must be" if r.rejected else "NOT REJECTED")
      if r.case.bug
      else ("pass" if r.passed else "FAIL")
    )
    g = "inf (impossible token drawn)" if math.isinf(r.G) else f"{r.G:.1f}"
    z = "-" if math.isinf(r.G) or math.isnan(r.z) else f"{r.z:+.1f}"
    lines.append(
      f"| {r.case.name} | {r.n:,} | {g} | {z} | {r.cells} | {r.threshold:.1f} | "
      f"{r.chi2_threshold:.1f} | {verdict} |"
    )
  return "\n".join(lines)
