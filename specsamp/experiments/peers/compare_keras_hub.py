"""Side by side with the closest JAX peer: keras-hub's samplers and specsamp's, same weights.

Both libraries get the same pair: specsamp's Llama-architecture models, exported to the HF
format (``specsamp.hf.export_model``) and loaded by keras-hub's ``from_preset`` on the JAX
backend (``keras_hub_peer``). Two parts:

Speed (``run_speed``): keras-hub autoregressive (its Greedy/Random/TopP sampler) and
SpeculativeSampler, specsamp autoregressive and speculative, each mode (greedy; T = 0.8 with
top-p 0.95) at each batch size, K fixed, exactly ``max_new_tokens`` per row (no stop token).
Each sampler is compiled and warmed up on an untimed call first (``timing.time_sampler``);
the compile time is reported beside the timings. Tokens per target call count the prefill:
keras-hub's prefill fills the cache and emits no token, specsamp's emits the first token.
keras-hub's verify calls are counted by a host callback in a separate, untimed pass that
replays the same seeds (its outputs are checked identical to the timed pass's), so the timed
pass carries no callback.

Exactness (``run_exactness``): a tiny Llama pair (vocabulary 16) whose every 3-token
continuation has an exactly computable probability. Each sampler draws ``n`` continuations of
one prompt at batch 1 (each run a batch of one, vmapped over seeds) and at batch 8 (the prompt
in 8 rows, the rows pooled), and a G-test compares the counts with the exact warped target
(``exactness.exact_distribution``, ``exactness.g_test``). keras-hub's autoregressive sampler is the
control: it must pass, which shows the test and the reference are fair to keras-hub.

Where keras-hub's SpeculativeSampler fails, ``keras_hub_rule`` says why: it enumerates, exactly,
the distribution that SpeculativeSampler's rule gives a batch of ONE row (the draft token is
argmax q, accepted when r q(x) < p(x); a rejected position's bonus token from
norm(max(0, p - q)), after all K from p; p and q are temperature-only softmaxes, with no top-p;
the bonus drawn with weights (.) + 1e-7). Its batch-1 samples are G-tested against that rule:
a pass says the rule accounts for the whole batch-1 error. Its batch-8 samples against the
same rule isolate what the batch adds (rows advance in lockstep by min(num_accepted), and
every row's bonus is drawn at that common position).
"""

from __future__ import annotations

import itertools
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specsamp import sharding
from specsamp.experiments.benchmarks import perf_model, timing
from specsamp.experiments.peers import keras_hub_peer
from specsamp.experiments.peers.compare_hf import MODES, export_pair
from specsamp.hf import architectures
from specsamp.models import TransformerConfig, transformer
from specsamp.sampling import autoregressive, speculative, warping
from specsamp.testing import exactness

PARITY_TOLERANCE = 1e-4  # Max |logit difference| between keras-hub and specsamp.

EXACT_VOCAB = 16
EXACT_NEW_TOKENS = 3
EXACT_PROMPT = (3, 6, 1, 3, 12)
EXACT_K = 4
EXACT_WARPINGS = {
  "T=1": warping.SamplingConfig(1.0),
  "T=0.8,p=0.95": warping.SamplingConfig(0.8, top_p=0.95),
}
EXACT_SAMPLERS = ("keras-hub autoregressive", "keras-hub speculative", "specsamp speculative")
EXACT_BATCHES = (1, 8)
BONUS_FLOOR = 1e-7  # keras-hub's bonus draw: argmax(log(probs + 1e-7) + Gumbel).


def _logits(model: Any, tokens_BT: np.ndarray) -> np.ndarray:
  batch, length = tokens_BT.shape
  positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
  logits, _ = model(jnp.asarray(tokens_BT), positions, model.init_cache(batch, length))
  return np.asarray(logits)


def parity(model: Any, keras_lm: Any, tokens_BT: np.ndarray) -> float:
  """Max |logit difference| between specsamp's ``model`` and keras-hub's ``keras_lm``."""
  return float(
    np.max(np.abs(_logits(model, tokens_BT) - keras_hub_peer.logits(keras_lm, tokens_BT)))
  )


def check_parity(pairs: dict[str, tuple[Any, Any]], tokens_BT: np.ndarray) -> dict[str, float]:
  """Parity of each (specsamp model, keras-hub model); raises past ``PARITY_TOLERANCE``."""
  result = {name: parity(ours, theirs, tokens_BT) for name, (ours, theirs) in pairs.items()}
  bad = {name: diff for name, diff in result.items() if not diff <= PARITY_TOLERANCE}
  if bad:
    raise AssertionError(
      f"keras-hub and specsamp logits differ by {bad} (> {PARITY_TOLERANCE}): the export or "
      "keras-hub's conversion does not give the same model, so nothing else can be compared."
    )
  return result


# --- Samplers: (prompts [B, T], index) -> (tokens [B, n], target calls). ------------------------


def _specsamp_sampler(target, draft, mesh, n, k, mode_settings, seed):
  def sample(prompts_BT, index):
    lengths = np.full(len(prompts_BT), prompts_BT.shape[1], np.int32)
    key = jax.random.fold_in(jax.random.key(seed), index)
    with sharding.use_mesh(mesh):
      if draft is None:
        out = autoregressive.generate(
          target, prompts_BT, lengths, key, max_new_tokens=n, **mode_settings
        )
      else:
        out = speculative.speculative_generate(
          target,
          draft,
          prompts_BT,
          lengths,
          key,
          max_new_tokens=n,
          num_draft_tokens=k,
          **mode_settings,
        )
    tokens = np.asarray(out.tokens)[:, prompts_BT.shape[1] : prompts_BT.shape[1] + n]
    return tokens, int(out.model_calls)

  return sample


def _keras_ar_sampler(lm, n):
  def sample(prompts_BT, index):
    del index  # keras-hub's sampler carries its own seed state from call to call.
    return keras_hub_peer.generate(lm, prompts_BT, n), n + 1  # Prefill + one call per token.

  return sample


def _count(out) -> tuple[int, int]:
  """(tokens of all rows, tokens of the longest row) of a (tokens [B, n], calls) output."""
  return out[0].size, out[0].shape[1]


def _keras_speculative_timer(timed_lm, counting_lm, name, n):
  """(inputs, calls, round) -> Timed for keras-hub's SpeculativeSampler. Its verify calls come
  from ``counting_lm`` (the same model and sampler, with a counting callback in its graph),
  run untimed first from the same seed state; its tokens are checked identical."""

  def sample_with(lm):
    def sample(prompts_BT, index):
      del index  # keras-hub's sampler carries its own seed state from call to call.
      before = len(lm.verify_calls) if lm.verify_calls is not None else 0
      tokens = keras_hub_peer.generate(lm, prompts_BT, n)
      return tokens, (len(lm.verify_calls) - before if lm.verify_calls is not None else 0)

    return sample

  counting_lm.verify_calls = []

  def time_round(inputs, calls, round_index):
    del round_index
    for source, copy in zip(timed_lm.sampler.variables, counting_lm.sampler.variables):
      copy.assign(source.value)
    counted = timing.time_sampler(name, sample_with(counting_lm), inputs, calls, _count)
    timed = timing.time_sampler(name, sample_with(timed_lm), inputs, calls, _count)
    for (tokens, _), (replayed, _) in zip(timed.outputs, counted.outputs):
      if not np.array_equal(tokens, replayed):
        raise AssertionError("keras-hub's replay drew other tokens; its call count is unusable.")
    timed.outputs = [
      (tokens, 1 + made) for (tokens, _), (_, made) in zip(timed.outputs, counted.outputs)
    ]
    return timed

  return time_round


def _batches(prompts: np.ndarray, batch_size: int) -> list[np.ndarray]:
  if len(prompts) < batch_size:
    raise ValueError(
      f"Batch {batch_size} needs at least {batch_size} prompts, have {len(prompts)}."
    )
  return [prompts[i : i + batch_size] for i in range(0, len(prompts) - batch_size + 1, batch_size)]


def run_speed(
  pair: Any,
  draft: Any,
  directories: dict[str, str],
  *,
  num_draft_tokens: int,
  max_new_tokens: int,
  modes: Sequence[str] = ("greedy", "nucleus"),
  batch_sizes: Sequence[int] = (1, 8),
  calls: int = 8,
  rounds: int = 3,
  seed: int = 0,
  log: Callable[[str], None] = print,
) -> dict[str, Any]:
  """Times the four samplers at every (mode, batch size): ``rounds`` interleaved rounds of
  ``calls`` timed calls per sampler (so a noisy neighbour hits every sampler alike), tokens/s
  the median over rounds."""
  keras, keras_hub = keras_hub_peer.modules()
  ar_lm = keras_hub_peer.load_causal_lm(directories["target"])
  spec_lm, counting_lm = (
    keras_hub_peer.speculative_lm(directories["target"], directories["draft"]) for _ in range(2)
  )
  with sharding.use_mesh(pair.mesh):
    parities = check_parity(
      {"target": (pair.target, ar_lm), "draft": (draft, spec_lm.draft)}, pair.prompts
    )
  log(
    f"parity: max |logit difference| target {parities['target']:.2e}, draft {parities['draft']:.2e}"
  )
  n, k = max_new_tokens, num_draft_tokens
  results: dict[str, Any] = {
    "keras": keras.__version__,
    "keras_hub": keras_hub.__version__,
    "jax_devices": [str(d) for d in jax.devices()],
    "num_draft_tokens": k,
    "max_new_tokens": n,
    "prompt_tokens": int(pair.prompts.shape[1]),
    "calls": calls,
    "rounds": rounds,
    "parity": parities,
    "settings": [],
  }
  for mode in modes:
    settings = MODES[mode]
    for batch_size in batch_sizes:
      inputs = _batches(pair.prompts, batch_size)
      keras_hub_peer.set_sampler(
        ar_lm, keras_hub_peer.make_sampler(settings["temperature"], settings["top_p"], None, seed)
      )
      for lm in (spec_lm, counting_lm):
        keras_hub_peer.set_sampler(
          lm, keras_hub_peer.make_sampler(settings["temperature"], settings["top_p"], k, seed)
        )

      def ours(name, draft_model):
        def time_round(inputs, calls, round_index):  # Each round its own keys.
          sample = _specsamp_sampler(
            pair.target, draft_model, pair.mesh, n, k, settings, seed + 1000 * round_index
          )
          return timing.time_sampler(name, sample, inputs, calls, _count)

        return time_round

      timers = {
        "keras-hub autoregressive": lambda inputs, calls, _: timing.time_sampler(
          "keras-hub autoregressive", _keras_ar_sampler(ar_lm, n), inputs, calls, _count
        ),
        f"keras-hub speculative (K={k})": _keras_speculative_timer(
          spec_lm, counting_lm, f"keras-hub speculative (K={k})", n
        ),
        "specsamp autoregressive": ours("specsamp autoregressive", None),
        f"specsamp speculative (K={k})": ours(f"specsamp speculative (K={k})", draft),
      }
      timed = {name: [] for name in timers}
      for round_index in range(rounds):
        for name, timer in timers.items():
          timed[name].append(timer(inputs, calls, round_index))
      entry = _entry(mode, batch_size, timed, n)
      results["settings"].append(entry)
      log(format_setting(entry))
  return results


def _entry(mode: str, batch_size: int, timed: dict[str, list[timing.Timed]], n: int) -> dict:
  outputs = {
    name: [out for side in rounds for out in side.outputs] for name, rounds in timed.items()
  }
  rows = {}
  for name, rounds in timed.items():
    per_round = [side.tokens_per_s for side in rounds]
    rows[name] = {
      "tokens_per_s": float(np.median(per_round)),
      "tokens_per_s_rounds": per_round,
      "tokens_per_target_call": n * len(outputs[name]) / sum(c for _, c in outputs[name]),
      "compile_s": rounds[0].compile_s,
      "seconds": sum(side.run_s for side in rounds),
    }
  keras_ar, keras_spec, ours_ar, ours_spec = (row["tokens_per_s"] for row in rows.values())
  entry = {
    "mode": mode,
    "batch_size": batch_size,
    "samplers": rows,
    "speculative_ratio": ours_spec / keras_spec,
    "autoregressive_ratio": ours_ar / keras_ar,
    "keras_hub_speedup": keras_spec / keras_ar,
    "specsamp_speedup": ours_spec / ours_ar,
  }
  if MODES[mode]["temperature"] == 0:
    reference = [tokens for tokens, _ in outputs["specsamp autoregressive"]]
    entry["greedy_identical"] = {
      name: all(np.array_equal(a, b) for (a, _), b in zip(side, reference))
      for name, side in outputs.items()
    }
  return entry


def format_setting(entry: dict[str, Any]) -> str:
  settings = MODES[entry["mode"]]
  title = (
    "greedy"
    if settings["temperature"] == 0
    else f"T={settings['temperature']}, top-p {settings['top_p']}"
  )
  lines = [f"{title}, batch {entry['batch_size']}:"]
  for name, row in entry["samplers"].items():
    spread = f"{min(row['tokens_per_s_rounds']):.0f}-{max(row['tokens_per_s_rounds']):.0f}"
    lines.append(
      f"  {name:<30} {row['tokens_per_s']:8.1f} tokens/s (rounds {spread})  "
      f"{row['tokens_per_target_call']:5.2f} tokens/target call  "
      f"(compile {row['compile_s']:.1f} s, excluded)"
    )
  lines.append(
    f"  specsamp / keras-hub: speculative {entry['speculative_ratio']:.2f}x, autoregressive "
    f"{entry['autoregressive_ratio']:.2f}x; speedup over own autoregressive: keras-hub "
    f"{entry['keras_hub_speedup']:.2f}x, specsamp {entry['specsamp_speedup']:.2f}x"
  )
  if "greedy_identical" in entry:
    lines.append(
      f"  greedy tokens identical to specsamp autoregressive: {entry['greedy_identical']}"
    )
  return "\n".join(lines)


def speed_table(results: dict[str, Any]) -> str:
  """The speed results as one Markdown table."""
  rows = []
  for entry in results["settings"]:
    settings = MODES[entry["mode"]]
    mode = (
      "greedy"
      if settings["temperature"] == 0
      else f"T={settings['temperature']}, p={settings['top_p']}"
    )
    for name, row in entry["samplers"].items():
      rows.append(
        {
          "mode": mode,
          "batch": entry["batch_size"],
          "sampler": name,
          "tokens/s (median of rounds)": row["tokens_per_s"],
          "rounds min-max": (
            f"{min(row['tokens_per_s_rounds']):.0f}-{max(row['tokens_per_s_rounds']):.0f}"
          ),
          "tokens/target call": row["tokens_per_target_call"],
          "compile s (excluded)": row["compile_s"],
          "specsamp / keras-hub": (
            entry["speculative_ratio"]
            if name.startswith("specsamp spec")
            else entry["autoregressive_ratio"]
            if name.startswith("specsamp auto")
            else None
          ),
        }
      )
  columns = [
    "mode",
    "batch",
    "sampler",
    "tokens/s (median of rounds)",
    "rounds min-max",
    "tokens/target call",
    "compile s (excluded)",
    "specsamp / keras-hub",
  ]
  return perf_model.format_table(rows, columns)


# --- Exactness. ---------------------------------------------------------------------------------


def exact_pair(seed: int = 10) -> tuple[Any, Any]:
  """The tiny Llama pair (vocabulary 16, 2 layers, grouped-query attention, SwiGLU) and a
  draft that is the target with Gaussian noise (``exactness.noisy_copy``)."""
  config = TransformerConfig(
    vocab_size=EXACT_VOCAB,
    num_layers=2,
    d_model=32,
    num_heads=4,
    num_kv_heads=2,
    ffn_dim=64,
    mlp_activation="swiglu",
    dtype="float32",
    param_dtype="float32",
  )
  target = transformer.create(config, seed=seed)
  return target, exactness.noisy_copy(target, 0.6, seed=seed + 1)


def _counts(draw: Callable[[np.ndarray], Any], runs: int, chunk: int) -> np.ndarray:
  """Counts of continuations from ``draw(seeds [chunk])`` -> tokens [chunk, B, N], ``runs``
  runs in chunks of one compiled shape."""
  counts = np.zeros(EXACT_VOCAB**EXACT_NEW_TOKENS, np.int64)
  for start in range(0, runs, chunk):
    seeds = np.arange(start, start + chunk)
    tokens = np.asarray(draw(seeds))[: min(chunk, runs - start)]
    counts += exactness.count_continuations(tokens, EXACT_VOCAB)
  return counts


def _specsamp_draw(target, draft, prompts_BT, sampling, seed):
  lengths = np.full(len(prompts_BT), prompts_BT.shape[1], np.int32)
  width = prompts_BT.shape[1]

  def one(key):
    with warnings.catch_warnings():  # K > N - 1 on purpose: keras-hub drafts K here too.
      warnings.simplefilter("ignore", UserWarning)
      out = speculative.speculative_generate(
        target,
        draft,
        prompts_BT,
        lengths,
        key,
        max_new_tokens=EXACT_NEW_TOKENS,
        num_draft_tokens=EXACT_K,
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        check_nan=False,
      )
    return out.tokens[:, width : width + EXACT_NEW_TOKENS]

  run = jax.jit(jax.vmap(one))
  base = jax.random.key(seed)
  return lambda seeds: run(jax.vmap(lambda s: jax.random.fold_in(base, s))(jnp.asarray(seeds)))


def _prefix_distributions(model: Any, temperature: float) -> dict[tuple[int, ...], np.ndarray]:
  """{generated prefix: float64 softmax(logits / T)} after EXACT_PROMPT, for every prefix of
  0..N-1 tokens (no top-k or top-p: what keras-hub's SpeculativeSampler uses)."""
  table = {}
  sampling = warping.SamplingConfig(temperature)
  for length in range(EXACT_NEW_TOKENS):
    prefixes = list(itertools.product(range(EXACT_VOCAB), repeat=length))
    seqs = np.asarray([EXACT_PROMPT + prefix for prefix in prefixes], np.int32)
    probs = np.asarray(
      exactness.last_distributions(model, jnp.asarray(seqs), sampling, 1), np.float64
    )
    for prefix, row in zip(prefixes, probs[:, 0]):
      table[prefix] = row / row.sum()
  return table


def keras_hub_rule(
  target: Any, draft: Any, temperature: float, num_draft_tokens: int
) -> np.ndarray:
  """[V^N]: the exact distribution of N tokens that keras-hub's SpeculativeSampler rule gives
  a batch of one row (see the module docstring), enumerated over every outcome."""
  p = _prefix_distributions(target, temperature)
  q = _prefix_distributions(draft, temperature)
  out = np.zeros(EXACT_VOCAB**EXACT_NEW_TOKENS)

  def bonus(weights):  # argmax(log(w + 1e-7) + Gumbel) draws w + 1e-7, normalised.
    w = weights + BONUS_FLOOR
    return w / w.sum()

  def visit(prefix: tuple[int, ...], mass: float):
    if len(prefix) == EXACT_NEW_TOKENS:
      out[exactness.codes(np.asarray(prefix), EXACT_VOCAB)] += mass
      return
    for _ in range(num_draft_tokens):
      if len(prefix) == EXACT_NEW_TOKENS:
        break
      p_t, q_t = p[prefix], q[prefix]
      token = int(np.argmax(q_t))
      accept = min(1.0, p_t[token] / q_t[token])
      residual = np.maximum(p_t - q_t, 0.0)
      residual = bonus(residual / (residual.sum() + BONUS_FLOOR))
      for y in np.flatnonzero(residual > 0):
        visit(prefix + (int(y),), mass * (1 - accept) * residual[y])
      mass *= accept
      prefix = prefix + (token,)
    if len(prefix) == EXACT_NEW_TOKENS:
      visit(prefix, mass)
      return
    after = bonus(p[prefix])
    for y in range(EXACT_VOCAB):
      visit(prefix + (y,), mass * after[y])

  visit((), 1.0)
  return out


def run_exactness(
  num_samples: int = 100_000,
  *,
  level: float = 1e-3,
  directory: str | None = None,
  seed: int = 0,
  samplers: Sequence[str] = EXACT_SAMPLERS,
  warpings: Sequence[str] = tuple(EXACT_WARPINGS),
  batches: Sequence[int] = EXACT_BATCHES,
  chunk_rows: int = 1 << 14,
  log: Callable[[str], None] = print,
) -> dict[str, Any]:
  """G-tests of each sampler x warping x batch against the exact target (and keras-hub's
  speculative samples against its own batch-1 rule, to say which mechanism fails)."""
  target, draft = exact_pair()
  directory = directory or tempfile.mkdtemp(prefix="specsamp_keras_hub_exact_")
  paths = export_pair(target, draft, directory)
  ar_lm = keras_hub_peer.load_causal_lm(paths["target"])
  spec_lm = keras_hub_peer.speculative_lm(paths["target"], paths["draft"])
  everything = np.asarray(
    list(itertools.product(range(EXACT_VOCAB), repeat=EXACT_NEW_TOKENS)), np.int32
  )
  tokens = np.concatenate(
    [np.tile(np.asarray(EXACT_PROMPT, np.int32), (len(everything), 1)), everything], 1
  )
  parities = check_parity(
    {"target": (target, ar_lm), "draft": (draft, spec_lm.draft)}, tokens[:512]
  )
  greedy = _greedy_identity(target, draft, ar_lm, spec_lm)
  log(f"exactness pair: parity {parities}; greedy identical: {greedy}")
  results: dict[str, Any] = {
    "n": num_samples,
    "level": level,
    "parity": parities,
    "greedy_identical": greedy,
    "cases": [],
  }
  for warping_name in warpings:
    sampling = EXACT_WARPINGS[warping_name]
    exact = exactness.exact_distribution(target, EXACT_PROMPT, sampling, EXACT_NEW_TOKENS)
    rule = keras_hub_rule(target, draft, sampling.temperature, EXACT_K)
    for sampler, batch in itertools.product(samplers, batches):
      start = time.perf_counter()
      prompts_BT = np.tile(np.asarray(EXACT_PROMPT, np.int32), (batch, 1))
      if sampler == "specsamp speculative":
        draw = _specsamp_draw(target, draft, prompts_BT, sampling, seed)
      else:
        lm = ar_lm if sampler == "keras-hub autoregressive" else spec_lm
        k = EXACT_K if lm is spec_lm else None
        keras_hub_peer.set_sampler(
          lm, keras_hub_peer.make_sampler(sampling.temperature, sampling.top_p, k, seed)
        )
        draw = keras_hub_peer.batched_runner(lm, prompts_BT, EXACT_NEW_TOKENS)
      runs = -(-num_samples // batch)
      counts = _counts(draw, runs, max(chunk_rows // batch, 1))
      case = {
        "sampler": sampler,
        "warping": warping_name,
        "batch": batch,
        "n": int(counts.sum()),
        "outside_top_p": float(counts[exact <= 0].sum() / counts.sum()),
        **exactness.g_test(counts, exact, level),
      }
      case["passed"] = not case["rejected"]
      if sampler == "keras-hub speculative":
        vs_rule = exactness.g_test(counts, rule, level)
        case["vs_rule"] = {**vs_rule, "passed": not vs_rule["rejected"]}
        case["rule_outside_top_p"] = float(rule[exact <= 0].sum())
        case["rule_total_variation"] = float(0.5 * np.abs(rule - exact).sum())
      case["seconds"] = time.perf_counter() - start
      results["cases"].append(case)
      log(format_case(case))
  return results


def _greedy_identity(target, draft, ar_lm, spec_lm) -> bool:
  """Greedy: keras-hub autoregressive and speculative emit specsamp's autoregressive tokens."""
  prompts_BT = np.tile(np.asarray(EXACT_PROMPT, np.int32), (2, 1))
  n = 12
  keras_hub_peer.set_sampler(ar_lm, keras_hub_peer.make_sampler(0.0, 1.0, None))
  keras_hub_peer.set_sampler(spec_lm, keras_hub_peer.make_sampler(0.0, 1.0, EXACT_K))
  greedy = dict(temperature=0.0, top_p=1.0)
  ours = _specsamp_sampler(target, None, None, n, EXACT_K, greedy, 0)(prompts_BT, 0)[0]
  ours_spec = _specsamp_sampler(target, draft, None, n, EXACT_K, greedy, 0)(prompts_BT, 0)[0]
  theirs = [keras_hub_peer.generate(lm, prompts_BT, n) for lm in (ar_lm, spec_lm)]
  return all(np.array_equal(ours, other) for other in (ours_spec, *theirs))


def format_case(case: dict[str, Any]) -> str:
  line = (
    f"{case['sampler']}, {case['warping']}, batch {case['batch']}: n={case['n']:,} "
    f"G={case['G']:.1f} (threshold {case['threshold']:.1f}, p={case['p_value']:.3g}) "
    f"outside top-p {case['outside_top_p']:.4f} -> {'pass' if case['passed'] else 'FAIL'}"
  )
  if "vs_rule" in case:
    rule = case["vs_rule"]
    verdict = "pass" if rule["passed"] else "FAIL"
    line += f"; against keras-hub's batch-1 rule G={rule['G']:.1f} -> {verdict}"
  return line


def exactness_table(results: dict[str, Any]) -> str:
  """The exactness results as one Markdown table."""
  rows = []
  for case in results["cases"]:
    rule = case.get("vs_rule")
    rows.append(
      {
        "sampler": case["sampler"],
        "warping": case["warping"],
        "batch": case["batch"],
        "n": f"{case['n']:,}",
        "G": "inf" if case["G"] == float("inf") else f"{case['G']:.1f}",
        "threshold": f"{case['threshold']:.1f}",
        "p-value": f"{case['p_value']:.3g}",
        "mass outside top-p": f"{case['outside_top_p']:.4f}",
        "vs target": "pass" if case["passed"] else "FAIL",
        "G vs keras-hub batch-1 rule": None
        if rule is None
        else f"{rule['G']:.1f} ({'pass' if rule['passed'] else 'FAIL'})",
      }
    )
  columns = list(rows[0]) if rows else []
  return perf_model.format_table(rows, columns)


def floor_mass(vocab_size: int) -> float:
  """The bonus draw's mass on tokens of probability 0 when at most one token has mass:
  ``vocab_size`` x 1e-7 over (1 + ``vocab_size`` x 1e-7) (keras-hub's argmax(log(p + 1e-7) +
  Gumbel) on a normalised residual)."""
  return vocab_size * BONUS_FLOOR / (1 + vocab_size * BONUS_FLOOR)


def _require_llama(config: TransformerConfig) -> None:
  model_type = architectures.model_type_of(config)
  if model_type != "llama":
    raise ValueError(
      f"The keras-hub comparison drives keras-hub's LlamaCausalLM, but this pair exports as HF "
      f"{model_type!r}; use a Llama-architecture pair (SwiGLU MLP, no biases, no soft-caps), "
      "e.g. --config=configs/code_pair.py:llama."
    )


def run(
  config: Any,
  workdir: str | None,
  *,
  parts: Sequence[str] = ("speed", "exactness"),
  modes: Sequence[str] = ("greedy", "nucleus"),
  batch_sizes: Sequence[int] = (1, 8),
  calls: int = 8,
  rounds: int = 3,
  num_draft_tokens: int = 4,
  max_new_tokens: int = 64,
  exact_samples: int = 100_000,
  exact_samplers: Sequence[str] = EXACT_SAMPLERS,
  exact_warpings: Sequence[str] = tuple(EXACT_WARPINGS),
  exact_batches: Sequence[int] = EXACT_BATCHES,
  level: float = 1e-3,
  output: str | None = None,
  log: Callable[[str], None] = print,
) -> dict[str, Any]:
  """The script's job: prepares the pair, runs ``parts``, writes JSON and Markdown tables."""
  import json

  from specsamp.experiments.jobs import pair as pair_lib

  keras_hub_peer.modules()  # Fails first, in one line, without keras-hub or off JAX.
  workdir = os.path.abspath(workdir or pair_lib.default_workdir(config))
  output = output or os.path.join(workdir, "compare_keras_hub.json")
  results: dict[str, Any] = {}
  tables = []
  if "speed" in parts:
    for section in (config.target, config.draft):  # Before anything trains.
      if not section.checkpoint:
        _require_llama(TransformerConfig.from_config(section.model))
    pair = pair_lib.prepare(config, workdir, log=log)
    for model in (pair.target, pair.draft):
      _require_llama(model.config)
    paths = export_pair(pair.target, pair.draft, os.path.join(workdir, "hf_export"), pair.tokenizer)
    log(f"exported the pair to {os.path.dirname(paths['target'])}")
    results["speed"] = run_speed(
      pair,
      pair.draft,
      paths,
      num_draft_tokens=num_draft_tokens,
      max_new_tokens=max_new_tokens,
      modes=modes,
      batch_sizes=batch_sizes,
      calls=calls,
      rounds=rounds,
      seed=config.sampling.seed,
      log=log,
    )
    tables.append("## Speed\n\n" + speed_table(results["speed"]))
  if "exactness" in parts:
    results["exactness"] = run_exactness(
      exact_samples,
      level=level,
      directory=os.path.join(workdir, "exact_pair"),
      samplers=exact_samplers,
      warpings=exact_warpings,
      batches=exact_batches,
      log=log,
    )
    tables.append("## Exactness\n\n" + exactness_table(results["exactness"]))
  os.makedirs(os.path.dirname(output), exist_ok=True)
  with open(output, "w") as f:
    json.dump(results, f, indent=2, default=float)
  with open(os.path.splitext(output)[0] + ".md", "w") as f:
    f.write("\n\n".join(tables) + "\n")
  log(f"wrote {output} and {os.path.splitext(output)[0]}.md")
  return results
