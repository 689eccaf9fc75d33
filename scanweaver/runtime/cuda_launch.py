"""Launch descriptions as plain data: what a runtime needs to launch a generated kernel.

This module imports only the standard library, so a deployed artifact (`scanweaver.load`)
can read and evaluate launch descriptions without xDSL or the MLIR tools.  The GPU
lowering writes the same values into a `scanweaver.launch` attribute on each kernel
(`rewrites/launch.py` encodes and decodes it).

Conventions
-----------
* `grid` entries are ints, or for dynamic shapes a product over kernel argument
  sizes such as `"h.shape[0]*h.shape[2]"` (`resolve_grid` evaluates it; `grid_terms`
  parses it, which is also what the lowering builds the host IR's grid from, so the
  runtime and the `gpu.launch_func` in the IR use one formula).  A factor may also be
  `cdiv(h.shape[1],8192)`: ceil(size / 8192), at least 1 (the time chunks of a
  multi-block scan; one block still runs for an empty axis, to write `final`), or
  `span(h.shape[0],1,2)`: max(0, ceil((size - 1) / 2)), the trip count of a channel
  loop `for c = 1 to h.shape[0] step 2` (never negative when the size is below 1).
  An entry `"expr:..."` is a prefix formula (`add`, `sub`, `mul`, `divu`, `ceildivu`,
  `mins`, `maxs`, ... over ints and sizes, `eval_size_expr`): the index arithmetic of
  a channel-program kernel's grid and scratch sizes (`rewrites/gpu_channel_program.py`).
* `args` are in kernel-parameter order: `(name, kind, dtype, shape)`; kind is `"in"`,
  `"out"`, `"inout"` for memrefs and `"scalar"` for a scalar parameter (shape `()`);
  dtype a MLIR element type name (`f32`, `bf16`, `i32`, `index`, ...); shape a tuple of
  ints, `"?"` for a dynamic size.
* `host_args[i]` is the position of kernel argument i among the host function's
  arguments (`-1` when it is not a function argument), or `-2 - j` for the function's
  scratch buffer j: device memory the runtime allocates for one call (multi-block scans
  pass tile aggregates between launches through it).  The first launch that names
  buffer j gives its shape in `scratch` as `(arg name, shape entries)`, entries being
  grid-entry formulas over that launch's other arguments.
* ABI (`abi = "memref-descriptor"`): every memref argument is an expanded descriptor
  `(ptr allocated, ptr aligned, i64 offset, i64 sizes[rank], i64 strides[rank])`, i.e.
  `3 + 2 * rank` kernel parameters; a scalar argument is one parameter of its type.
* Shared memory: `shared_bytes` is the *static* shared memory the kernel declares
  (`memref.global` in address space 3, which becomes `.shared` in the PTX).  The launch
  asks for `dynamic_shared_bytes` more, always 0 for ScanWeaver's kernels: passing the
  static size again as dynamic memory would double the request per block.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from scanweaver.errors import ScanWeaverValueError

ShapeEntry = int | str
ArgDesc = tuple[str, str, str, tuple[ShapeEntry, ...]]

#: Bytes of a scalar kernel parameter of each MLIR type
SCALAR_BYTES = {"f32": 4, "f64": 8, "i1": 1, "i8": 1, "i16": 2, "i32": 4, "i64": 8, "index": 8}

#: Static shared memory a block may declare, and the default dynamic limit without
#: an opt-in (`cudaFuncAttributeMaxDynamicSharedMemorySize`), on every chip since sm_70.
SHARED_PER_BLOCK_LIMIT = 48 * 1024

#: `scan.affine` attribute choosing the GPU strategy: "time_blocks" (several blocks per
#: channel, in time; `rewrites/affine_time_blocks.py`) or "chained" (one block per channel)
TIME_BLOCKS_ATTR = "scanweaver.gpu_strategy"

#: Below this many channels one block per channel leaves SMs idle: 2 blocks per SM of
#: the largest chip we target (H200: 132 SMs).
TIME_BLOCKS_MAX_CHANNELS = 2 * 132


def prefer_time_blocks(channels: int, length: int, chunk: int) -> bool:
    """Several blocks per channel (in time) for few channels and rows of >= 2 chunks."""
    return channels < TIME_BLOCKS_MAX_CHANNELS and length >= 2 * chunk

_DIM = re.compile(r"^(\w+)\.shape\[(\d+)\]$")
_CDIV = re.compile(r"^cdiv\((\w+)\.shape\[(\d+)\],(\d+)\)$")
_SPAN = re.compile(r"^span\((\w+)\.shape\[(\d+)\],(\d+),(\d+)\)$")

#: one factor of a grid entry: an int, (arg, dim) for a size, (arg, dim, n) for
#: max(1, ceil(size / n)), or (arg, dim, lb, step) for max(0, ceil((size - lb) / step))
GridTerm = int | tuple[str, int] | tuple[str, int, int] | tuple[str, int, int, int]


def cdiv_at_least_1(size: int, n: int) -> int:
    return max(1, -(-size // n))


def loop_trip(size: int, lb: int, step: int) -> int:
    """Iterations of `for i = lb to size step step`: 0 when size <= lb."""
    return max(0, -(-(size - lb) // step))


def _size_factor(size: int, term: GridTerm) -> int:
    """The value of a (arg, dim, ...) factor for `size` = arg.shape[dim]."""
    if len(term) == 3:
        return cdiv_at_least_1(size, term[2])  # type: ignore[misc]
    if len(term) == 4:
        return loop_trip(size, term[2], term[3])  # type: ignore[misc]
    return size


def grid_terms(expr: ShapeEntry) -> list[GridTerm]:
    """The factors of one grid entry: ints, (argument name, dimension) pairs, or
    (argument name, dimension, n) for `cdiv(name.shape[dim],n)`."""
    if isinstance(expr, int):
        return [expr]
    terms: list[GridTerm] = []
    for term in expr.split("*"):
        term = term.strip()
        if term.isdigit():
            terms.append(int(term))
            continue
        c = _CDIV.match(term.replace(" ", ""))
        if c and int(c.group(3)) > 0:
            terms.append((c.group(1), int(c.group(2)), int(c.group(3))))
            continue
        sp = _SPAN.match(term.replace(" ", ""))
        if sp and int(sp.group(4)) > 0:
            terms.append((sp.group(1), int(sp.group(2)), int(sp.group(3)), int(sp.group(4))))
            continue
        m = _DIM.match(term)
        if not m:
            raise ScanWeaverValueError(f"cannot parse launch size term {term!r} of {expr!r}")
        terms.append((m.group(1), int(m.group(2))))
    return terms


#: `expr:` size formulas (channel-program kernels): prefix calls over ints and sizes
_EXPR_OPS = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "divu": lambda a, b: a // b if b else 0, "divs": lambda a, b: int(a / b) if b else 0,
    "ceildivu": lambda a, b: -(-a // b) if b else 0,
    "mins": min, "maxs": max, "minu": min, "maxu": max,
}
_EXPR_TOKEN = re.compile(r"\s*(\w+\.shape\[\d+\]|-?\d+|\w+|[(),])")


def eval_size_expr(expr: str, shapes: dict[str, tuple[int, ...]]) -> int:
    """Evaluate an `expr:` formula such as `expr:mul(add(u.shape[2],1),4)` (the index
    arithmetic of a kernel's scratch sizes and grid, as the IR computes it)."""
    toks = _EXPR_TOKEN.findall(expr[len("expr:"):])
    pos = 0

    def term() -> int:
        nonlocal pos
        if pos >= len(toks):
            raise ScanWeaverValueError(f"cannot parse launch size {expr!r}")
        t = toks[pos]
        pos += 1
        m = _DIM.match(t)
        if m:
            name, dim = m.group(1), int(m.group(2))
            if name not in shapes or dim >= len(shapes[name]):
                raise ScanWeaverValueError(f"cannot evaluate launch size {expr!r}: no size {name}.shape[{dim}]")
            return shapes[name][dim]
        if t.lstrip("-").isdigit():
            return int(t)
        if t not in _EXPR_OPS or toks[pos:pos + 1] != ["("]:
            raise ScanWeaverValueError(f"cannot parse launch size {expr!r} at {t!r}")
        pos += 1
        a = term()
        if toks[pos:pos + 1] != [","]:
            raise ScanWeaverValueError(f"cannot parse launch size {expr!r}")
        pos += 1
        b = term()
        if toks[pos:pos + 1] != [")"]:
            raise ScanWeaverValueError(f"cannot parse launch size {expr!r}")
        pos += 1
        return _EXPR_OPS[t](a, b)

    value = term()
    if pos != len(toks):
        raise ScanWeaverValueError(f"cannot parse launch size {expr!r}")
    return max(0, value)


def eval_grid_entry(expr: ShapeEntry, shapes: dict[str, tuple[int, ...]]) -> int:
    if isinstance(expr, str) and expr.startswith("expr:"):
        return eval_size_expr(expr, shapes)
    factors = []
    for t in grid_terms(expr):
        if isinstance(t, int):
            factors.append(t)
            continue
        name, dim = t[0], t[1]
        if name not in shapes or dim >= len(shapes[name]):
            raise ScanWeaverValueError(f"cannot evaluate launch size {expr!r}: no size {name}.shape[{dim}]")
        factors.append(_size_factor(shapes[name][dim], t))
    return math.prod(factors)


@dataclass(frozen=True)
class KernelLaunch:
    kernel_name: str
    module_name: str
    grid: tuple[ShapeEntry, ShapeEntry, ShapeEntry]
    block: tuple[int, int, int]
    shared_bytes: int  # static shared memory the kernel declares
    args: list[ArgDesc] = field(default_factory=list)
    func_name: str = ""
    host_args: tuple[int, ...] = ()
    abi: str = "memref-descriptor"
    notes: str = ""
    dynamic_shared_bytes: int = 0  # what the launch asks for on top (always 0 here)
    # sizes the kernel assumes equal: (arg, dim, other arg, other dim); a kernel that
    # reads `a` with the sizes of `h` would read out of bounds if they differed
    equal_dims: tuple[tuple[str, int, str, int], ...] = ()
    # (arg, dim, other arg, other dim): arg.shape[dim] >= other.shape[other dim], where
    # a loop running over `other`'s size indexes `arg` (loop nests raised from code)
    covers_dims: tuple[tuple[str, int, str, int], ...] = ()
    # scratch buffers this launch allocates first: (arg name, shape entries over the
    # launch's other arguments); see `host_args`
    scratch: tuple[tuple[str, tuple[ShapeEntry, ...]], ...] = ()

    # -- runtime helpers ------------------------------------------------------------
    def arg_shapes(self, arrays: list[Any]) -> dict[str, tuple[int, ...]]:
        return {name: tuple(arr.shape) for (name, *_), arr in zip(self.args, arrays)}

    def resolve_grid(self, shapes: dict[str, tuple[int, ...]]) -> tuple[int, int, int]:
        """Evaluate the grid for concrete argument shapes (name -> shape)."""
        return tuple(eval_grid_entry(g, shapes) for g in self.grid)  # type: ignore[return-value]

    def scratch_shape(self, name: str, shapes: dict[str, tuple[int, ...]]) -> tuple[int, ...]:
        """The shape of scratch argument `name` for these argument shapes."""
        for arg, entries in self.scratch:
            if arg == name:
                return tuple(eval_grid_entry(x, shapes) for x in entries)
        raise ScanWeaverValueError(f"kernel {self.kernel_name}: no scratch shape for argument '{name}'")

    def check_shapes(self, shapes: dict[str, tuple[int, ...]]) -> None:
        """Raise `ScanWeaverValueError` unless the sizes in `equal_dims` agree."""
        for a, i, b, j in self.equal_dims:
            if a in shapes and b in shapes and shapes[a][i] != shapes[b][j]:
                raise ScanWeaverValueError(
                    f"kernel {self.kernel_name}: argument '{a}' has shape {shapes[a]} and '{b}' has "
                    f"shape {shapes[b]}; {a}.shape[{i}] must equal {b}.shape[{j}]"
                )
        for a, i, b, j in self.covers_dims:
            if a in shapes and b in shapes and shapes[a][i] < shapes[b][j]:
                raise ScanWeaverValueError(
                    f"kernel {self.kernel_name}: argument '{a}' has shape {shapes[a]} and '{b}' has "
                    f"shape {shapes[b]}; a loop over {b}.shape[{j}] indexes {a}.shape[{i}], which is smaller"
                )

    def param_count(self) -> int:
        """Number of kernel parameters after MLIR's memref-descriptor expansion."""
        return sum(1 if kind == "scalar" else 3 + 2 * len(shape) for (_, kind, _, shape) in self.args)

    def param_sizes(self) -> list[int]:
        """Bytes of each kernel parameter: 8 for every pointer, offset, size and stride
        of a memref descriptor, the type's size for a scalar."""
        sizes: list[int] = []
        for _, kind, dtype, shape in self.args:
            sizes += [SCALAR_BYTES[dtype]] if kind == "scalar" else [8] * (3 + 2 * len(shape))
        return sizes

    # -- plain-data encoding (the artifact's launch.json) ------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel_name,
            "module": self.module_name,
            "function": self.func_name,
            "grid": list(self.grid),
            "block": list(self.block),
            "static_shared_bytes": self.shared_bytes,
            "dynamic_shared_bytes": self.dynamic_shared_bytes,
            "args": [[n, k, t, list(s)] for n, k, t, s in self.args],
            "host_args": list(self.host_args),
            "abi": self.abi,
            "equal_dims": [list(e) for e in self.equal_dims],
            "covers_dims": [list(e) for e in self.covers_dims],
            "scratch": [[n, list(s)] for n, s in self.scratch],
            "notes": self.notes,
        }

    @staticmethod
    def from_json(d: dict[str, Any]) -> KernelLaunch:
        return KernelLaunch(
            kernel_name=d["kernel"],
            module_name=d.get("module", ""),
            func_name=d.get("function", ""),
            grid=tuple(d["grid"]),  # type: ignore[arg-type]
            block=tuple(d["block"]),  # type: ignore[arg-type]
            shared_bytes=int(d["static_shared_bytes"]),
            dynamic_shared_bytes=int(d.get("dynamic_shared_bytes", 0)),
            args=[(n, k, t, tuple(s)) for n, k, t, s in d["args"]],
            host_args=tuple(d.get("host_args", ())),
            abi=d.get("abi", "memref-descriptor"),
            equal_dims=tuple(tuple(e) for e in d.get("equal_dims", ())),  # type: ignore[misc]
            covers_dims=tuple(tuple(e) for e in d.get("covers_dims", ())),  # type: ignore[misc]
            scratch=tuple((n, tuple(s)) for n, s in d.get("scratch", ())),
            notes=d.get("notes", ""),
        )

    # -- IR attribute encoding (needs xDSL; only the compiler calls these) --------------
    def to_attr(self):  # noqa: ANN201 - returns an xDSL DictionaryAttr
        from scanweaver.rewrites.launch import launch_to_attr

        return launch_to_attr(self)

    @staticmethod
    def from_attr(attr) -> KernelLaunch:  # noqa: ANN001
        from scanweaver.rewrites.launch import launch_from_attr

        return launch_from_attr(attr)


__all__ = ["KernelLaunch", "SCALAR_BYTES", "SHARED_PER_BLOCK_LIMIT", "TIME_BLOCKS_ATTR", "TIME_BLOCKS_MAX_CHANNELS", "cdiv_at_least_1", "loop_trip", "prefer_time_blocks", "eval_grid_entry", "eval_size_expr", "grid_terms"]
