"""Published pairs' shapes with random weights: the loop at the sizes people run.

A target and a draft are built from Hugging Face ``config.json`` files (``configs/hf``, e.g.
Llama-3.1-8B with Llama-3.2-1B) with random weights in a chosen dtype. The synthetic verifier
accepts each draft token with a chosen probability alpha whatever the models say
(``verifier='synthetic'``), so the loop's cost at that acceptance is measured without trained
weights: both models still run at full size, and the loop still drafts, scores, rolls back
and appends exactly as it does for real.

For every (batch, K, alpha), ``sweep`` measures, in one run on one device:
  * autoregressive and speculative ms/token (their calls interleaved) and the speedup;
  * the step costs (a target step, a draft step, the target scoring K + 1 tokens) and the
    speedup they predict (``speedup.predicted_batch_speedup``: the loop pays its slowest row's
    iterations), and the efficiency = measured / predicted;
  * a parallel drafter's pass (2K positions in one draft call) in draft steps;
  * the autoregressive step against its floor: the bytes a step must read (every weight once,
    the live KV cache; ``perf_model.call_cost``) over the copy bandwidth measured on the same
    device (``timing.measure_copy_bandwidth``).

``shrink`` keeps a config.json's architecture (RoPE scaling, tied embeddings, GQA) at a tiny
size, for the CPU run of the same code (``--tiny``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from specsamp.experiments.benchmarks import perf_model, speedup, timing
from specsamp.hf import architectures
from specsamp.models import transformer
from specsamp.models.config import TransformerConfig
from specsamp.sampling import statistics
from specsamp.sampling.sampler import Sampler

TINY_SHAPES = {
  "hidden_size": 64,
  "intermediate_size": 128,
  "num_hidden_layers": 2,
  "num_attention_heads": 4,
  "num_key_value_heads": 2,
  "head_dim": 16,
  "vocab_size": 512,
}
"""What ``shrink`` sets: a config.json at the size of the test suite's models."""


def shrink(hf: dict[str, Any]) -> dict[str, Any]:
  """``hf`` with its sizes replaced by ``TINY_SHAPES`` (the architecture kept)."""
  return {**hf, **TINY_SHAPES}


def model_config(path: str, dtype: str, tiny: bool = False) -> TransformerConfig:
  """The TransformerConfig of the config.json at ``path``, weights and activations in
  ``dtype`` (shrunk to ``TINY_SHAPES`` when ``tiny``)."""
  hf = architectures.read_config(path)
  return architectures.from_hf(shrink(hf) if tiny else hf, param_dtype=dtype, dtype=dtype)


LAYER_MODES = ("scan", "unrolled", "unstacked")


def with_layers(model: Any, mode: str) -> Any:
  """``model`` running its layers as one ``lax.scan`` ('scan'), unrolled over the same stacked
  arrays ('unrolled'; both share its parameter arrays, nothing copied), or unrolled over arrays
  of their own, one per layer ('unstacked': ``transformer.unstack_layers`` on a twin, a copy of
  the layers' weights). A scan slices each layer's weights out of the stack inside the loop,
  unrolled layers at fixed offsets; on XLA's CPU backend both copy the slice before the
  products, and unstacked layers read their arrays in place."""
  if mode not in LAYER_MODES:
    raise ValueError(f"mode must be one of {LAYER_MODES}, got {mode!r}.")
  graphdef, state = nnx.split(model)
  twin = nnx.merge(graphdef, state)
  twin.config = model.config.replace(scan_layers=mode == "scan")
  return transformer.unstack_layers(twin) if mode == "unstacked" else twin


def time_layer_modes(
  models: dict[str, Any], batch_size: int, cache_slots: int, log: Callable[[str], None] = print
) -> dict[str, dict[str, float]]:
  """Seconds per decode step of each model with its layers in each of ``LAYER_MODES``
  (``with_layers``): {name: {'scan': s, 'unrolled': s, 'unstacked': s}}."""
  seconds = {}
  for name, model in models.items():
    seconds[name] = {
      mode: timing.time_calls(with_layers(model, mode), batch_size, 1, cache_slots)
      for mode in LAYER_MODES
    }
    log(
      f"{name} step, batch {batch_size}: layers "
      + ", ".join(f"{mode} {seconds[name][mode] * 1e3:.3f} ms" for mode in LAYER_MODES)
    )
  return seconds


def decode_matmuls(config: TransformerConfig) -> dict[str, tuple[int, int, int, bool]]:
  """The weight products of one decode step: {name: (d_in, d_out, count, out_major)}, count
  the products per step and out_major whether the model stores the weight [d_out, d_in]
  (a tied output head reads the [V, D] embedding table; every other weight is [d_in, ...])."""
  d, h, layers = config.d_model, config.resolved_head_dim, config.num_layers
  mlp_in = 2 if config.gated_mlp else 1
  return {
    "q": (d, config.num_heads * h, layers, False),
    "k_v": (d, config.num_kv_heads * h, 2 * layers, False),
    "o": (config.num_heads * h, d, layers, False),
    "mlp_in": (d, config.ffn_dim, mlp_in * layers, False),
    "mlp_out": (config.ffn_dim, d, layers, False),
    "head": (d, config.vocab_size, 1, config.tie_embeddings),
  }


@functools.partial(jax.jit, static_argnames=("out_major",))
def _products(x_BI, stack, out_major):
  """x times each weight of ``stack`` in turn, sliced in a loop as the layers' scan slices
  them, summed in float32 (each product must be computed); each product is the model's own
  einsum, in the weights' dtype."""
  spec = "BI,OI->BO" if out_major else "BI,IO->BO"

  def body(i, acc_BO):
    return acc_BO + jnp.einsum(spec, x_BI, stack[i]).astype(jnp.float32)

  zeros = jnp.zeros((x_BI.shape[0], stack.shape[1] if out_major else stack.shape[2]))
  return jax.lax.fori_loop(0, stack.shape[0], body, zeros)


def time_decode_matmuls(
  config: TransformerConfig,
  batch_size: int,
  dtype: str,
  copy_bandwidth: float,
  stack_bytes: int = 512 * 2**20,
  repeats: int = 5,
) -> dict[str, Any]:
  """Each decode product of ``config`` (``decode_matmuls``) timed alone at ``batch_size`` rows,
  in both weight layouts: seconds per product and the weight bytes it reads per second,
  against ``copy_bandwidth``. Each is timed over a stack of distinct copies of the weight (at
  least ``stack_bytes``, at most 64 copies) so that no product finds its weight in a cache.
  'step_s' sums the products of one step in the model's own layouts: what the step would take
  if nothing but its weight products cost time."""
  item = np.dtype(jnp.dtype(dtype)).itemsize
  rows, step_s = {}, 0.0
  for name, (d_in, d_out, count, out_major) in decode_matmuls(config).items():
    copies = int(np.clip(-(-stack_bytes // (d_in * d_out * item)), 1, 64))
    x_BI = jnp.ones((batch_size, d_in), dtype)
    row = {"d_in": d_in, "d_out": d_out, "count": count, "out_major": out_major}
    for layout in (False, True):
      shape = (copies, d_out, d_in) if layout else (copies, d_in, d_out)
      stack = jax.random.normal(jax.random.key(0), shape, jnp.float32).astype(dtype)
      seconds = timing.median_seconds(lambda: _products(x_BI, stack, layout), repeats) / copies
      key = "out_major" if layout else "in_major"
      row[f"{key}_s"] = seconds
      row[f"{key}_bytes_per_s"] = d_in * d_out * item / seconds
      row[f"{key}_of_copy_bandwidth"] = row[f"{key}_bytes_per_s"] / copy_bandwidth
    step_s += count * row["out_major_s" if out_major else "in_major_s"]
    rows[name] = row
  return {"batch_size": batch_size, "dtype": dtype, "products": rows, "step_s": step_s}


def step_read_bytes(config: TransformerConfig, batch_size: int, live_length: int) -> float:
  """Bytes one decode step must read from memory: every weight once (the embedding table's
  gathered rows only, unless it is also the output head) and ``live_length`` positions of
  every row's KV cache (``perf_model.call_cost``)."""
  unused = perf_model.PRESETS["h100"]  # Only the byte counts are read, not the times.
  call = perf_model.call_cost(config, unused, perf_model.MeshShape(), batch_size, 1, live_length)
  return call.weight_bytes + call.kv_bytes


def random_prompts(vocab_size: int, batch_size: int, prompt_tokens: int, seed: int):
  """(prompts [B, T], lengths [B]) of uniform random ids: shapes are all that matter here."""
  rng = np.random.default_rng(seed)
  prompts = rng.integers(0, vocab_size, (batch_size, prompt_tokens)).astype(np.int32)
  return prompts, np.full((batch_size,), prompt_tokens, np.int32)


def sweep(
  target: Any,
  draft: Any,
  *,
  batch_sizes: Sequence[int],
  num_draft_tokens: Sequence[int],
  alphas: Sequence[float],
  prompt_tokens: int,
  max_new_tokens: int,
  calls: int,
  copy_bandwidth: float,
  seed: int = 0,
  record: Callable[[dict[str, Any]], None] = lambda row: None,
  log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
  """Times the synthetic-acceptance loop at every (batch, K, alpha) (module docstring).

  Call it under the models' mesh. ``record`` gets each finished row at once (an interrupted
  sweep keeps what it measured). Returns the rows.
  """
  sampler = Sampler(target, draft)
  key = jax.random.key(seed)
  cache_slots = prompt_tokens + max_new_tokens + max(num_draft_tokens) + 1
  live_length = prompt_tokens + max_new_tokens // 2  # A step's mean cache length in a call.
  rows = []
  for batch_size in batch_sizes:
    batch = random_prompts(target.vocab_size, batch_size, prompt_tokens, seed + batch_size)

    def sample(**options):
      def run(inputs, index):
        rng = jax.random.fold_in(key, index)
        return sampler.generate(
          *inputs, rng, max_new_tokens=max_new_tokens, cache_length=cache_slots, **options
        )

      return run

    target_step_s = timing.time_calls(target, batch_size, 1, cache_slots)
    draft_step_s = timing.time_calls(draft, batch_size, 1, cache_slots)
    floor_s = step_read_bytes(target.config, batch_size, live_length) / copy_bandwidth
    log(
      f"batch {batch_size}: target step {target_step_s * 1e3:.3f} ms "
      f"({target_step_s / floor_s:.2f}x its floor {floor_s * 1e3:.3f} ms), "
      f"draft step {draft_step_s * 1e3:.3f} ms"
    )
    for k in num_draft_tokens:
      score_s = timing.time_calls(target, batch_size, k + 1, cache_slots)
      # A parallel drafter's pass (issue 39): the accepted tokens and K placeholders, at most
      # 2K positions, in one draft call.
      pass_s = timing.time_calls(draft, batch_size, 2 * k, cache_slots)
      # One compiled loop per K (alpha is traced); the autoregressive calls interleaved.
      timed = timing.time_interleaved(
        {
          "autoregressive": sample(num_draft_tokens=0),
          **{
            alpha: sample(num_draft_tokens=k, verifier="synthetic", synthetic_acceptance=alpha)
            for alpha in alphas
          },
        },
        [batch],
        calls=calls,
      )
      ar = timed["autoregressive"]
      for alpha in alphas:
        spec = timed[alpha]
        stats = statistics.summarize(spec.outputs)
        measured = ar.ms_per_token / spec.ms_per_token
        predicted = speedup.predicted_batch_speedup(
          [alpha] * batch_size, k, max_new_tokens, target_step_s, draft_step_s, score_s
        )
        row = {
          "batch_size": batch_size,
          "num_draft_tokens": k,
          "alpha": alpha,
          "measured_alpha": stats["alpha"],
          "tokens_per_target_call": stats["tokens_per_target_call"],
          "ar_ms_per_token": ar.ms_per_token,
          "spec_ms_per_token": spec.ms_per_token,
          "ar_tokens_per_s": ar.tokens_per_s,
          "spec_tokens_per_s": spec.tokens_per_s,
          "speedup": measured,
          "predicted_speedup": predicted,
          "efficiency": measured / predicted,
          "target_step_ms": target_step_s * 1e3,
          "draft_step_ms": draft_step_s * 1e3,
          "score_ms": score_s * 1e3,
          "draft_ratio": draft_step_s / target_step_s,
          "score_ratio": score_s / target_step_s,
          "draft_pass_ms": pass_s * 1e3,
          "pass_over_draft_step": pass_s / draft_step_s,
          "floor_ms": floor_s * 1e3,
          "ar_step_over_floor": target_step_s / floor_s,
          "ar_loop_over_floor": ar.ms_per_token * 1e-3 / floor_s,
          "compile_s": {"autoregressive": ar.compile_s, "speculative": spec.compile_s},
        }
        rows.append(row)
        record(row)
        log(
          f"  B={batch_size} K={k} alpha={alpha}: autoregressive {ar.ms_per_token:.3f} ms/token, "
          f"speculative {spec.ms_per_token:.3f} ms/token: {measured:.2f}x (predicted "
          f"{predicted:.2f}x, efficiency {measured / predicted:.2f}; "
          f"{stats['tokens_per_target_call']:.2f} tokens/call; a {2 * k}-wide draft pass "
          f"{pass_s / draft_step_s:.2f} draft steps)"
        )
  return rows
