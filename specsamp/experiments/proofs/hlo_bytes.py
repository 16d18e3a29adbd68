"""Bytes a compiled program moves through HBM, read from its optimized HLO.

XLA's cost analysis is no byte count to trust on TPU: it counts a weight once when a
``copy-start`` prefetches it from HBM into on-chip VMEM, again as that copy's write, and a
third time when the matrix product reads it from VMEM (a plain two-matmul MLP comes out at
3.0x its weight bytes), and it counts a ``while`` body once, whatever its trip count. The
optimized HLO says more: every buffer's layout carries its memory space (``S(1)`` is VMEM,
``S(0)``/none is HBM), and every loop its trip count. This module walks the program the way
it runs:

* The computations that execute: the entry, each ``while`` body times its trip count (known,
  as the scan over layers, or ``dynamic_trips(while)`` for a data-dependent loop), conditional
  branches and calls. Fused computations are not walked as code: a fusion is one kernel.
* Each executed instruction reads its operands that live in HBM and writes its outputs that
  live in HBM. A slice (``dynamic-slice``, ``slice``, ``gather``, fused or not) reads only
  what it slices: a scan's layer of a stacked weight is that layer's bytes. An in-place update
  (``dynamic-update-slice`` at a fusion's root, or unfused) reads and writes only the update:
  its buffer is aliased, not copied. ``copy-start`` counts its source's read and its
  destination's write where they are in HBM; ``*-done`` halves and buffer plumbing
  (``get-tuple-element``, ``tuple``, ``bitcast``, ``parameter``, ``while``) move nothing.
* Every HBM read is traced back through the plumbing, loop carries included, to the
  program's argument it comes from (the parameters and the KV cache), or to an intermediate.
* An intermediate written to HBM that is as large as ``min_bytes`` (a weight matrix's shard)
  is *materialised*: listed with its opcode, shape, the times it runs and its source line
  (what the program returns, e.g. the logits, is written but not listed).

On a CPU, where nothing names a memory space, every buffer counts as main memory.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Callable

_ELEMENT_BYTES = {
  "pred": 1,
  "s8": 1,
  "u8": 1,
  "s16": 2,
  "u16": 2,
  "f16": 2,
  "bf16": 2,
  "s32": 4,
  "u32": 4,
  "f32": 4,
  "s64": 8,
  "u64": 8,
  "f64": 8,
  "c64": 8,
  "c128": 16,
}
# Instructions that move no bytes themselves: they name, alias or pack buffers, or (``while``,
# ``call``, ``conditional``) run computations whose instructions are counted instead.
_PLUMBING = frozenset(
  (
    "parameter",
    "constant",
    "get-tuple-element",
    "tuple",
    "bitcast",
    "after-all",
    "partition-id",
    "replica-id",
    "opt-barrier",
    "add-dependency",
    "while",
    "call",
    "conditional",
  )
)
_SLICES = frozenset(("dynamic-slice", "slice", "gather"))


@dataclasses.dataclass(frozen=True)
class Array:
  """One array of an HLO type: element type, dimensions and memory space (0 is HBM)."""

  dtype: str
  dims: tuple[int, ...]
  memory_space: int

  @property
  def bytes(self) -> int:
    count = 1
    for dim in self.dims:
      count *= dim
    if self.dtype.startswith("f8") or self.dtype.startswith("s4") or self.dtype.startswith("u4"):
      return count if self.dtype.startswith("f8") else (count + 1) // 2
    return count * _ELEMENT_BYTES.get(self.dtype, 0)

  @property
  def in_hbm(self) -> bool:
    return self.memory_space == 0

  def __str__(self) -> str:
    return f"{self.dtype}[{','.join(map(str, self.dims))}]"


@dataclasses.dataclass
class Instruction:
  name: str
  opcode: str
  outputs: list[Array]  # One per element of a tuple type, else one.
  operands: list[str]
  attributes: str  # The rest of the line: calls=, body=, index=, metadata, backend_config.
  arguments: str = ""  # The text between the opcode's parentheses (a parameter's number).
  root: bool = False

  def attribute(self, key: str) -> str | None:
    match = re.search(rf"\b{key}=%?([\w.\-]+)", self.attributes)
    return match.group(1) if match else None

  @property
  def op_name(self) -> str:
    match = re.search(r'op_name="([^"]*)"', self.attributes)
    return match.group(1) if match else ""


def _split_top(text: str) -> list[str]:
  """``text`` split at the commas outside any bracket."""
  parts, depth, start = [], 0, 0
  for index, char in enumerate(text):
    if char in "([{":
      depth += 1
    elif char in ")]}":
      depth -= 1
    elif char == "," and depth == 0:
      parts.append(text[start:index])
      start = index + 1
  parts.append(text[start:])
  return [part for part in (p.strip() for p in parts) if part]


def _balanced(text: str, start: int) -> int:
  """The index just past the bracket group opening at ``text[start]``."""
  depth = 0
  for index in range(start, len(text)):
    depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(text[index], 0)
    if depth == 0:
      return index + 1
  raise ValueError(f"Unbalanced HLO text: {text[start : start + 80]!r}")


def parse_type(text: str) -> list[Array]:
  """The arrays of an HLO type (a tuple's elements in order, nested tuples flattened)."""
  text = re.sub(r"/\*.*?\*/", "", text).strip()
  if text.startswith("("):
    return [array for part in _split_top(text[1:-1]) for array in parse_type(part)]
  match = re.match(r"(\w+)\[([\d,]*)\](?:\{([^}]*)\})?", text)
  if not match:
    return []
  dims = tuple(int(d) for d in match.group(2).split(",") if d)
  space = re.search(r"S\((\d+)\)", match.group(3) or "")
  return [Array(match.group(1), dims, int(space.group(1)) if space else 0)]


def parse_instruction(line: str) -> Instruction | None:
  line = line.strip()
  root = line.startswith("ROOT ")
  if root:
    line = line[5:]
  if " = " not in line:
    return None
  name, rhs = line.split(" = ", 1)
  rhs = rhs.lstrip()
  if rhs.startswith("("):
    end = _balanced(rhs, 0)
  else:
    end = rhs.index(" ") if " " in rhs else len(rhs)
  type_text, rest = rhs[:end], rhs[end:].lstrip()
  match = re.match(r"([a-z][\w\-]*)\(", rest)
  if not match:
    return None
  close = _balanced(rest, match.end() - 1)
  operands = re.findall(r"%([\w.\-]+)", rest[match.end() - 1 : close])
  return Instruction(
    name=name.lstrip("%"),
    opcode=match.group(1),
    outputs=parse_type(type_text),
    operands=operands,
    attributes=rest[close:],
    arguments=rest[match.end() : close - 1],
    root=root,
  )


@dataclasses.dataclass
class Module:
  """An HLO module's computations, each a name -> instruction table in program order."""

  computations: dict[str, dict[str, Instruction]]
  entry: str

  @classmethod
  def parse(cls, hlo: str) -> Module:
    computations: dict[str, dict[str, Instruction]] = {}
    entry, current = None, None
    for line in hlo.splitlines():
      header = re.match(r"^(ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
      if header:
        current = computations.setdefault(header.group(2), {})
        entry = header.group(2) if header.group(1) else entry
      elif line.startswith("}"):
        current = None
      elif current is not None:
        instruction = parse_instruction(line)
        if instruction is not None:
          current[instruction.name] = instruction
    if entry is None:
      raise ValueError("The HLO text has no ENTRY computation.")
    return cls(computations, entry)

  def root(self, computation: str) -> Instruction:
    instructions = self.computations[computation]
    return next((i for i in instructions.values() if i.root), list(instructions.values())[-1])


def _users(instructions: dict[str, Instruction], name: str) -> list[Instruction]:
  return [i for i in instructions.values() if name in i.operands]


def _fused_read(module: Module, fused: str, index: int, full: int) -> int:
  """Bytes a fusion reads of its operand ``index`` (``full`` bytes in all): what its slices
  take when the fused computation only slices it, 0 when it is the buffer an in-place
  update at the root writes into, else all of it."""
  instructions = module.computations.get(fused, {})
  parameter = next(
    (
      i
      for i in instructions.values()
      if i.opcode == "parameter" and _parameter_number(i) == str(index)
    ),
    None,
  )
  if parameter is None:
    return full
  total, frontier = 0, [parameter.name]
  while frontier:
    name = frontier.pop()
    users = _users(instructions, name)
    if not users or instructions[name].root:
      return full  # It is (a view of) the fusion's output: all of it read.
    for user in users:
      if user.opcode == "bitcast":
        frontier.append(user.name)
      elif user.opcode in _SLICES and user.operands[0] == name:
        total += sum(a.bytes for a in user.outputs)
      elif user.opcode in ("dynamic-update-slice", "scatter") and user.operands[0] == name:
        continue  # The aliased buffer of an in-place update: not read.
      elif user.opcode == "fusion" and user.attribute("calls"):
        positions = [k for k, operand in enumerate(user.operands) if operand == name]
        total += sum(_fused_read(module, user.attribute("calls"), k, full) for k in positions)
      else:
        return full
  return min(total, full)


def _parameter_number(instruction: Instruction) -> str:
  return instruction.arguments.strip()


def _in_place_updates(module: Module, fused: str) -> dict[int, tuple[int, int]]:
  """Output element -> (fused parameter number it updates in place, update bytes), for the
  root's ``dynamic-update-slice``s (the root itself, or elements of a root tuple)."""
  instructions = module.computations.get(fused, {})
  if not instructions:
    return {}
  root = module.root(fused)
  elements = [instructions.get(n) for n in root.operands] if root.opcode == "tuple" else [root]
  found = {}
  for element_index, element in enumerate(elements):
    while element is not None and element.opcode == "bitcast":
      element = instructions.get(element.operands[0])
    if element is None or element.opcode not in ("dynamic-update-slice", "scatter"):
      continue
    buffer = instructions.get(element.operands[0])
    while buffer is not None and buffer.opcode == "bitcast":
      buffer = instructions.get(buffer.operands[0])
    # dynamic-update-slice(buffer, update, offsets...); scatter(buffer, indices, updates).
    update = instructions.get(element.operands[1 if element.opcode != "scatter" else 2])
    if buffer is not None and buffer.opcode == "parameter" and update is not None:
      found[element_index] = (int(_parameter_number(buffer)), sum(a.bytes for a in update.outputs))
  return found


@dataclasses.dataclass
class Intermediate:
  """A buffer at least ``min_bytes`` large that an instruction writes to HBM, not in place."""

  computation: str
  name: str
  opcode: str
  shape: str
  bytes: int
  times: float  # Executions per program run.
  op_name: str


@dataclasses.dataclass
class ByteCount:
  """HBM bytes of one run of a program.

  Attributes:
    arguments: name (the jit argument's path, e.g. 'm.blocks.mlp.up_DF.value') -> bytes the
      argument holds on one device.
    reads: argument name -> bytes read from it per run; '(intermediate)' for the rest.
    writes: argument name -> bytes written into it in place; '(intermediate)' for the rest.
    materialised: intermediates of at least ``min_bytes`` written to HBM.
  """

  arguments: dict[str, int]
  reads: dict[str, float]
  writes: dict[str, float]
  materialised: list[Intermediate]

  @property
  def read_bytes(self) -> float:
    return sum(self.reads.values())

  @property
  def written_bytes(self) -> float:
    return sum(self.writes.values())

  def read_of(self, prefix: str) -> float:
    """Bytes read from the arguments whose names start with ``prefix``."""
    return sum(v for k, v in self.reads.items() if k.startswith(prefix))


def count(
  hlo: str,
  dynamic_trips: Callable[[Instruction], float] = lambda _: 1.0,
  min_bytes: int = 1 << 20,
) -> ByteCount:
  """HBM bytes one run of a compiled program reads and writes (see the module docstring).

  Args:
    hlo: the compiled program's text (``compiled.as_text()``), SPMD-partitioned: shapes are
      one device's.
    dynamic_trips: trips of a ``while`` without a known trip count, given the instruction.
    min_bytes: intermediates written to HBM at least this large are listed as materialised.
  """
  module = Module.parse(hlo)
  entry = module.computations[module.entry]
  arguments: dict[int, str] = {}
  argument_bytes: dict[str, int] = {}
  for instruction in entry.values():
    if instruction.opcode == "parameter":
      label = instruction.op_name or f"parameter {_parameter_number(instruction)}"
      arguments[int(_parameter_number(instruction))] = label
      argument_bytes[label] = sum(a.bytes for a in instruction.outputs)
  # Who runs each computation: (caller computation, instruction) for while bodies,
  # conditional branches and calls (their parameters are the caller's operands).
  callers: dict[str, tuple[str, Instruction]] = {}
  for computation, instructions in module.computations.items():
    for instruction in instructions.values():
      if instruction.opcode == "while":
        for key in ("body", "condition"):
          callers[instruction.attribute(key)] = (computation, instruction)
      elif instruction.opcode == "conditional":
        for callee in re.findall(r"%([\w.\-]+)", _branches(instruction)):
          callers[callee] = (computation, instruction)
      elif instruction.opcode == "call":
        callers[instruction.attribute("to_apply")] = (computation, instruction)

  def source(computation: str, name: str, path: tuple[int, ...] = ()) -> str | None:
    """The program argument a buffer (or a tuple element ``path`` of it) is, if any."""
    for _ in range(10_000):
      instruction = module.computations[computation].get(name)
      if instruction is None:
        return None
      opcode = instruction.opcode
      if opcode == "parameter":
        if computation == module.entry:
          return arguments.get(int(_parameter_number(instruction)))
        if computation not in callers:
          return None
        caller, call = callers[computation]
        number = int(_parameter_number(instruction))
        if call.opcode == "while":
          computation, name = caller, call.operands[0]
        elif call.opcode == "conditional":
          branches = re.findall(r"%([\w.\-]+)", _branches(call))
          computation, name = caller, call.operands[branches.index(computation) + 1]
        else:
          computation, name = caller, call.operands[number]
      elif opcode == "get-tuple-element":
        index = int(re.search(r"index=(\d+)", instruction.attributes).group(1))
        name, path = instruction.operands[0], (index, *path)
      elif opcode == "tuple":
        if not path:
          return None
        name, path = instruction.operands[path[0]], path[1:]
      elif opcode in ("bitcast", "copy-done", "while", "dynamic-update-slice"):
        name = instruction.operands[0]
      elif opcode == "copy-start":
        name, path = instruction.operands[0], ()
      elif opcode == "fusion":
        updates = _in_place_updates(module, instruction.attribute("calls"))
        element = path[0] if path and len(instruction.outputs) > 1 else 0
        if element not in updates:
          return None
        name, path = instruction.operands[updates[element][0]], ()
      else:
        return None
    return None

  reads: collections.Counter = collections.Counter()
  writes: collections.Counter = collections.Counter()
  materialised: list[Intermediate] = []
  # What the program returns must be written: never listed as materialised.
  entry_root = module.root(module.entry)
  outputs = {entry_root.name, *(entry_root.operands if entry_root.opcode == "tuple" else ())}

  def operand_array(computation: str, instruction: Instruction, k: int) -> Array | None:
    """The array operand ``k`` of ``instruction`` is (a tuple element resolved)."""
    operand = module.computations[computation].get(instruction.operands[k])
    if operand is None or not operand.outputs:
      return None
    return operand.outputs[0] if len(operand.outputs) == 1 else None

  def read(computation: str, instruction: Instruction, k: int, nbytes: float, weight: float):
    array = operand_array(computation, instruction, k)
    if array is None or not array.in_hbm or nbytes <= 0:
      return
    label = source(computation, instruction.operands[k]) or "(intermediate)"
    reads[label] += nbytes * weight

  def write(
    computation: str,
    instruction: Instruction,
    array: Array,
    into: str | None,
    nbytes,
    weight: float,
  ):
    if not array.in_hbm or nbytes <= 0:
      return
    writes[into or "(intermediate)"] += nbytes * weight
    returned = computation == module.entry and instruction.name in outputs
    if into is None and nbytes >= min_bytes and not returned:
      materialised.append(
        Intermediate(
          computation,
          instruction.name,
          instruction.opcode,
          str(array),
          int(nbytes),
          weight,
          instruction.op_name,
        )
      )

  def walk(computation: str, weight: float, seen: tuple[str, ...]) -> None:
    for instruction in module.computations.get(computation, {}).values():
      opcode = instruction.opcode
      if opcode == "while":
        body = instruction.attribute("body")
        trips = _static_trips(module, computation, instruction)
        trips = dynamic_trips(instruction) if trips is None else trips
        if body not in seen:
          walk(body, weight * trips, (*seen, body))
        continue
      if opcode == "conditional":  # Every branch counted: an upper bound.
        for branch in re.findall(r"%([\w.\-]+)", _branches(instruction)):
          walk(branch, weight, (*seen, branch))
        continue
      if opcode == "call":
        walk(instruction.attribute("to_apply"), weight, (*seen, computation))
        continue
      if opcode in _PLUMBING or opcode.endswith("-done"):
        continue
      if opcode == "fusion":
        fused = instruction.attribute("calls")
        for k in range(len(instruction.operands)):
          array = operand_array(computation, instruction, k)
          if array is not None:
            read(computation, instruction, k, _fused_read(module, fused, k, array.bytes), weight)
        updates = _in_place_updates(module, fused)
        for element, array in enumerate(instruction.outputs):
          if element in updates:
            parameter, update_bytes = updates[element]
            into = source(computation, instruction.operands[parameter])
            write(computation, instruction, array, into or "(in place)", update_bytes, weight)
          else:
            write(computation, instruction, array, None, array.bytes, weight)
        continue
      if opcode == "copy-start":  # (destination, source, context).
        array = operand_array(computation, instruction, 0)
        if array is not None:
          read(computation, instruction, 0, array.bytes, weight)
        write(
          computation,
          instruction,
          instruction.outputs[0],
          None,
          instruction.outputs[0].bytes,
          weight,
        )
        continue
      if opcode in _SLICES or opcode.removesuffix("-start") in _SLICES:
        outputs = instruction.outputs
        if opcode.endswith("-start"):  # (operand, result, context): the result is the slice.
          outputs = outputs[1:2]
        nbytes = sum(a.bytes for a in outputs)
        read(computation, instruction, 0, nbytes, weight)
        for k in range(1, len(instruction.operands)):
          array = operand_array(computation, instruction, k)
          if array is not None:
            read(computation, instruction, k, array.bytes, weight)
        for array in outputs:
          write(computation, instruction, array, None, array.bytes, weight)
        continue
      if opcode == "dynamic-update-slice":
        update = operand_array(computation, instruction, 1)
        if update is not None:
          read(computation, instruction, 1, update.bytes, weight)
          into = source(computation, instruction.operands[0])
          write(
            computation,
            instruction,
            instruction.outputs[0],
            into or "(in place)",
            update.bytes,
            weight,
          )
        continue
      for k in range(len(instruction.operands)):
        array = operand_array(computation, instruction, k)
        if array is not None:
          read(computation, instruction, k, array.bytes, weight)
      outputs = instruction.outputs
      if opcode.endswith("-start") and len(outputs) > 1:
        outputs = outputs[len(outputs) // 2 :]  # Async pairs: (operands, results).
      for array in outputs:
        write(computation, instruction, array, None, array.bytes, weight)

  walk(module.entry, 1.0, (module.entry,))
  materialised.sort(key=lambda m: -m.bytes * m.times)
  return ByteCount(argument_bytes, dict(reads), dict(writes), materialised)


def _branches(instruction: Instruction) -> str:
  match = re.search(r"branch_computations=\{([^}]*)\}", instruction.attributes)
  if match:
    return match.group(1)
  names = [instruction.attribute(k) for k in ("true_computation", "false_computation")]
  return ", ".join(f"%{n}" for n in names if n)


def _static_trips(module: Module, computation: str, loop: Instruction) -> int | None:
  """A ``while``'s trip count when it is static: XLA's ``known_trip_count``, or a condition
  ``i < N`` (or ``<=``) on a carry element that starts at a constant (a scan's counter)."""
  known = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', loop.attributes)
  if known:
    return int(known.group(1))
  condition = module.computations.get(loop.attribute("condition"), {})
  if not condition:
    return None
  root = module.root(loop.attribute("condition"))
  direction = re.search(r"direction=(\w+)", root.attributes)
  if root.opcode != "compare" or not direction or direction.group(1) not in ("LT", "LE"):
    return None
  counter, bound = (condition.get(name) for name in root.operands)
  if bound is None or bound.opcode != "constant" or counter is None:
    return None
  if counter.opcode != "get-tuple-element":
    return None
  index = int(re.search(r"index=(\d+)", counter.attributes).group(1))
  caller = module.computations[computation]
  init = caller.get(loop.operands[0])
  start = caller.get(init.operands[index]) if init is not None and init.opcode == "tuple" else None
  while start is not None and start.opcode in ("copy", "bitcast"):
    start = caller.get(start.operands[0])
  if start is None or start.opcode != "constant":
    return None
  try:
    first, last = int(start.arguments), int(bound.arguments)
  except ValueError:
    return None
  return max(last - first + (direction.group(1) == "LE"), 0)
