"""specsamp: speculative sampling (Chen et al. 2023) for JAX/Flax NNX.

Subpackages:
  models:   the decoder-only Transformer family with per-row KV caches.
  sampling: logits -> probabilities, verification (token-wise, block, greedy),
            and the autoregressive and speculative loops, each one jitted while_loop.
  sharding: the device mesh and the ONE logical -> mesh axis rules table.
"""

__version__ = "0.1.0"
