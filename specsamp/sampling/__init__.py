"""Sampling: logits -> warped distributions, and the on-device generation loops.

warping.py         temperature / top-k / top-p / greedy, as pure functions.
model_protocol.py  the decode protocol any target or draft model follows.
autoregressive.py  autoregressive generation as one jitted while_loop.
verification.py    token-wise, block and greedy verification of a draft block.
tree.py            static tree shapes: multi-draft chains and token trees.
tree_verification.py  exact verifiers of a draft tree (recursive rejection sampling,
                   traversal verification, greedy).
drafters.py        where draft tokens (chains and trees) come from.
step.py            one iteration's interface: StepInput -> StepResult, a chain or a tree.
chain_step.py      one iteration's draft-score-verify for a chain of K draft tokens.
tree_step.py       one iteration's draft-score-verify-compact for a tree.
statistics.py      what a speculative run counts, and its summary.
speculative.py     speculative sampling as one jitted while_loop.
sampler.py         a Sampler keeping compiled loops and KV caches between calls.
draws.py           64-bit coins and categorical draws.
threefry.py        Threefry-2x32 key operations as fused array math (bit-identical to jax.random).
"""

from specsamp.sampling.autoregressive import GenerationOutput, generate
from specsamp.sampling.model_protocol import DecodeModel
from specsamp.sampling.sampler import Sampler
from specsamp.sampling.speculative import SpeculativeOutput, speculative_generate
from specsamp.sampling.warping import SamplingConfig, probabilities, sample, warp_logits

__all__ = [
  "GenerationOutput",
  "generate",
  "DecodeModel",
  "Sampler",
  "SamplingConfig",
  "probabilities",
  "sample",
  "warp_logits",
  "SpeculativeOutput",
  "speculative_generate",
]
