"""What a K+1-token scoring call costs a mixture-of-experts target, against one decode step.

A dense target reads every weight once per call, so scoring K+1 tokens costs about what one
step costs: that is what makes speculation pay. An MoE target's step reads only the k experts
its token selected; a scoring call reads the union of the experts its K+1 tokens selected,
up to (K+1) x k of them. ``measure`` times both on a model on this machine (specsamp's sparse
path, ``models/moe.py``) and counts the experts each call activated; ``predict`` gives the
same ratio from the performance model (``perf_model.call_cost``, with the distinct experts
of N routed tokens expected as E (1 - (1 - k/E)^N), routing taken as uniform and
independent: real routers are correlated across neighbouring tokens, which lowers it).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specsamp.experiments.benchmarks import perf_model, timing
from specsamp.models import moe, transformer
from specsamp.models.config import TransformerConfig
from specsamp.models.kv_cache import KVCache


def measure(
  config: TransformerConfig,
  num_tokens: Sequence[int],
  *,
  prompt_tokens: int = 32,
  rounds: int = 7,
  reps: int = 5,
  seed: int = 0,
) -> list[dict]:
  """Median ms of one cached call on T tokens (batch 1, after a prompt) for each T, with the
  sparse and the dense MoE paths (every setting timed in each of ``rounds`` interleaved
  rounds; the median over rounds of each round's median of ``reps``), and the distinct
  experts per layer the call's tokens select."""
  rng = np.random.default_rng(seed)
  cache_length = prompt_tokens + max(num_tokens)
  prompt = jnp.asarray(rng.integers(0, config.vocab_size, (1, prompt_tokens)), jnp.int32)
  call = jax.jit(lambda m, t, c: m(t, cache=c)[0])
  calls = {
    t: jnp.asarray(rng.integers(0, config.vocab_size, (1, t)), jnp.int32) for t in num_tokens
  }
  settings = []
  for compute in ("sparse", "dense"):  # The same weights and tokens for both paths.
    model = transformer.create(config.replace(moe_compute=compute), seed=seed)
    _, cache = model(prompt, cache=model.init_cache(1, cache_length))
    settings += [(compute, t, model, calls[t], cache) for t in num_tokens]
  times: dict = {}
  for _ in range(rounds):
    for compute, t, model, tokens, cache in settings:
      seconds = timing.median_seconds(lambda m=model, x=tokens, c=cache: call(m, x, c), reps)
      times.setdefault((compute, t), []).append(seconds * 1e3)
  return [
    dict(
      compute=compute,
      tokens=t,
      ms=float(np.median(times[compute, t])),
      experts=_distinct(model, prompt, tokens),
    )
    for compute, t, model, tokens, _ in settings
  ]


def _distinct(model: transformer.Transformer, prompt: jax.Array, tokens: jax.Array) -> float:
  """The distinct experts per layer (mean over layers) the call's tokens select: the layers
  run one by one on prompt + tokens, each router applied to its MLP's input."""
  config = model.config
  sequence = jnp.concatenate([prompt, tokens], axis=1)
  batch, length = sequence.shape
  positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), sequence.shape)
  x_BTD = model.embedder.encode(sequence)
  windows = config.layer_windows()
  counts = []
  for layer in range(config.num_layers):
    block = transformer.layer_block(model.blocks, layer)
    cache = KVCache.create(
      1, batch, length, config.num_kv_heads, config.resolved_head_dim, x_BTD.dtype
    )
    window = None if windows is None else windows[layer]
    x_BTD, _, _ = block.attention_residual(x_BTD, positions, cache.keys, cache.values, 0, window)
    new_ND = block.mlp_norm(x_BTD)[:, prompt.shape[1] :].reshape(-1, config.d_model)
    _, selected_NE = moe.route(new_ND, block.mlp.router_DE[...], config)
    counts.append(int(jnp.sum(jnp.any(selected_NE, axis=0))))
    x_BTD = block.mlp_residual(x_BTD)
  return float(np.mean(counts))


def predict(
  config: TransformerConfig,
  hardware: perf_model.Hardware,
  mesh: perf_model.MeshShape,
  num_tokens: Sequence[int],
  cache_length: int,
) -> list[dict]:
  """The performance model's ms of a batch-1 call on T tokens, for each T."""
  rows = []
  for t in num_tokens:
    call = perf_model.call_cost(config, hardware, mesh, 1, t, cache_length)
    rows.append(dict(tokens=t, ms=call.roofline_s * 1e3, weight_gb=call.weight_bytes / 1e9))
  return rows
