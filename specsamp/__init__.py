"""specsamp: speculative sampling (Chen et al. 2023) for JAX/Flax NNX.

Subpackages:
  models:   the decoder-only Transformer family with per-row KV caches.
  sampling: logits -> probabilities, verification (token-wise, block, greedy),
            and the autoregressive and speculative loops, each one jitted while_loop.
  sharding: the device mesh and the ONE logical -> mesh axis rules table.
"""

__version__ = "0.1.0"

# Importing specsamp changes no environment variable. libtpu (the 'tpu' extra) prints a page of
# warnings when jax starts on a machine with no TPU: the scripts give it quiet defaults when they
# start (experiments/cli.quiet_libtpu_without_tpu; scripts/aot_compile.py through
# experiments/proofs/aot.quiet_libtpu), and JAX_PLATFORMS=cpu keeps jax from loading it at all
# (the tests set it).
