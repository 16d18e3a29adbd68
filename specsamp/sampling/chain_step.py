r"""One iteration's draft-score-verify for a CHAIN of draft tokens (Chen et al. Algorithm 2).

For a row of n tokens, whose caches hold positions 0..n-2:

  1. Draft: the drafter proposes up to K tokens x~_1..x~_K with the distributions q_t they
     were drawn from, k_b <= K of them for row b (its draft limit, or fewer if it stops).
  2. Score: ONE target call on [x_{n-1}, x~_1..x~_K] at positions n-1..n-1+K gives
     p_1..p_{K+1}.
  3. Verify (``verification.py``: token-wise, block, or argmax at temperature 0; 'synthetic'
     accepts at a fixed rate for benchmarks, not exact) the first k_b tokens: n accepted
     draft tokens and one emitted token per row.

The loop appends, rolls both caches back and counts (``speculative.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from specsamp.sampling import model_protocol, threefry, verification
from specsamp.sampling.step import StepInput, StepResult
from specsamp.sampling.warping import SamplingConfig, probabilities

VERIFIERS = ("token", "block")  # A user's choice of exact chain verifier.


@dataclasses.dataclass(frozen=True)
class ChainStep:
  """The chain step's static settings (hashable); calling it runs one step.

  Attributes:
    num_draft_tokens: K, the most draft tokens per iteration.
    sampling: the warping both models sample with.
    verifier: 'token', 'block' or 'synthetic' (temperature 0 verifies by argmax).
  """

  num_draft_tokens: int
  sampling: SamplingConfig
  verifier: str
  narrow: bool = False

  @property
  def widths(self) -> tuple[int, ...]:
    """The scoring calls' widths this step compiles: K + 1 only, or with ``narrow`` each of
    1..K + 1 (``scoring_width``)."""
    full = self.num_draft_tokens + 1
    return tuple(range(1, full + 1)) if self.narrow else (full,)

  @property
  def ranks(self) -> int:
    return 1

  def verify_fn(self, synthetic_acceptance: jax.Array) -> verification.Verifier:
    if self.verifier == "synthetic":  # Benchmarks: acceptance with a fixed rate, not exact.
      return verification.synthetic_verifier(synthetic_acceptance)
    return verification.VERIFIERS["argmax" if self.sampling.greedy else self.verifier]

  def __call__(
    self,
    target: Any,
    drafter: Any,
    inputs: StepInput,
    key: jax.Array,
    synthetic_acceptance: jax.Array,
  ) -> StepResult:
    """Draft up to K tokens, score K+1 positions in one target call, verify."""
    lengths_B = inputs.lengths
    rows_B = jnp.arange(lengths_B.shape[0])
    with jax.named_scope("draft"):
      proposal, drafter_state = drafter.propose(
        inputs.drafter_state,
        inputs.tokens,
        lengths_B,
        threefry.fold_in(key, 0),
        self.num_draft_tokens,
        inputs.limit,
        self.sampling,
        target.vocab_size,
      )
      proposed_B = jnp.minimum(proposal.num_proposed, inputs.limit)
    with jax.named_scope("score"):
      last_B = inputs.tokens[rows_B, lengths_B - 1]
      width = scoring_width(proposed_B, self.widths)
      target_probs_BG1V, target_cache, features, target_nan_B = score_narrow(
        target,
        jnp.concatenate([last_B[:, None], proposal.tokens], axis=1),
        lengths_B[:, None] - 1 + jnp.arange(self.num_draft_tokens + 1),
        inputs.target_cache,
        drafter.feature_layers,
        self.widths,
        width,
        self.sampling,
      )
      # The scored positions' features: a feature head's next input (observe: a no-op else).
      drafter_state = drafter.observe(drafter_state, features, lengths_B - 1)
    with jax.named_scope("verify"):
      verdict = self.verify_fn(synthetic_acceptance)(
        threefry.fold_in(key, 1),
        proposal.tokens,
        proposal.probs,
        target_probs_BG1V,
        proposed_B,
      )
    return StepResult(
      path_tokens=proposal.tokens,
      num_accepted=verdict.num_accepted,
      next_token=verdict.next_token,
      draft_depth=proposed_B,
      num_proposed=proposed_B,
      target_cache=target_cache,
      drafter_state=drafter_state,
      draft_calls=proposal.model_calls,
      nan=target_nan_B | proposal.nan,
      scored_tokens=jnp.asarray(self.widths, jnp.int32)[width],
    )


def scoring_width(proposed_B: jax.Array, widths: tuple[int, ...]) -> jax.Array:
  """The index into ``widths`` (ascending) of the narrowest scoring call that holds every
  row's proposal and the position after it: 1 + max_b proposed_b tokens."""
  needed = 1 + jnp.max(proposed_B)
  return jnp.sum(jnp.asarray(widths, jnp.int32) < needed).astype(jnp.int32)


def score_narrow(
  target: Any,
  tokens_BG1: jax.Array,
  positions_BG1: jax.Array,
  cache: Any,
  capture_layers: tuple[int, ...],
  widths: tuple[int, ...],
  index: jax.Array,
  sampling: SamplingConfig | None = None,
) -> tuple[jax.Array, Any, jax.Array | None, jax.Array]:
  """The scoring call on the first ``widths[index]`` of the G + 1 tokens (``lax.switch``: one
  compiled call per width, only the chosen one runs), its logits (with ``sampling``: the
  warped target distributions p, computed at the scored positions only) and features padded
  back to G + 1 positions with zeros, the cache, and which rows' logits held NaN. A padded
  position lies past every row's proposal, so nothing reads it: the verifier stops at a row's
  count, the loop appends at most count + 1 tokens, and the cache entries it skipped lie past
  every row's new length. Warping inside the call matters at top-p: sorting 49,152 logits
  costs about 0.7 ms a position on a 2-core CPU, so a 9-wide warp of a 3-wide call wastes 4 ms
  an iteration (docs/benchmarks.md, "Two draft lengths")."""
  full = tokens_BG1.shape[1]

  def call(width: int):
    def scored(cache):
      out = model_protocol.score(
        target, tokens_BG1[:, :width], positions_BG1[:, :width], cache, capture_layers
      )
      values = out.logits if sampling is None else probabilities(out.logits, sampling)
      pad = lambda x: None if x is None else jnp.pad(x, ((0, 0), (0, full - width), (0, 0)))
      return pad(values), out.cache, pad(out.features), model_protocol.has_nan(out.logits)

    return scored

  if len(widths) == 1:
    return call(widths[0])(cache)
  return jax.lax.switch(index, [call(w) for w in widths], cache)
