"""specsamp: speculative sampling (Chen et al. 2023) for JAX/Flax NNX.

Subpackages:
  models:   the decoder-only Transformer family with per-row KV caches.
  sampling: logits -> probabilities, verification (token-wise, block, greedy),
            and the autoregressive and speculative loops, each one jitted while_loop.
  sharding: the device mesh and the ONE logical -> mesh axis rules table.
"""

import glob as _glob
import os as _os

__version__ = "0.1.0"

# libtpu (the 'tpu' extra, for scripts/aot_compile.py) probes for TPU hardware when jax starts
# and prints a page of warnings on a machine without any. Where no TPU device node exists, the
# environment it reads is given harmless defaults (never overriding what the user set); on a
# TPU VM nothing is touched.
if not _glob.glob("/dev/accel*") and not _os.path.exists("/dev/vfio"):
  for _name, _value in (
    ("TPU_ACCELERATOR_TYPE", "v4-8"),
    ("TPU_WORKER_HOSTNAMES", "localhost"),
    ("TPU_SKIP_MDS_QUERY", "1"),
  ):
    _os.environ.setdefault(_name, _value)
