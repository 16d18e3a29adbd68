"""Where one call of a compiled program spends its time, read from a profile of that call: the
time of every XLA operation it ran, summed by the JAX name scope the operation came from.

The loop's own scopes name its parts (``prefill``, ``draft``, ``score``, ``verify``,
``append``...) and a model's name its layers' halves (``layer_3/attention``, ``layer_3/mlp``,
``logits``); ``scope_of`` keeps the first ``depth`` of them and folds the layer index away,
so ``score/layer/mlp`` is the MLPs of every layer of every scoring call in the profiled call.

What it adds to ``loop_phases`` (each phase timed alone, in a loop of its own): the real loop,
as compiled, with its real verifier, its cache and its fusions, nothing reassembled. What it
costs: the profiler's own time per operation (a few microseconds), so the traced sum is not
the call's time (above it for a loop of many small operations); compare scopes as shares, and
take ``wall_ms`` (untraced) as the call's time.

XLA's CPU backend records an event per operation it runs (jaxlib 0.10: with no flag; older
versions needed ``XLA_FLAGS=--xla_cpu_enable_xprof_traceme=true``); on GPU and TPU the profiler
records the device's operations.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import statistics
import tempfile
import time
from typing import Any

import jax

from specsamp.experiments.proofs import hlo_ops

TRACEME_FLAG = "--xla_cpu_enable_xprof_traceme=true"
"""The XLA flag under which older CPU backends recorded one profiler event per operation."""

_NOT_SCOPES = frozenset({"while", "body", "cond", "closed_call", "checkpoint", "remat", "pjit"})
"""Name-stack entries that are control flow or wrappers, not a scope of the program's own."""

_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+) = ")
_CONTROL_FLOW = frozenset({"while", "conditional", "call"})
"""Opcodes whose own event spans their bodies' operations, which are counted themselves."""


def op_scopes(hlo_text: str) -> dict[str, str]:
  """{operation name: its ``op_name``} for the operations of an optimized HLO module's text.

  An operation that carries no op_name (XLA's CPU backend drops it from the one-row products
  it rewrites, every product of a decode step) takes its first operand's that has one, the
  operands read before it in the text: a product's scope is then its input's (the layer's
  norm for its first products, its activations for the last), which is the layer part it
  belongs to."""
  scopes: dict[str, str] = {}
  for name, line in _instructions(hlo_text):
    own = hlo_ops.op_name(line)
    inherited = (scopes[o] for o in hlo_ops.operands(line) if o in scopes)
    scope = own or next(inherited, None)
    if scope is not None:
      scopes[name] = scope
  return scopes


def _instructions(hlo_text: str):
  """(name, line) of every instruction of an HLO module's text."""
  for line in hlo_text.splitlines():
    match = _INSTRUCTION.match(line)
    if match:
      yield match.group(1), line


def scope_of(op_name: str, depth: int) -> str:
  """The first ``depth`` scopes of an ``op_name`` ('jit(f)/while/body/score/layer_3/mlp/...'
  -> 'score/layer/mlp' at depth 3): the jit's own name, control flow and wrappers dropped,
  ``layer_N`` read as 'layer'. '(top level)' when nothing is left."""
  parts = []
  for part in op_name.split("/")[1:]:
    if part in _NOT_SCOPES or part.startswith(("jit(", "pjit(", "vmap(", "jvp(")):
      continue
    parts.append("layer" if re.fullmatch(r"layer_\d+", part) else part)
    if len(parts) == depth:
      break
  return "/".join(parts) or "(top level)"


def _operation_events(trace_dir: str, module_prefix: str) -> list[tuple[str, float]]:
  """(operation, microseconds) of each operation event of modules named ``module_prefix``* in
  the perfetto trace the profiler wrote under ``trace_dir``."""
  paths = glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"), recursive=True)
  if not paths:
    raise FileNotFoundError(f"The profiler wrote no perfetto trace under {trace_dir}.")
  with gzip.open(paths[0]) as f:
    trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  return [
    (e["args"]["hlo_op"], float(e["dur"]))
    for e in events
    if e.get("ph") == "X"
    and "dur" in e
    and "hlo_op" in e.get("args", {})
    and str(e["args"].get("hlo_module", "")).startswith(module_prefix)
  ]


def profile_call(
  jitted: Any,
  args: tuple,
  static_args: tuple = (),
  *,
  depth: int = 2,
  repeats: int = 3,
  trace_dir: str | None = None,
) -> dict[str, Any]:
  """Profiles one call of ``jitted`` (a ``jax.jit`` function) on ``args``, after its static
  arguments ``static_args`` (a loop's ``self``).

  The program is compiled once here, and that executable is the one timed and traced, so
  every traced operation is found in its HLO. Returns {'wall_ms': the untraced call (median of
  ``repeats``), 'traced_ms': the traced operations' sum, 'scopes': {scope: ms}, 'operations':
  {scope: operations run}, 'unattributed_ms': operations with no op_name}, the scopes sorted
  by time. A control-flow operation's own event spans its body's operations, which are counted
  themselves: it is left out, so nothing is counted twice."""
  compiled = jitted.lower(*static_args, *args).compile()
  run = lambda: jax.block_until_ready(compiled(*args))
  run()
  walls = []
  for _ in range(repeats):
    start = time.perf_counter()
    run()
    walls.append(time.perf_counter() - start)
  hlo = compiled.as_text()
  scopes_of = op_scopes(hlo)
  control = {name for name, line in _instructions(hlo) if hlo_ops.opcode(line) in _CONTROL_FLOW}
  module = re.match(r"HloModule\s+([^\s,]+)", hlo)
  with tempfile.TemporaryDirectory() as scratch:
    directory = trace_dir or scratch
    with jax.profiler.trace(directory, create_perfetto_trace=True):
      run()
    events = _operation_events(directory, module.group(1) if module else "")
  times: collections.Counter = collections.Counter()
  counts: collections.Counter = collections.Counter()
  unattributed = 0.0
  for name, microseconds in events:
    if name in control:
      continue
    if name in scopes_of:
      scope = scope_of(scopes_of[name], depth)
      times[scope] += microseconds / 1e3
      counts[scope] += 1
    else:
      unattributed += microseconds / 1e3
  if not times:
    raise RuntimeError(
      "The profile holds no operation of the call; on a CPU with an older jaxlib, set "
      f"XLA_FLAGS={TRACEME_FLAG} before the first JAX computation."
    )
  return {
    "wall_ms": statistics.median(walls) * 1e3,
    "traced_ms": sum(times.values()) + unattributed,
    "scopes": dict(times.most_common()),
    "operations": {scope: counts[scope] for scope, _ in times.most_common()},
    "unattributed_ms": unattributed,
  }


def format_profile(name: str, result: dict[str, Any], limit: int = 12) -> str:
  """A table of ``result``'s scopes: ms per call and share of the traced time."""
  traced = result["traced_ms"]
  lines = [
    f"{name}: {result['wall_ms']:.2f} ms a call untraced, {traced:.2f} ms of operations traced",
    "| scope | ms | share | operations |",
    "|---|---|---|---|",
  ]
  for scope, ms in list(result["scopes"].items())[:limit]:
    lines.append(f"| {scope} | {ms:.2f} | {ms / traced:.0%} | {result['operations'][scope]} |")
  rest = list(result["scopes"].items())[limit:]
  if rest:
    ms = sum(v for _, v in rest)
    lines.append(f"| ({len(rest)} more) | {ms:.2f} | {ms / traced:.0%} | |")
  if result["unattributed_ms"]:
    ms = result["unattributed_ms"]
    lines.append(f"| (no op_name) | {ms:.2f} | {ms / traced:.0%} | |")
  return "\n".join(lines)
