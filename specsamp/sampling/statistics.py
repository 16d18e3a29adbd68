"""What a speculative run counts, on device, and its host-side summary.

Every statistic counts what was APPENDED to the rows (``count_appended``): tokens a
row discards after its EOS are neither accepted nor proposed, so tokens per target
call is what the rows received. For a tree proposal, positions are depths, and
``proposed`` counts the nodes proposed.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from specsamp.sampling.autoregressive import GenerationOutput


@struct.dataclass
class SpeculativeOutput(GenerationOutput):
  """Tokens and on-device statistics of a speculative run.

  Attributes (besides GenerationOutput's tokens, lengths, num_generated, and
  model_calls, which counts TARGET calls, prefill included):
    draft_calls: scalar, draft model calls (prefill included).
    scored_tokens: scalar, positions per row the target's scoring calls ran on, over all
      iterations (prefill not included): K + 1 each for a chain, fewer with narrow scoring.
    iterations: [B] draft-score-verify iterations in which the row was active.
    accepted_histogram: [B, K+1] count of iterations that appended 0..K draft tokens.
    uncapped_histogram: [B, K+1] the same count over the iterations whose draft limit
      max_new_tokens did not lower (a row's last ones): the per-iteration law the automatic
      draft length predicts from (``draft_length.iterations_until_done`` applies the cap).
    accepted_at_position: [B, K] iterations in which draft token t was accepted and appended.
    verified_at_position: [B, K] iterations in which draft token t was proposed and
      reached (every earlier one accepted), before any EOS: the denominators of acceptance.
    proposed: [B] draft tokens proposed in all (a block cut by EOS counts its tokens up to
      the EOS).
    accepted_at_rank: [B, R] iterations' accepted draft nodes of sibling rank r (0: a
      parent's first child; R: the most children a node of the tree has, 1 for a chain),
      as the verifier accepted them (before any EOS cut).
    reached_at_rank: [B, R] proposed nodes of rank r whose parent was accepted (or was the
      root): the denominators of the acceptance per sibling rank, which shapes Sequoia
      trees (``tree.sequoia``).
    nan_logits: [B] bool, a model produced NaN logits for the row.

  Every statistic counts what was appended to the rows: tokens a row discards after its
  EOS are not counted as accepted, so ``tokens_per_target_call`` is what the rows
  received per iteration (see ``count_appended``). Fully replicated, like the tokens:
  any host of a multi-host mesh can read them.
  """

  draft_calls: jax.Array
  scored_tokens: jax.Array
  iterations: jax.Array
  accepted_histogram: jax.Array
  uncapped_histogram: jax.Array
  accepted_at_position: jax.Array
  verified_at_position: jax.Array
  proposed: jax.Array
  nan_logits: jax.Array
  accepted_at_rank: jax.Array
  reached_at_rank: jax.Array

  @property
  def target_calls(self) -> jax.Array:
    return self.model_calls

  def summary(self) -> dict[str, Any]:
    """Host-side statistics over all rows."""
    return summarize([self])


def summarize(outputs: list[SpeculativeOutput]) -> dict[str, Any]:
  """Statistics over all rows of one or more speculative runs (e.g. one per prompt batch)."""
  widths = sorted({np.asarray(o.accepted_at_position).shape[-1] for o in outputs})
  if len(widths) > 1:  # NumPy's concatenate error said nothing of why.
    raise ValueError(
      f"summarize pools runs of one draft length K; these have K in {widths}: summarize each "
      "K's runs apart."
    )
  pooled = lambda name: np.concatenate([np.asarray(getattr(o, name)) for o in outputs]).sum(0)
  histogram, at_position = pooled("accepted_histogram"), pooled("accepted_at_position")
  reached = pooled("verified_at_position")
  iterations = max(int(histogram.sum()), 1)
  num_draft_tokens = at_position.shape[0]
  accepted = float((histogram * np.arange(num_draft_tokens + 1)).sum())
  proposed = float(pooled("proposed"))
  # Every active row-iteration appends at least one token; together they are all generated.
  generated = float(sum(np.asarray(o.num_generated).sum() for o in outputs))
  return {
    "num_draft_tokens": num_draft_tokens,
    "target_calls": int(sum(int(o.target_calls) for o in outputs)),
    "draft_calls": int(sum(int(o.draft_calls) for o in outputs)),
    # The scoring call's mean width (K + 1 without narrow scoring), prefill not counted.
    "mean_scored_tokens": sum(int(o.scored_tokens) for o in outputs)
    / max(sum(int(o.target_calls) - 1 for o in outputs), 1),
    "row_iterations": int(histogram.sum()),
    "accepted_histogram": histogram.tolist(),
    # P(draft token t accepted), t = 1..K, and P(accepted | t-1 accepted).
    "acceptance_at_position": (at_position / iterations).tolist(),
    "conditional_acceptance_at_position": (at_position / np.maximum(reached, 1)).tolist(),
    # Fraction of proposed draft tokens accepted, mean proposal length, and mean tokens per
    # target call (bonus included).
    "acceptance_rate": accepted / max(proposed, 1.0),
    "mean_draft_length": proposed / iterations,
    # alpha: P(a draft token is accepted | it was verified), pooled over positions; the
    # i.i.d. acceptance of Leviathan et al. that predicts tokens per call.
    "alpha": float(at_position.sum() / max(reached.sum(), 1)),
    "tokens_per_target_call": generated / iterations,
    # P(the parent's rank-r child is the accepted one | the parent was accepted, that child
    # proposed): Sequoia's acceptance vector, r = 0, 1, ...
    "acceptance_at_rank": (
      pooled("accepted_at_rank") / np.maximum(pooled("reached_at_rank"), 1)
    ).tolist(),
    "generated_per_row": np.concatenate([np.asarray(o.num_generated) for o in outputs]).tolist(),
  }


def row_alphas(outputs: list[SpeculativeOutput]) -> list[float]:
  """Each row's alpha, pooled over the runs (row b of every output): accepted over verified
  draft tokens, 0 for a row that verified none."""
  pooled = lambda name: sum(np.asarray(getattr(o, name)).sum(-1) for o in outputs)
  accepted, verified = pooled("accepted_at_position"), pooled("verified_at_position")
  return [float(a) for a in accepted / np.maximum(verified, 1)]


STATISTICS = (
  "iterations",
  "accepted_histogram",
  "uncapped_histogram",
  "accepted_at_position",
  "verified_at_position",
  "proposed",
  "accepted_at_rank",
  "reached_at_rank",
)


def count_appended(
  active_B,
  proposed_B,
  accepted_B,
  count_B,
  num_draft_tokens: int,
  num_proposed_B=None,
  ranks=None,
  capped_B=None,
) -> dict:
  """One iteration's statistics (the fields of STATISTICS), counting what was APPENDED.

  The verifier accepted n = ``accepted_B`` of k = ``proposed_B`` drafts, and c =
  ``count_B`` <= n + 1 tokens were appended (fewer when EOS came inside the accepted
  drafts; max_new_tokens never cuts, the draft limit sees to that). A cut block counts
  as a proposal of its c tokens, all accepted: tokens discarded after EOS are neither
  accepted nor proposed, and tokens per target call is what the rows received.

  For a tree, ``proposed_B`` is the deepest proposed position (the denominators of
  acceptance per position) and ``num_proposed_B`` the nodes proposed (``proposed``).
  ``ranks``: (accepted_BR, reached_BR), the step's counts per sibling rank
  (``tree_step.rank_counts``); a chain's, rank 0 only, follow from the verdict.
  ``capped_B``: the rows whose draft limit max_new_tokens lowered this iteration (None:
  none); they are left out of ``uncapped_histogram``.
  """
  active_i32 = active_B.astype(jnp.int32)
  positions_G = jnp.arange(num_draft_tokens)[None, :]
  kept_B = jnp.minimum(accepted_B, count_B)  # Draft tokens appended.
  cut_B = count_B <= accepted_B
  realised_proposed_B = jnp.where(cut_B, count_B, proposed_B)
  if ranks is None:  # A chain: its one child per depth is rank 0.
    ranks = (accepted_B[:, None], jnp.minimum(proposed_B, accepted_B + 1)[:, None])
  accepted_BR, reached_BR = ranks
  histogram_BG = active_i32[:, None] * jax.nn.one_hot(kept_B, num_draft_tokens + 1, dtype=jnp.int32)
  uncapped_B = jnp.ones_like(active_B) if capped_B is None else ~capped_B
  return {
    "accepted_at_rank": active_i32[:, None] * accepted_BR.astype(jnp.int32),
    "reached_at_rank": active_i32[:, None] * reached_BR.astype(jnp.int32),
    "iterations": active_i32,
    "accepted_histogram": histogram_BG,
    "uncapped_histogram": histogram_BG * uncapped_B.astype(jnp.int32)[:, None],
    "accepted_at_position": active_i32[:, None] * (positions_G < kept_B[:, None]),
    "verified_at_position": active_i32[:, None]
    * ((positions_G < realised_proposed_B[:, None]) & (positions_G <= accepted_B[:, None])),
    "proposed": active_i32
    * (
      realised_proposed_B if num_proposed_B is None else jnp.where(cut_B, count_B, num_proposed_B)
    ),
  }
