"""Launched operations per loop iteration, read from a compiled program's optimized HLO.

Every instruction a backend executes on its own (a fusion, a dot, a copy, a dynamic update,
a nested ``while``) costs a launch on top of its work: a few microseconds on a CPU, a kernel
launch on a GPU, a step of the TPU's instruction stream. A sampler's iteration is a few
model calls and a long tail of small operations, so counting them says where per-iteration
overhead can hide on every backend, including the TPU programs compiled ahead of time
(``experiments.aot``), which cannot be timed here.

``count_loop_ops`` finds the sampler's outer ``while`` (the one whose body holds the
``draft`` / ``score`` / ``verify`` named scopes, or the largest) and counts the
instructions of one trip of its body by phase (the named scope each instruction carries in
its metadata), nested loops included: a loop with a known trip count (the scan over
layers) counts that many times, a loop with a data-dependent trip count (the draft loop,
the blocked attention reads) counts ``dynamic_trips(scope)`` times.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Callable

# Instructions that launch nothing: they name, alias or pack buffers.
_FREE = frozenset(
  ("parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "partition-id")
)
PHASES = ("draft", "score", "verify", "append", "statistics")
"""The speculative loop's named scopes (``speculative.py``); anything else is 'loop'."""


def xla_cost(compiled) -> tuple[float, float]:
  """(FLOPs, bytes accessed) of a compiled program, from XLA's cost analysis (some backends
  return it as a one-element list)."""
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))


def computations(hlo: str) -> dict[str, list[str]]:
  """Instruction lines of each computation of an HLO module's text."""
  found: dict[str, list[str]] = {}
  current = None
  for line in hlo.splitlines():
    header = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
    if header:
      current = found.setdefault(header.group(1), [])
    elif line.startswith("}"):
      current = None
    elif current is not None and " = " in line:
      current.append(line)
  return found


def _call(line: str) -> re.Match | None:
  """The opcode and operand list of an instruction line, after its result type."""
  rhs = line.split(" = ", 1)[1].lstrip()
  if rhs.startswith("("):  # A tuple type: skip to its closing parenthesis.
    depth = 0
    for index, char in enumerate(rhs):
      depth += {"(": 1, ")": -1}.get(char, 0)
      if depth == 0:
        rhs = rhs[index + 1 :]
        break
  else:
    rhs = rhs.split(" ", 1)[1] if " " in rhs else ""
  return re.match(r"\s*([a-z][\w\-]*)\(([^)]*)\)", rhs)


def opcode(line: str) -> str:
  """The opcode of an instruction line: the word after its result type."""
  call = _call(line)
  return call.group(1) if call else "?"


def operands(line: str) -> list[str]:
  """The names of an instruction line's operands, in order."""
  call = _call(line)
  return re.findall(r"%([\w.\-]+)", call.group(2)) if call else []


def op_name(line: str) -> str | None:
  """An instruction line's ``op_name`` metadata (its JAX name stack), or None."""
  name = re.search(r'op_name="([^"]*)"', line)
  return name.group(1) if name else None


def phase_of(line: str) -> str:
  """The loop phase an instruction belongs to, from its ``op_name`` metadata: the first of
  PHASES among its scopes, 'model' inside a model call of no phase, else 'loop'."""
  name = op_name(line)
  scopes = name.split("/") if name else []
  for scope in scopes:
    if scope in PHASES:
      return scope
  return "loop"


def _trip_count(line: str) -> int | None:
  known = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', line)
  return int(known.group(1)) if known else None


def count_ops(
  hlo: str,
  body: str,
  dynamic_trips: Callable[[str], float],
  found: dict[str, list[str]] | None = None,
  enclosing: str = "loop",
) -> collections.Counter:
  """Launched instructions per trip of computation ``body``, by phase, nested loops weighted
  by their trip counts (known, or ``dynamic_trips(while instruction line)``). An
  instruction with no phase of its own counts in ``enclosing``, its loop's or call's."""
  found = found if found is not None else computations(hlo)
  counts: collections.Counter = collections.Counter()
  for line in found.get(body, []):
    kind = opcode(line)
    if kind in _FREE:
      continue
    phase = phase_of(line)
    if phase == "loop" and 'op_name="' not in line:  # A fusion's scope is inside it.
      callee = re.search(r"calls=%?([\w.\-]+)", line)
      inner = [phase_of(fused) for fused in found.get(callee.group(1), [])] if callee else []
      named = [p for p in inner if p != "loop"]
      phase = collections.Counter(named).most_common(1)[0][0] if named else phase
    if phase == "loop":  # No scope of its own: the phase of the loop or call it runs in.
      phase = enclosing
    counts[phase] += 1
    if kind == "while":
      inner = re.search(r"body=%?([\w.\-]+)", line).group(1)
      trips = _trip_count(line)
      weight = trips if trips is not None else dynamic_trips(line)
      for inner_phase, n in count_ops(hlo, inner, dynamic_trips, found, phase).items():
        counts[inner_phase] += n * weight
    elif kind in ("call", "conditional"):
      for callee in re.findall(r"(?:to_apply|calls|branch_computations=\{)[=%]*([\w.\-]+)", line):
        for inner_phase, n in count_ops(hlo, callee, dynamic_trips, found, phase).items():
          counts[inner_phase] += n
  return counts


def loop_body(hlo: str) -> str:
  """The sampler's outer loop body: the entry's ``while`` whose body has the most
  instructions (the prefill's layer scan is the other)."""
  found = computations(hlo)
  entry = re.search(r"^ENTRY %?([\w.\-]+)", hlo, re.M).group(1)
  bodies = [
    re.search(r"body=%?([\w.\-]+)", line).group(1)
    for line in found[entry]
    if opcode(line) == "while"
  ]
  if not bodies:
    raise ValueError("The program has no while loop.")
  return max(bodies, key=lambda name: len(found.get(name, [])))


def count_loop_ops(
  hlo: str, num_draft_tokens: int, attention_blocks: float = 1.0
) -> dict[str, float]:
  """Launched instructions per iteration of a sampler's loop, by phase, and 'total'.

  A loop of data-dependent length counts ``attention_blocks`` trips when it is a blocked
  attention read (the live context's blocks), K - 1 when it is the draft model's loop (the
  first draft call precedes it), and 1 otherwise.
  """

  def dynamic_trips(line: str) -> float:
    name = re.search(r'op_name="([^"]*)"', line)
    name = name.group(1) if name else ""
    if name.endswith("attention/while"):
      return attention_blocks
    if phase_of(line) == "draft":
      return num_draft_tokens - 1
    return 1.0

  counts = count_ops(hlo, loop_body(hlo), dynamic_trips)
  result = {phase: float(counts.get(phase, 0)) for phase in (*PHASES, "loop")}
  result["total"] = float(sum(counts.values()))
  return result
