"""The collectives of a compiled XLA program, counted per execution: what the roofline prices at ICI speed.

Reads the text of `compiled.as_text()` (after optimisation and SPMD partitioning, so every collective XLA inserted
is there). Each collective is counted once per execution of the computation it sits in: a `while` body runs its
trip count times (XLA's `known_trip_count`, else the `i < N` bound of its condition with the loop counter's start
value), nested loops multiply. All forms are counted: all-gather, all-reduce, reduce-scatter, all-to-all and
collective-permute, their `-start`/`-done` pairs (counted once, sized by the `-done`) and collectives wrapped in
`async-start` computations. Each collective is attributed to a phase of the RL step by the JAX name scope in its
metadata (`jax.named_scope` in rl_step / model / decode_layout), falling back to the enclosing loop's.
"""
import dataclasses
import math
import re
from typing import Iterable

KINDS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
          "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_ARRAY = re.compile(r"\b([a-z]+[0-9]*(?:e[0-9]m[0-9][a-z0-9]*)?)\[([0-9,]*)\]")
# (scope in the JAX name stack, phase): the first that appears in an op's name wins.
PHASES = (("decode_layout", "decode layout"), ("decode", "rollout decode"), ("prefill", "rollout prefill"),
          ("reference", "reference forward"), ("old_logprobs", "old log-probs forward"), ("update", "update"))


@dataclasses.dataclass(frozen=True)
class Instruction:
  name: str
  shape: str           # the result type as printed (may be a tuple)
  opcode: str
  operands: tuple[str, ...]
  attrs: str           # everything after the operands
  computation: str


@dataclasses.dataclass(frozen=True)
class Collective:
  kind: str                      # one of KINDS
  name: str
  computation: str
  shapes: tuple[tuple[str, tuple[int, ...]], ...]  # the result arrays: (dtype, dims) per device
  result_bytes: int              # bytes of the result on one device
  groups: tuple[tuple[int, ...], ...]  # replica groups (device ids); () = all devices in one group
  count: int                     # executions per run of the program (product of enclosing trip counts)
  op_name: str                   # the JAX name stack from its metadata
  phase: str
  loop: str = ""                 # the outermost while body it runs in ("" = none)
  per_iteration: int = 0         # executions per iteration of that loop (0 = not in a loop)

  @property
  def group_size(self) -> int:
    return len(self.groups[0]) if self.groups else 0

  @property
  def moved_bytes(self) -> float:
    """Bytes each device sends over ICI for one execution (ring algorithms; n = group size): all-gather and
    reduce-scatter (n-1)/n of the gathered size, all-reduce twice that, all-to-all (n-1)/n of its buffer,
    collective-permute its buffer."""
    n = max(self.group_size, 1)
    if self.kind == "collective-permute":
      return float(self.result_bytes)
    if n == 1:
      return 0.0
    full = self.result_bytes * (n if self.kind == "reduce-scatter" else 1)
    factor = 2 if self.kind == "all-reduce" else 1
    return factor * full * (n - 1) / n


def _split_top(text: str, sep: str = ",") -> list[str]:
  """Splits at `sep` outside brackets."""
  out, depth, cur = [], 0, []
  for ch in text:
    if ch in "([{":
      depth += 1
    elif ch in ")]}":
      depth -= 1
    if ch == sep and depth == 0:
      out.append("".join(cur).strip())
      cur = []
    else:
      cur.append(ch)
  if "".join(cur).strip():
    out.append("".join(cur).strip())
  return out


def _balanced(text: str, start: int) -> int:
  """Index just past the bracket group opening at text[start]."""
  depth = 0
  for i in range(start, len(text)):
    if text[i] in "([{":
      depth += 1
    elif text[i] in ")]}":
      depth -= 1
      if depth == 0:
        return i + 1
  raise ValueError(f"unbalanced brackets in HLO line: {text[:200]}")


def _parse_instruction(line: str, computation: str) -> Instruction | None:
  m = re.match(r"\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*", line)
  if not m:
    return None
  rest, i = line[m.end():], 0
  if rest.startswith("("):
    i = _balanced(rest, 0)
  else:
    while i < len(rest) and rest[i] != " ":
      if rest[i] in "([{":
        i = _balanced(rest, i)
      else:
        i += 1
  shape = rest[:i]
  om = re.match(r"\s*([\w\-]+)\(", rest[i:])
  if not om:
    return None
  j = i + om.end() - 1
  k = _balanced(rest, j)
  operands = tuple(re.sub(r"^.*%", "", o).strip() for o in _split_top(rest[j + 1:k - 1]))
  return Instruction(m.group(1), shape, om.group(1), operands, rest[k:], computation)


def parse(text: str) -> tuple[dict[str, list[Instruction]], str]:
  """({computation name: instructions}, entry computation name) of an HLO module's text."""
  comps: dict[str, list[Instruction]] = {}
  entry, current, buf = "", None, []

  def flush():
    if buf and current is not None:
      ins = _parse_instruction(" ".join(buf), current)
      if ins is not None:
        comps[current].append(ins)
    buf.clear()

  for line in text.splitlines():
    if current is None:
      head = re.match(r"(ENTRY\s+)?%?([\w.\-]+)\s*(\(.*\))?\s*->.*\{\s*$", line)
      if head and not line.startswith(" "):
        current = head.group(2)
        comps[current] = []
        entry = current if head.group(1) else entry
      continue
    if line.rstrip() == "}":  # a computation ends on a line of its own (backend configs may span lines)
      flush()
      current = None
    elif re.match(r"\s+(ROOT\s+)?%", line):
      flush()
      buf.append(line)
    else:
      buf.append(line)  # continuation of the instruction before
  if not entry and comps:
    entry = next(iter(comps))
  return comps, entry


def arrays(shape: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
  """The (dtype, dims) arrays of a printed type (tuples flattened; layouts ignored)."""
  no_layout = re.sub(r"\{[^{}]*\}", "", shape)
  return tuple((d, tuple(int(x) for x in dims.split(",") if x)) for d, dims in _ARRAY.findall(no_layout)
               if d in _BYTES)


def nbytes(arrs: Iterable[tuple[str, tuple[int, ...]]]) -> int:
  return sum(_BYTES[d] * math.prod(dims) for d, dims in arrs)


def replica_groups(attrs: str, n_devices: int | None = None) -> tuple[tuple[int, ...], ...]:
  """Replica groups in any of XLA's spellings: explicit {{0,1},{2,3}}, iota [G,S]<=[dims]T(perm), or the mesh form
  mesh['a'=2,'b'=4] {'b'} (devices in row-major mesh order; a group varies the named axes)."""
  m = re.search(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}", attrs)
  if m:
    return tuple(tuple(int(x) for x in g.split(",") if x) for g in re.findall(r"\{([\d,]*)\}", m.group(1)))
  m = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", attrs)
  if m:
    import numpy as np
    gshape = [int(x) for x in m.group(1).split(",")]
    dims = [int(x) for x in m.group(2).split(",")]
    ids = np.arange(math.prod(dims)).reshape(dims)
    if m.group(3):
      ids = ids.transpose([int(x) for x in m.group(3).split(",")])
    return tuple(tuple(int(x) for x in row) for row in ids.reshape(gshape[0], -1))
  m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attrs)
  if m:
    import numpy as np
    axes = [(a.strip().strip("'"), int(s)) for a, s in (p.split("=") for p in m.group(1).split(","))]
    chosen = [a.strip().strip("'") for a in m.group(2).split(",") if a.strip()]
    names = [a for a, _ in axes]
    ids = np.arange(math.prod(s for _, s in axes)).reshape([s for _, s in axes])
    keep = [i for i, a in enumerate(names) if a not in chosen] + [names.index(a) for a in chosen]
    size = math.prod(axes[names.index(a)][1] for a in chosen)
    return tuple(tuple(int(x) for x in row) for row in ids.transpose(keep).reshape(-1, size))
  return ()


def _trip_count(ins: Instruction, comps: dict[str, list[Instruction]], by_name: dict[str, Instruction]) -> int:
  m = re.search(r'"known_trip_count":\{"n":"(\d+)"', ins.attrs)
  if m:
    return int(m.group(1))
  cond = re.search(r"condition=%?([\w.\-]+)", ins.attrs)
  body = comps.get(cond.group(1), []) if cond else []
  consts = {}
  for i in body:
    if i.opcode == "constant":
      v = re.match(r"\s*(-?\d+)", i.operands[0] if i.operands else "")
      if v:
        consts[i.name] = int(v.group(1))
  gte = {i.name: int(re.search(r"index=(\d+)", i.attrs).group(1)) for i in body
         if i.opcode == "get-tuple-element" and re.search(r"index=(\d+)", i.attrs)}
  for i in body:  # i < N (or N > i) on the counter
    if i.opcode == "compare" and len(i.operands) == 2:
      a, b = i.operands
      if "direction=GT" in i.attrs:
        a, b = b, a
      elif "direction=LT" not in i.attrs:
        continue
      if a in gte and b in consts:
        return max(consts[b] - _init_value(ins, gte[a], by_name), 0)
  return 1


def _init_value(ins: Instruction, index: int, by_name: dict[str, Instruction]) -> int:
  """The loop counter's initial value: element `index` of the while's init tuple, when it is a constant."""
  init = by_name.get(ins.operands[0]) if ins.operands else None
  if init is not None and init.opcode == "tuple" and index < len(init.operands):
    c = by_name.get(init.operands[index])
    if c is not None and c.opcode == "constant" and c.operands:
      v = re.match(r"\s*(-?\d+)", c.operands[0])
      if v:
        return int(v.group(1))
  return 0


def _called(ins: Instruction) -> list[tuple[str, bool]]:
  """(computation, is_loop_body) pairs an instruction runs; reducers (to_apply) hold no collectives."""
  out = []
  for key in ("body", "calls", "true_computation", "false_computation"):
    for m in re.finditer(rf"\b{key}=%?([\w.\-]+)", ins.attrs):
      out.append((m.group(1), key == "body"))
  m = re.search(r"branch_computations=\{([^}]*)\}", ins.attrs)
  if m:
    out += [(c.strip().lstrip("%"), False) for c in m.group(1).split(",") if c.strip()]
  return out


def phase_of(op_name: str) -> str:
  for scope, phase in PHASES:
    if re.search(rf"(^|/){scope}(/|$)", op_name):
      return phase
  return ""


def collectives(text: str) -> list[Collective]:
  """Every collective of the program with its executions per run and its phase."""
  comps, entry = parse(text)
  by_name = {i.name: i for instrs in comps.values() for i in instrs}
  count: dict[str, int] = {entry: 1}
  loop_name: dict[str, str] = {entry: ""}
  root: dict[str, str] = {entry: ""}  # the outermost while body a computation runs in
  order = [entry]
  seen = {entry}
  while order:  # computations reachable from the entry, with their multiplicity (a DAG: sum over callers)
    c = order.pop(0)
    for ins in comps.get(c, []):
      if ins.opcode.endswith("-done"):
        continue
      for callee, is_body in _called(ins):
        if callee not in comps:
          continue
        mult = count[c] * (_trip_count(ins, comps, by_name) if is_body else 1)
        count[callee] = count.get(callee, 0) + mult
        op = re.search(r'op_name="([^"]*)"', ins.attrs)
        loop_name[callee] = (op.group(1) if (is_body and op) else "") or loop_name.get(c, "")
        root.setdefault(callee, root[c] or (callee if is_body else ""))
        if callee not in seen:
          seen.add(callee)
          order.append(callee)
  done_of = {i.operands[0]: i for i in by_name.values() if i.opcode.endswith("-done") and i.operands}
  # replica_groups={} (or none): one group of every device of the program
  m = re.search(r"num_partitions=(\d+)", text.split("\n", 1)[0])
  everyone = (tuple(range(int(m.group(1)))),) if m else ()
  out = []
  for c, instrs in comps.items():
    if c not in count:
      continue
    for ins in instrs:
      kind = ins.opcode[:-len("-start")] if ins.opcode.endswith("-start") else ins.opcode
      if kind not in KINDS:
        continue
      shape = done_of[ins.name].shape if ins.opcode.endswith("-start") and ins.name in done_of else ins.shape
      arrs = arrays(shape)
      if ins.opcode.endswith("-start") and ins.name not in done_of:
        arrs = arrs[len(arrs) // 2:]  # (operands, results) tuple
      op = re.search(r'op_name="([^"]*)"', ins.attrs)
      op_name = op.group(1) if op else ""
      out.append(Collective(kind=kind, name=ins.name, computation=c, shapes=arrs, result_bytes=nbytes(arrs),
                            groups=replica_groups(ins.attrs) or everyone, count=count[c], op_name=op_name,
                            phase=phase_of(op_name) or phase_of(loop_name.get(c, "")) or "other",
                            loop=root.get(c, ""), per_iteration=count[c] // count[root[c]] if root.get(c) else 0))
  return out


def in_loop(colls: Iterable[Collective], phase: str, min_count: int = 2) -> list[Collective]:
  """The collectives of `phase` that run inside a loop (at least `min_count` times per run): e.g. the decode loop's
  per-token collectives."""
  return [c for c in colls if c.phase == phase and c.count >= min_count]


def per_iteration_of_busiest_loop(colls: Iterable[Collective], phase: str) -> list[Collective]:
  """The collectives of the outermost loop of `phase` that runs the most per iteration (each counted per iteration
  in `per_iteration`): what one step of a loop with a data-dependent trip count costs, e.g. one decode step of the
  continuous engine (a `while` per compaction phase, each the same step at another slot count)."""
  loops: dict[str, list[Collective]] = {}
  for c in colls:
    if c.phase == phase and c.loop:
      loops.setdefault(c.loop, []).append(c)
  return max(loops.values(), key=lambda cs: sum(c.per_iteration for c in cs), default=[])


def summary(colls: Iterable[Collective]) -> dict[str, dict[str, float]]:
  """{phase: {kind: executions, kind + ' bytes': bytes moved per device}} per run."""
  out: dict[str, dict[str, float]] = {}
  for c in colls:
    d = out.setdefault(c.phase, {})
    d[c.kind] = d.get(c.kind, 0) + c.count
    d[c.kind + " bytes"] = d.get(c.kind + " bytes", 0.0) + c.count * c.moved_bytes
  return out
