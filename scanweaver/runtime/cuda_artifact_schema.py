"""Checks of a loaded `OUT.launch.json` before the runtime uses any of it.

The launch description comes from a file that may have been edited, damaged or built
by someone else, and the runtime turns its numbers into kernel parameters, grids and
device allocations.  So every field is checked here, once, at `scanweaver.load`: its
type, its range and its references (argument names, dimensions, kernel indices), and
any problem is one `ScanWeaverValueError` naming the file and the field, e.g.
`kernels[0].block[0]`.  After this, `KernelLaunch.from_json` and the launch code can
trust the document.  Standard library only, like the rest of the loader.
"""

from __future__ import annotations

import re
from typing import Any

from scanweaver.errors import ScanWeaverValueError
from scanweaver.runtime.contract_check import validate_contract
from scanweaver.runtime.cuda import MEMREF_ELEMENTS, SCALAR_CTYPES
from scanweaver.runtime.cuda_launch import SHARED_PER_BLOCK_LIMIT, KernelLaunch, eval_grid_entry

_IDENTIFIER = re.compile(r"[A-Za-z_$.][\w$.]*")
_CHIP = re.compile(r"sm_[0-9]+[af]?")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_MEMREF_KINDS = ("in", "out", "inout")
_FUNCTION_ARG_KINDS = (*_MEMREF_KINDS, "scalar", "unused")

# CUDA's limits on a launch (every chip since sm_30): gridDim and blockDim per axis,
# and threads per block
GRID_LIMITS = (2**31 - 1, 65535, 65535)
BLOCK_LIMITS = (1024, 1024, 64)
THREADS_PER_BLOCK = 1024
# The size formulas are parsed recursively: a bound on their length bounds the depth
_MAX_FORMULA = 1000


class _Field:
    """One value of the document and the path that names it in error messages."""

    def __init__(self, value: Any, path: str, where: str):
        self.value, self.path, self.where = value, path, where

    def fail(self, problem: str) -> None:
        raise ScanWeaverValueError(f"{self.where}: {self.path or 'the document'} {problem}")

    def at(self, key: Any) -> _Field:
        if isinstance(key, int):
            return _Field(self.value[key], f"{self.path}[{key}]", self.where)
        if key not in self.value:
            self.fail(f"has no '{key}'")
        return _Field(self.value[key], f"{self.path}.{key}" if self.path else key, self.where)

    def items(self) -> list[_Field]:
        return [self.at(i) for i in range(len(self.value))]

    def dict(self) -> _Field:
        if not isinstance(self.value, dict):
            self.fail(f"must be an object, not {_json_type(self.value)}")
        return self

    def list(self, length: int | None = None) -> _Field:
        if not isinstance(self.value, list):
            self.fail(f"must be a list, not {_json_type(self.value)}")
        if length is not None and len(self.value) != length:
            self.fail(f"must have {length} entries, not {len(self.value)}")
        return self

    def int(self, low: int = 0, high: int | None = None) -> int:
        # bool is an int in Python, but `true` is not a size in the document
        if not isinstance(self.value, int) or isinstance(self.value, bool):
            self.fail(f"must be an integer, not {_json_type(self.value)}")
        if self.value < low or (high is not None and self.value > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            self.fail(f"is {self.value}; it must be {bound}")
        return self.value

    def str(self, pattern: re.Pattern[str] | None = None, choices: tuple[str, ...] = ()) -> str:
        if not isinstance(self.value, str):
            self.fail(f"must be a string, not {_json_type(self.value)}")
        if choices and self.value not in choices:
            self.fail(f"is {self.value!r}; expected one of {', '.join(choices)}")
        if pattern is not None and not pattern.fullmatch(self.value):
            self.fail(f"{self.value!r} is not a valid name")
        return self.value


def _json_type(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
             list: "a list", dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def check_document(doc: Any, where: str) -> None:
    """Raise `ScanWeaverValueError` naming the first field of `doc` (a parsed
    launch.json, read from `where`) that the runtime could not use safely."""
    root = _Field(doc, "", where).dict()
    image = root.at("image").str()
    if image in ("", ".", "..") or any(c in image for c in "/\\\0"):
        root.at("image").fail(f"{image!r} must be a file name beside the launch description (no directories)")
    root.at("image_kind").str(choices=("ptx", "cubin"))
    root.at("image_sha256").str(_SHA256)
    root.at("chip").str(_CHIP)
    kernels = root.at("kernels").list()
    kernel_fields = kernels.items()
    for k in kernel_fields:
        _check_kernel(k.dict())
    for f in root.at("functions").dict().value:
        _check_function(root.at("functions").at(f), f, kernel_fields)


def _check_kernel(k: _Field) -> None:
    k.at("kernel").str(_IDENTIFIER)
    for key in ("module", "function", "notes"):
        if key in k.value:
            k.at(key).str()
    if k.value.get("abi", "memref-descriptor") != "memref-descriptor":
        k.at("abi").fail(f"is {k.value['abi']!r}; this runtime packs 'memref-descriptor' arguments only")
    ranks = _check_kernel_args(k.at("args").list())
    k.at("host_args").list(len(ranks))
    for h in k.at("host_args").items():
        h.int(low=-(2**31))
    dummy = {name: (1,) * rank for name, rank in ranks.items() if rank is not None}
    for g, limit in zip(k.at("grid").list(3).items(), GRID_LIMITS):
        _check_size_formula(g, dummy, limit)
    block = [b.int(1, limit) for b, limit in zip(k.at("block").list(3).items(), BLOCK_LIMITS)]
    if block[0] * block[1] * block[2] > THREADS_PER_BLOCK:
        k.at("block").fail(f"asks for {block[0] * block[1] * block[2]} threads; a block has at most {THREADS_PER_BLOCK}")
    shared = k.at("static_shared_bytes").int(0, SHARED_PER_BLOCK_LIMIT)
    if "dynamic_shared_bytes" in k.value:  # static + dynamic: what one block asks for
        k.at("dynamic_shared_bytes").int(0, SHARED_PER_BLOCK_LIMIT - shared)
    for key in ("equal_dims", "covers_dims"):
        for pair in (k.at(key).list().items() if key in k.value else []):
            _check_dim_pair(pair.list(4), ranks)
    for s in (k.at("scratch").list().items() if "scratch" in k.value else []):
        _check_scratch(s.list(2), ranks, dummy)


def _check_kernel_args(args: _Field) -> dict[str, int | None]:
    """Each [name, kind, dtype, shape]; name -> rank (None for a scalar)."""
    ranks: dict[str, int | None] = {}
    for a in args.items():
        name = a.list(4).at(0).str(_IDENTIFIER)
        if name in ranks:
            a.fail(f"repeats the argument name {name!r}")
        kind = a.at(1).str(choices=(*_MEMREF_KINDS, "scalar"))
        types = SCALAR_CTYPES if kind == "scalar" else MEMREF_ELEMENTS
        a.at(2).str(choices=tuple(types))
        shape = _check_shape(a.at(3).list(0 if kind == "scalar" else None))
        ranks[name] = None if kind == "scalar" else len(shape.value)
    return ranks


def _check_shape(shape: _Field) -> _Field:
    """Sizes: ints from 0, or "?" for a dynamic size."""
    for d in shape.items():
        if d.value != "?":
            d.int()
    return shape


def _check_size_formula(entry: _Field, dummy_shapes: dict[str, tuple[int, ...]], limit: int) -> None:
    """An int in [1, limit], or a formula over the kernel's own argument sizes (tried
    on sizes of 1, which also finds references to absent arguments or dimensions)."""
    if isinstance(entry.value, int) and not isinstance(entry.value, bool):
        entry.int(1, limit)
        return
    if not isinstance(entry.value, str):
        entry.fail(f"must be a positive integer or a size formula, not {_json_type(entry.value)}")
    formula = entry.value
    if len(formula) > _MAX_FORMULA:
        entry.fail(f"is a formula of {len(formula)} characters; at most {_MAX_FORMULA}")
    try:
        value = eval_grid_entry(formula, dummy_shapes)
    except ScanWeaverValueError as e:
        entry.fail(f"is not a launch size formula: {e}")
    # A product of sizes is 0 only for small arrays (empty, or below a `span` loop's
    # start): a constant 0 factor would skip the launch for every input and leave its
    # outputs unwritten.  Sizes of 2^20 tell the two apart.
    large = {name: (2**20,) * len(shape) for name, shape in dummy_shapes.items()}
    if not formula.startswith("expr:") and value < 1 and eval_grid_entry(formula, large) < 1:
        entry.fail(f"{formula!r} is 0 for arrays of any size: no block would ever run")


def _check_dim_pair(pair: _Field, ranks: dict[str, int | None]) -> None:
    for name_at, dim_at in ((0, 1), (2, 3)):
        name = pair.at(name_at).str()
        if ranks.get(name) is None:
            pair.at(name_at).fail(f"{name!r} is not an array argument of the kernel")
        if ranks[name] == 0:
            pair.at(dim_at).fail("names a dimension of a rank-0 array")
        pair.at(dim_at).int(0, ranks[name] - 1)


def _check_scratch(entry: _Field, ranks: dict[str, int | None], dummy: dict[str, tuple[int, ...]]) -> None:
    name = entry.at(0).str()
    if ranks.get(name) is None:
        entry.at(0).fail(f"{name!r} is not an array argument of the kernel")
    for size in entry.at(1).list(ranks[name]).items():
        _check_size_formula(size, dummy, 2**62)


def _check_function(f: _Field, name: str, kernels: list[_Field]) -> None:
    f.dict()
    if not _IDENTIFIER.fullmatch(name):
        f.fail("is not a function name")
    count = f.at("arg_count").int(0, 100_000)
    for a in f.at("args").list(count).items():
        a.dict()
        if a.at("kind").str(choices=_FUNCTION_ARG_KINDS) in _MEMREF_KINDS:
            _check_shape(a.at("shape").list())
    results = f.at("results").list().value if "results" in f.value else []
    if len(results) > count or not all(isinstance(r, str) for r in results):
        f.at("results").fail("must be type names, one per trailing result argument")
    kinds: dict[int, str] = {}
    scratch: set[int] = set()
    for index in f.at("kernels").list().items():
        k = kernels[index.int(0, len(kernels) - 1)]
        _check_host_positions(k, count, kinds, scratch)
    if "contract" in f.value:
        args = f.value["args"]
        ranks = {i: len(a.get("shape", [])) for i, a in enumerate(args) if a["kind"] in _MEMREF_KINDS}
        scalars = {i for i, a in enumerate(args) if a["kind"] == "scalar"}
        problem = validate_contract(f.value["contract"], count, ranks, scalars)
        if problem is not None:
            f.at("contract").fail(f"is not a shape contract: {problem}")


def _check_host_positions(k: _Field, count: int, kinds: dict[int, str], scratch: set[int]) -> None:
    """Each kernel argument is a function argument (the same kind in every kernel) or
    a scratch buffer that this kernel or an earlier one gives a shape."""
    shaped = {s[0] for s in k.value.get("scratch", [])}
    for (name, kind, _, _), h in zip(k.value["args"], k.at("host_args").items()):
        pos = h.value
        if pos >= 0:
            h.int(0, count - 1)
            role = "scalar" if kind == "scalar" else "array"
            if kinds.setdefault(pos, role) != role:
                h.fail(f"passes function argument #{pos} as a {role} here and as a {kinds[pos]} elsewhere")
        elif pos == -1 or kind == "scalar":
            h.fail(f"gives argument {name!r} no value (neither a function argument nor a scratch buffer)")
        elif pos not in scratch:
            if name not in shaped:
                h.fail(f"uses scratch buffer {-2 - pos} before any kernel gives its shape")
            scratch.add(pos)


# one `.entry name(...)` of PTX text; in a parameter, its type (`.u64`, `.f32`, `.b8`)
# and an array length (`.param .align 2 .b8 k_param_3[2]`)
_PTX_ENTRY = re.compile(r"\.entry\s+([\w$.]+)\s*\(([^)]*)\)")
_PTX_TYPE = re.compile(r"\.[a-z]+(\d+)")
_PTX_LENGTH = re.compile(r"\[(\d+)\]\s*$")


def ptx_signatures(ptx: str) -> dict[str, list[int]]:
    """Kernel name -> bytes of each parameter, from the entries of PTX text."""
    return {m.group(1): [_param_bytes(p) for p in m.group(2).split(",") if p.strip()] for m in _PTX_ENTRY.finditer(ptx)}


def _param_bytes(declaration: str) -> int:
    kind = _PTX_TYPE.search(declaration.replace(".align", ""))
    length = _PTX_LENGTH.search(declaration)
    return (int(kind.group(1)) // 8 if kind else 0) * (int(length.group(1)) if length else 1)


def check_ptx_signatures(doc: dict[str, Any], ptx: str, where: str) -> None:
    """Each kernel of a (checked) document is an entry of the PTX taking exactly the
    parameters its description packs: a description edited to another rank or number
    of arguments would make the kernel read its descriptors from the wrong places."""
    entries = ptx_signatures(ptx)
    for i, k in enumerate(doc["kernels"]):
        packed = KernelLaunch.from_json(k).param_sizes()
        have = entries.get(k["kernel"])
        if have is None:
            raise ScanWeaverValueError(f"{where}: kernels[{i}] names '{k['kernel']}', which the PTX does not define")
        if have != packed:
            raise ScanWeaverValueError(
                f"{where}: kernels[{i}] '{k['kernel']}' packs {len(packed)} parameters of {packed} bytes, "
                f"but the PTX entry takes {len(have)} of {have}"
            )


__all__ = ["BLOCK_LIMITS", "GRID_LIMITS", "THREADS_PER_BLOCK", "check_document", "check_ptx_signatures",
           "ptx_signatures"]
