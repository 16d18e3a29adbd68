"""Drafters by name: what ``--config.speculative.drafter`` (the sample job) takes.

  draft        the pair's draft model (trained, or distilled from the target, on the first run)
  parallel     the pair's parallel draft (PARD style: K drafts from one call; distilled from
               the target with placeholders on the first run, ``distill.mode='parallel'``)
  parallel_seq the parallel draft with a sequential head (Hydra style): one call, then a small
               recurrence over the drafts lets q_k see x~_<k (trained on the frozen parallel
               draft on the first run, ``models/sequential_head.py``)
  parallel_head  the pair's feature head drafting K tokens from one call (DFlash / PARD style:
               placeholders after the caught-up pairs; trained on the first run)
  feature      the pair's feature head on the target's features (EAGLE style, trained on the
               first run)
  feature+lookup    prompt lookup where the row's last n-gram (n = N, default 3, down to 2)
  feature+lookup:N  occurred before, the feature head elsewhere (``lookup_feature_drafter``)
  lookup       prompt lookup: the continuation of the row's last n-gram earlier in its own
  lookup:N     context, n = N (default 3) down to 1; no model, nothing to train
  self:L       self-speculative: the target's first L layers with its final norm and head;
               no second model, nothing to train

One parser for every job, so a name means one drafter everywhere; ``needs_draft`` and
``needs_feature_head`` say what the pair must prepare for it (a draft, a feature head, or
nothing). A self-speculative depth the target does not have is refused by ``EarlyExit``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from specsamp.sampling import drafters, lookup_feature_drafter

NAMES = (
  "draft",
  "parallel",
  "parallel_seq",
  "feature",
  "parallel_head",
  "feature+lookup",
  "feature+lookup:N",
  "lookup",
  "lookup:N",
  "self:L",
)
LOOKUP_NGRAM = 3  # prompt lookup's longest n-gram when the name gives none.


@dataclasses.dataclass(frozen=True)
class DrafterSpec:
  """A parsed drafter name: its kind ('draft', 'feature', 'lookup', 'self') and number (the
  n-gram of lookup, the layers of self; 0 where none)."""

  kind: str
  number: int = 0

  @property
  def needs_draft(self) -> bool:
    return self.kind in ("draft", "parallel", "parallel_seq")

  @property
  def draft_modes(self) -> list[str] | None:
    """The draft distillation modes the pair must prepare (None: the config's own)."""
    return ["parallel"] if self.kind in ("parallel", "parallel_seq") else None

  @property
  def needs_sequential_head(self) -> bool:
    return self.kind == "parallel_seq"

  @property
  def needs_feature_head(self) -> bool:
    return self.kind in ("feature", "feature_lookup")

  @property
  def needs_parallel_head(self) -> bool:
    return self.kind == "parallel_head"


def parse(name: str) -> DrafterSpec:
  """A drafter name (module docstring) -> its spec; a clear error for anything else."""
  kind, colon, number = str(name).strip().partition(":")
  if kind in ("draft", "parallel", "parallel_seq", "feature", "parallel_head") and not colon:
    return DrafterSpec(kind)
  if kind in ("lookup", "feature+lookup") and (not colon or number.isdigit()):
    ngram = int(number) if colon else LOOKUP_NGRAM
    if ngram >= (1 if kind == "lookup" else lookup_feature_drafter.MIN_NGRAM):
      return DrafterSpec("lookup" if kind == "lookup" else "feature_lookup", ngram)
  if kind == "self" and colon and number.isdigit() and int(number) >= 1:
    return DrafterSpec("self", int(number))
  raise ValueError(
    f"Unknown drafter {name!r}: use 'draft', 'parallel', 'parallel_seq', 'feature', "
    "'parallel_head', 'feature+lookup', 'feature+lookup:N' (N >= 2), 'lookup' or 'lookup:N' "
    "(N >= 1, the longest n-gram), or 'self:L' (L >= 1, the target's first L layers)."
  )


def trained_positions(
  spec: DrafterSpec, config: Any, read_checkpoints: bool = True
) -> tuple[int, str] | None:
  """(the draft positions a parallel drafter was trained to fill, the setting that says so).
  A parallel drafter fills positions past them with placeholders it never learned to read:
  still exact, rarely accepted. None for a sequential drafter (it drafts any K: each step
  reads the draft before it), for a loaded checkpoint that records no count, and for any
  checkpoint when ``read_checkpoints`` is False (the checks made before anything loads)."""
  found = None
  if spec.kind in ("parallel", "parallel_seq"):
    path = config.draft.get("parallel_checkpoint", "")
    if not path:
      found = (config.draft.train.distill.parallel_tokens, "draft.train.distill.parallel_tokens")
    elif read_checkpoints:
      from specsamp.training import checkpoint, shipped

      tokens = checkpoint.Checkpoints(shipped.resolve(path)).read_meta().get("parallel") or {}
      if tokens.get("tokens"):
        found = (int(tokens["tokens"]), f"draft.parallel_checkpoint={path}'s metadata")
    if spec.kind == "parallel_seq":
      head = int(config.draft.sequential_head.num_draft_tokens)
      if found is None or head < found[0]:
        found = (head, "draft.sequential_head.num_draft_tokens")
  elif spec.kind == "parallel_head" and not config.feature.get("parallel_checkpoint", ""):
    found = (int(config.feature.train.ttt_steps), "feature.train.ttt_steps")
  return found


def prepare_pair(spec: DrafterSpec, config: Any, workdir: str | None, log: Any = print) -> Any:
  """The pair ``config`` describes with what ``spec`` drafts from (its draft model, feature,
  parallel or sequential head), trained where missing (``jobs.pair.prepare``)."""
  from specsamp.experiments.jobs import pair as pair_lib

  return pair_lib.prepare(
    config,
    workdir,
    drafts=spec.needs_draft,
    draft_modes=spec.draft_modes,
    feature_head=spec.needs_feature_head,
    parallel_head=spec.needs_parallel_head,
    sequential_head=spec.needs_sequential_head,
    log=log,
  )


def make(
  spec: DrafterSpec,
  pair: Any,
  proposal: str = "sampled",
  mask_token_id: int = -1,
  confidence_threshold: float = 0.0,
  head_draft_tokens: int = 0,
) -> drafters.Drafter:
  """The drafter ``spec`` names, on a prepared pair (``jobs.pair.Pair``); a parallel draft
  needs its placeholder id (the config's ``draft.train.distill.mask_token``). A drafter with a
  model stops a row's draft after a token its model gave less than ``confidence_threshold``
  (0: never); prompt lookup's copies are point masses (q = 1), so the stop never ends them (a
  pair config's threshold for its head, configs/smollm2_pair.py's, runs lookup alone unchanged).
  ``head_draft_tokens`` caps the head's drafts of feature+lookup below K (0: K), copies keeping
  all K."""
  stop = dict(confidence_threshold=float(confidence_threshold))
  if head_draft_tokens and spec.kind != "feature_lookup":
    raise ValueError(
      f"--config.speculative.head_draft_tokens={head_draft_tokens}: only feature+lookup drafts "
      "with two drafters (K for its copies, this for its head); for one drafter set "
      "--config.speculative.num_draft_tokens instead, or use 0."
    )
  if spec.kind == "lookup":
    return drafters.PromptLookupDrafter(max_ngram=spec.number)
  if spec.kind == "draft":
    return drafters.ModelDrafter(pair.draft, proposal=proposal, **stop)
  if spec.kind in ("parallel", "parallel_seq"):
    from specsamp.sampling.parallel_drafter import ParallelDrafter

    head = pair.sequential_head if spec.kind == "parallel_seq" else None
    return ParallelDrafter(
      pair.drafts["parallel"], mask_token_id=mask_token_id, proposal=proposal, head=head, **stop
    )
  if spec.kind in ("feature", "parallel_head"):
    from specsamp.sampling.feature_drafter import FeatureDrafter

    head = pair.feature_head if spec.kind == "feature" else pair.parallel_head
    return FeatureDrafter(head, proposal=proposal, **stop)
  if spec.kind == "feature_lookup":
    return lookup_feature_drafter.LookupFeatureDrafter(
      pair.feature_head,
      proposal=proposal,
      max_ngram=spec.number,
      head_draft_tokens=int(head_draft_tokens),
      **stop,
    )
  return drafters.self_speculative(pair.target, spec.number, proposal=proposal, **stop)
