"""Where a speculative iteration's time goes: its phases timed apart, beside the models.

``iteration_ms`` times the compiled loop itself: the synthetic verifier fixes acceptance
(0: every draft rejected, 1: every draft accepted), and the cost of one iteration is the
difference between two calls that generate different numbers of tokens over the difference
in their iterations, so the fixed cost of a call (prefill, dispatch) drops out.

``phase_ms`` times each phase of the iteration on its own, as a jitted ``fori_loop`` that
repeats it on carried inputs (so nothing is hoisted out), with the loop's own functions and
shapes:

  models in loop order  the scoring call, then the K draft calls, repeated: the models' cost
                        as the loop pays it (on a CPU the target's weight stream evicts the
                        draft's weights from the last-level cache between iterations)
  draft model calls     the drafter's K model calls (the first on 2 tokens), argmax-fed
  draft sampling        K x (warp q, draw a token from 64-bit words, store q)
  scoring call          the target on K + 1 tokens
  target warping        p for the K + 1 positions
  verification          the verifier on (q, p)
  append + bookkeeping  append, statistics, the next draft limit, rollback
  while loop            the loop's carry through an empty body

What the phases do not explain of the measured iteration is the cost of putting them
together (copies between phases, lost fusion). ``hlo_ops.count_loop_ops`` counts the
launched operations of each phase in the compiled loop.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from specsamp.experiments.benchmarks import benchmark, op_profile, timing
from specsamp.experiments.benchmarks.harness import Bench
from specsamp.experiments.jobs import pair as pair_lib
from specsamp.experiments.proofs import hlo_ops
from specsamp.sampling import autoregressive, drafters, speculative, threefry, verification
from specsamp.sampling import statistics as stats_lib
from specsamp.sampling.warping import SamplingConfig, probabilities

PHASES = (
  "models in loop order",
  "draft model calls",
  "draft sampling",
  "scoring call",
  "target warping",
  "verification",
  "append + bookkeeping",
  "while loop",
)


def _median_ms(run: Callable[[], Any], repeats: int) -> float:
  return timing.median_seconds(run, repeats) * 1e3


def _loop_ms(body: Callable[[int, Any], Any], carry: Any, reps: int, repeats: int) -> float:
  """Milliseconds per trip of ``fori_loop(0, reps, body, carry)``, jitted."""
  run = jax.jit(lambda c: jax.lax.fori_loop(0, reps, body, c))
  return _median_ms(lambda: run(carry), repeats) / reps


def speculative_loop(
  target: Any,
  draft: Any,
  *,
  batch_size: int,
  prompt_tokens: int,
  max_new_tokens: int,
  num_draft_tokens: int,
  sampling: SamplingConfig,
  cache_length: int,
  verifier: str = "synthetic",
) -> Callable[[float, int], Any]:
  """(acceptance, max_new_tokens) -> a call of the loop on synthetic prompts (compiled once per
  length): by default the synthetic-acceptance loop, acceptance traced; with another
  ``verifier`` the real loop, which ignores it. ``call.loop_of(max_new_tokens)`` is (loop,
  target arrays, drafter arrays), ``call.arguments`` the rest of a call's arguments."""
  drafter = drafters.as_drafter(draft)
  prompts = jnp.full((batch_size, prompt_tokens), 5, jnp.int32)
  lengths = jnp.full((batch_size,), prompt_tokens, jnp.int32)
  loops = {}

  def loop_of(new_tokens: int):
    if new_tokens not in loops:
      loops[new_tokens] = speculative.SpeculativeLoop.for_models(
        target,
        drafter,
        max_new_tokens=new_tokens,
        num_draft_tokens=num_draft_tokens,
        sampling=sampling,
        verifier=verifier,
        schedule="fixed",
        eos_id=None,
        pad_id=0,
        cache_length=cache_length,
      )
    return loops[new_tokens]

  def call(acceptance: float, new_tokens: int):
    loop, target_dynamic, drafter_dynamic = loop_of(new_tokens)
    return loop(target_dynamic, drafter_dynamic, *call.arguments, jnp.float32(acceptance))

  call.loop_of = loop_of
  call.arguments = (prompts, lengths, jax.random.key(0))
  return call


def autoregressive_loop(
  target: Any, *, max_new_tokens: int, sampling: SamplingConfig, cache_length: int
) -> tuple[autoregressive.AutoregressiveLoop, Any]:
  """(loop, the target's arrays): the autoregressive loop, no EOS, padded with 0."""
  return autoregressive.AutoregressiveLoop.for_model(
    target,
    max_new_tokens=max_new_tokens,
    sampling=sampling,
    eos_id=None,
    pad_id=0,
    cache_length=cache_length,
  )


def iteration_ms(
  call: Callable[[float, int], Any], acceptance: float, short: int, long: int, repeats: int
) -> float:
  """Milliseconds per iteration of the loop at ``acceptance``: (time of a ``long``-token call -
  time of a ``short`` one) / (their difference in iterations), medians over ``repeats``."""
  iterations = {n: int(jnp.max(call(acceptance, n).iterations)) for n in (short, long)}
  seconds = {n: _median_ms(lambda n=n: call(acceptance, n), repeats) for n in (short, long)}
  return (seconds[long] - seconds[short]) / max(iterations[long] - iterations[short], 1)


def phase_ms(
  target: Any,
  draft: Any,
  *,
  batch_size: int,
  num_draft_tokens: int,
  sampling: SamplingConfig,
  cache_length: int,
  context: int,
  verifier: str = "token",
  reps: int = 32,
  repeats: int = 5,
) -> dict[str, float]:
  """Milliseconds of each of PHASES, at a context of ``context`` tokens per row."""
  k, batch = num_draft_tokens, batch_size
  vocab = target.vocab_size
  drafter = drafters.as_drafter(draft)
  draft_model = drafter.model
  rows_B = jnp.arange(batch)
  lengths_B = jnp.full((batch,), context, jnp.int32)
  key = jax.random.key(0)
  logits_BV = jax.random.normal(key, (batch, vocab))
  logits_BG1V = jax.random.normal(key, (batch, k + 1, vocab))
  q_BGV = probabilities(logits_BG1V[:, :k], sampling)
  tokens_BG = jnp.zeros((batch, k), jnp.int32)
  results: dict[str, float] = {}

  def cache_of(model):
    return model.init_cache(batch, cache_length).replace(lengths=lengths_B - 1)

  # Draft model calls: the loop's K calls (2 tokens, then 1), each fed the last argmax.
  def draft_calls(cache, token_B):
    positions_B2 = jnp.stack([lengths_B - 2, lengths_B - 1], axis=1)
    logits, cache = draft_model(jnp.stack([token_B, token_B], 1), positions_B2, cache)
    token_B = jnp.argmax(logits[:, -1], -1).astype(jnp.int32)
    for t in range(1, k):
      logits, cache = draft_model(token_B[:, None], (lengths_B + t - 1)[:, None], cache)
      token_B = jnp.argmax(logits[:, 0], -1).astype(jnp.int32)
    return cache, token_B

  # The scoring call: K + 1 tokens through the target.
  def score(cache, token_B):
    positions = (lengths_B - 1)[:, None] + jnp.arange(k + 1)
    logits, cache = target(jnp.repeat(token_B[:, None], k + 1, 1), positions, cache)
    return cache, jnp.argmax(logits[:, -1], -1).astype(jnp.int32)

  def both(i, carry):
    target_cache, draft_cache, token_B = carry
    target_cache, token_B = score(target_cache, token_B)
    draft_cache, token_B = draft_calls(draft_cache, token_B)
    return target_cache, draft_cache, token_B

  first_B = rows_B.astype(jnp.int32)
  results["models in loop order"] = _loop_ms(
    both, (cache_of(target), cache_of(draft_model), first_B), max(reps // 4, 4), repeats
  )
  results["draft model calls"] = _loop_ms(
    lambda i, c: draft_calls(*c), (cache_of(draft_model), first_B), reps, repeats
  )

  # Draft sampling: K draws from warped q, each stored; the logits change every rep.
  def draft_sampling(i, carry):
    logits_BV, probs_BGV, tokens_BG = carry
    step_key = threefry.fold_in(key, i)
    for t in range(k):
      q_BV = probabilities(logits_BV, sampling)
      token_B = verification.sample_from(threefry.fold_in(step_key, t), q_BV)
      probs_BGV = probs_BGV.at[:, t].set(q_BV)
      tokens_BG = tokens_BG.at[:, t].set(token_B)
      logits_BV = logits_BV.at[rows_B, token_B].add(1e-3)
    return logits_BV, probs_BGV, tokens_BG

  results["draft sampling"] = _loop_ms(
    draft_sampling, (logits_BV, jnp.zeros_like(q_BGV), tokens_BG), reps, repeats
  )

  results["scoring call"] = _loop_ms(
    lambda i, c: score(*c), (cache_of(target), first_B), max(reps // 4, 4), repeats
  )

  def warp(i, logits_BG1V):
    p = probabilities(logits_BG1V, sampling)
    return logits_BG1V + p * 1e-3

  results["target warping"] = _loop_ms(warp, logits_BG1V, reps, repeats)
  verify = verification.VERIFIERS["argmax" if sampling.greedy else verifier]
  p_BG1V = probabilities(logits_BG1V, sampling)

  def verify_body(i, carry):
    p_BG1V, total_B = carry
    verdict = verify(threefry.fold_in(key, i), tokens_BG, q_BGV, p_BG1V, lengths_B * 0 + k)
    p_BG1V = p_BG1V.at[rows_B, 0, verdict.next_token].add(1e-9)
    return p_BG1V, total_B + verdict.num_accepted

  results["verification"] = _loop_ms(verify_body, (p_BG1V, rows_B * 0), reps, repeats)
  width = context + 2 * k + 64

  def bookkeeping(i, carry):
    tokens_BW, lengths, totals = carry
    accepted_B = (lengths + i) % (k + 1)
    active_B = lengths < width - k - 1
    tokens_BW, count_B, _ = speculative.append(
      tokens_BW,
      lengths,
      active_B,
      tokens_BG,
      accepted_B,
      lengths % 7,
      jnp.full_like(lengths, k + 1),
      None,
      0,
    )
    counted = stats_lib.count_appended(active_B, lengths * 0 + k, accepted_B, count_B, k)
    limit = speculative.next_draft_limit("fixed", lengths * 0 + k, lengths * 0 + k, accepted_B, k)
    new_lengths = jnp.where(lengths + count_B >= width - k - 1, context, lengths + count_B)
    totals = jax.tree.map(lambda a, b: a + b, totals, counted)
    return tokens_BW, new_lengths + limit * 0, totals

  zero_stats = stats_lib.count_appended(
    lengths_B > 0, lengths_B * 0, lengths_B * 0, lengths_B * 0, k
  )
  zero_stats = jax.tree.map(jnp.zeros_like, zero_stats)
  results["append + bookkeeping"] = _loop_ms(
    bookkeeping, (jnp.zeros((batch, width), jnp.int32), lengths_B, zero_stats), reps, repeats
  )

  # The while loop: the real carry (both caches, the buffers) through a body that only counts.
  carry = (
    jnp.int32(0),
    cache_of(target),
    cache_of(draft_model),
    jnp.zeros((batch, width), jnp.int32),
    zero_stats,
  )

  def empty_loop(carry):
    def cond(c):
      return c[0] < reps

    def body(c):
      return (c[0] + 1, *c[1:])

    return jax.lax.while_loop(cond, body, carry)

  run = jax.jit(empty_loop)
  results["while loop"] = _median_ms(lambda: run(carry), repeats) / reps
  return results


def autoregressive_step_ms(
  target: Any, *, batch_size: int, prompt_tokens: int, short: int, long: int, repeats: int
) -> float:
  """Milliseconds per step of the autoregressive loop, by the same difference of two lengths."""
  prompts = jnp.full((batch_size, prompt_tokens), 5, jnp.int32)
  lengths = jnp.full((batch_size,), prompt_tokens, jnp.int32)
  seconds = {}
  for n in (short, long):
    loop, dynamic = autoregressive_loop(
      target, max_new_tokens=n, sampling=SamplingConfig(1.0), cache_length=prompt_tokens + long + 1
    )
    seconds[n] = _median_ms(lambda: loop(dynamic, prompts, lengths, jax.random.key(0)), repeats)
  return (seconds[long] - seconds[short]) / (long - short)


def count_ops(call: Callable[[float, int], Any], long: int, num_draft_tokens: int) -> dict:
  """Launched operations per iteration of the compiled loop, by phase (``hlo_ops``)."""
  loop, target_dynamic, drafter_dynamic = call.loop_of(long)
  args = call.arguments
  compiled = speculative.SpeculativeLoop.__call__.lower(
    loop, target_dynamic, drafter_dynamic, *args, jnp.float32(0)
  ).compile()
  return hlo_ops.count_loop_ops(compiled.as_text(), num_draft_tokens)


def profile_loops(
  target: Any,
  draft: Any,
  *,
  batch_size: int,
  prompt_tokens: int,
  max_new_tokens: int,
  num_draft_tokens: int,
  sampling: SamplingConfig,
  cache_length: int,
  depth: int = 3,
) -> dict[str, dict[str, Any]]:
  """One profiled call of the real speculative loop (token verifier) and of the
  autoregressive loop on the same synthetic prompts: {'speculative'|'autoregressive':
  ``op_profile.profile_call``'s result}, scopes ``depth`` deep."""
  call = speculative_loop(
    target,
    draft,
    batch_size=batch_size,
    prompt_tokens=prompt_tokens,
    max_new_tokens=max_new_tokens,
    num_draft_tokens=num_draft_tokens,
    sampling=sampling,
    cache_length=cache_length,
    verifier="token",
  )
  loop, target_dynamic, drafter_dynamic = call.loop_of(max_new_tokens)
  ar_loop, ar_dynamic = autoregressive_loop(
    target, max_new_tokens=max_new_tokens, sampling=sampling, cache_length=cache_length
  )
  return {
    "speculative": op_profile.profile_call(
      speculative.SpeculativeLoop.__call__,
      (target_dynamic, drafter_dynamic, *call.arguments, jnp.float32(0)),
      (loop,),
      depth=depth,
    ),
    "autoregressive": op_profile.profile_call(
      autoregressive.AutoregressiveLoop.__call__,
      (ar_dynamic, *call.arguments),
      (ar_loop,),
      depth=depth,
    ),
  }


def run(
  config: ml_collections.ConfigDict, workdir: str | None = None, log: Callable = print
) -> dict[str, Any]:
  """The loop benchmark of ``configs/benchmark_loop.py``: per batch size, the costs of the
  models, the loop's iteration at acceptance 0 and 1, each phase alone, and the launched
  operations per iteration; rounds interleaved, medians reported."""
  pair = pair_lib.prepare(config.pair, workdir, log=log)
  k = config.num_draft_tokens
  sampling = SamplingConfig(config.temperature, 0, config.top_p)
  short, long = config.short_tokens, config.long_tokens
  cache_length = config.prompt_tokens + long + k + 1
  records = []
  with Bench(pair, cache_length).mesh():
    for batch in benchmark.parse_list(config.batch_sizes, int):
      call = speculative_loop(
        pair.target,
        pair.draft,
        batch_size=batch,
        prompt_tokens=config.prompt_tokens,
        max_new_tokens=long,
        num_draft_tokens=k,
        sampling=sampling,
        cache_length=cache_length,
      )
      rounds: dict[str, list[float]] = {}

      def note(name: str, value: float) -> None:
        rounds.setdefault(name, []).append(value)

      for index in range(config.rounds):
        note("target step", timing.time_calls(pair.target, batch, 1, cache_length) * 1e3)
        note("draft step", timing.time_calls(pair.draft, batch, 1, cache_length) * 1e3)
        note(
          "autoregressive step",
          autoregressive_step_ms(
            pair.target,
            batch_size=batch,
            prompt_tokens=config.prompt_tokens,
            short=short,
            long=long,
            repeats=3,
          ),
        )
        for acceptance in (0.0, 1.0):
          note(
            f"iteration, acceptance {acceptance:g}", iteration_ms(call, acceptance, short, long, 3)
          )
        phases = phase_ms(
          pair.target,
          pair.draft,
          batch_size=batch,
          num_draft_tokens=k,
          sampling=sampling,
          cache_length=cache_length,
          context=config.prompt_tokens + (short + long) // 2,
          repeats=3,
        )
        for name, value in phases.items():
          note(name, value)
        log(
          f"  batch {batch}, round {index + 1}/{config.rounds}: "
          + ", ".join(f"{name} {values[-1]:.3f}" for name, values in rounds.items())
        )
      ms = {name: statistics.median(values) for name, values in rounds.items()}
      model_ms = ms["scoring call"] + k * ms["draft step"]
      rejected = ms["iteration, acceptance 0"]
      records.append(
        {
          "batch_size": batch,
          "num_draft_tokens": k,
          "rounds": config.rounds,
          "ms": ms,
          "spread_ms": {n: [min(v), max(v)] for n, v in rounds.items()},
          "model_iteration_ms": model_ms,
          "draft_position_ms": (rejected - ms["scoring call"]) / k,
          "draft_position_over_draft_step": (rejected - ms["scoring call"]) / k / ms["draft step"],
          "iteration_over_model": rejected / model_ms,
          "iteration_over_models_in_loop_order": rejected / ms["models in loop order"],
          "ops_per_iteration": count_ops(call, long, k),
        }
      )
      if config.get("profile", False):
        records[-1]["profile"] = profile_loops(
          pair.target,
          pair.draft,
          batch_size=batch,
          prompt_tokens=config.prompt_tokens,
          max_new_tokens=long,
          num_draft_tokens=k,
          sampling=sampling,
          cache_length=cache_length,
          depth=config.get("profile_depth", 3),
        )
  return {"records": records, "settings": config.to_dict()}


def format_table(results: dict[str, Any]) -> str:
  """One Markdown table per batch size: every timed part beside the models."""
  lines = []
  for record in results["records"]:
    ms, spread = record["ms"], record["spread_ms"]
    k = record["num_draft_tokens"]
    lines += [
      f"batch {record['batch_size']}, K={k}, median of {record['rounds']} interleaved rounds "
      "(ms; min-max):",
      "",
      "| part | ms | min-max |",
      "|---|---|---|",
    ]
    for name, value in ms.items():
      low, high = spread[name]
      lines.append(f"| {name} | {value:.3f} | {low:.3f}-{high:.3f} |")
    ops = record["ops_per_iteration"]
    lines += [
      "",
      f"- model: scoring + {k} draft steps = {record['model_iteration_ms']:.3f} ms; an iteration "
      f"(all rejected) costs {record['iteration_over_model']:.2f}x that, "
      f"{record['iteration_over_models_in_loop_order']:.2f}x the models in loop order",
      f"- a draft position: {record['draft_position_ms']:.3f} ms = "
      f"{record['draft_position_over_draft_step']:.2f} draft steps",
      "- launched ops per iteration: "
      + ", ".join(f"{name} {count:.0f}" for name, count in ops.items()),
      "",
    ]
    for loop, result in record.get("profile", {}).items():
      lines += [op_profile.format_profile(f"{loop} loop, one profiled call", result), ""]
  return "\n".join(lines)
