"""Shape contracts as plain data, and the check that runs before each call.

`shape_contract.py` derives, from the input IR (needs xDSL), which argument shapes a
function's memory accesses rely on.  It records them as the plain data below, which
this module evaluates with the standard library only, so the same check guards an
in-process build and a deployed artifact (`OUT.launch.json` carries the data):

    {"name": f, "arg_names": [...],
     "same_shape": [[i, j, dims of i, dims of j], ...],
     "accesses": [{"op": text, "arg": i, "local_shape": [int, ...], "indices": [index, ...],
                   "extents": [int, ...], "loops": [[lb, ub], ...], "write": bool,
                   "index_texts": [text, ...], "when": [[pred, lhs, rhs], ...]}, ...],
     "unchecked": [op text, ...]}

An access's "arg" is null for a local buffer of static shape "local_shape" (else []).
"when": the size guards around it (cmpi predicate slt 2, sle 3, sgt 4, sge 5, and two
trees): sizes that make one false skip the access.
An index (and a loop bound) is a tree: ["const", v], ["arg", i] (a scalar argument),
["dim", i, d] (size d of argument i), ["iv", lb, ub] (a loop variable: lb..ub-1),
["wrap", bits, x] (x as a `bits`-wide integer holds it: any value of that width where
x's interval leaves it), or [op, x, y] with op one of + - * min max, / (signed division,
rounding toward zero), // (rounding down), % (signed remainder), or the unsigned umin
umax u/ u% (no bound where an operand may be negative: a huge unsigned value).  It
evaluates to an interval [lo, hi].
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

from scanweaver.errors import ScanWeaverTypeError, ScanWeaverValueError

Interval = tuple[int, int]
_UNSIGNED_OPS = {"umin": "min", "umax": "max", "u/": "/", "u%": "%"}
_OPS = ("+", "-", "*", "min", "max", "/", "//", "%", *_UNSIGNED_OPS)
#: Every value a 64-bit index can hold: the bound of what is not followed.
_UNBOUNDED = (-(1 << 63), (1 << 63) - 1)
_MAX_DEPTH = 200  # trees from a file are evaluated recursively: bound their depth


def arg_shape(x: Any) -> tuple[int, ...]:
    """The shape of a host array or of a device array (`__cuda_array_interface__`)."""
    shape = getattr(x, "shape", None)
    if shape is None and hasattr(x, "__cuda_array_interface__"):
        shape = x.__cuda_array_interface__["shape"]
    return tuple(int(s) for s in shape) if shape is not None else ()


def interval(tree: Sequence[Any], values: Sequence[Any]) -> Interval:
    """The interval of an index tree for these argument values."""
    kind = tree[0]
    if kind == "const":
        return tree[1], tree[1]
    if kind == "arg":
        v = values[tree[1]]
        if not isinstance(v, int | float) and not hasattr(v, "__index__"):
            raise ScanWeaverTypeError(f"argument #{tree[1]} must be an integer, got {type(v).__name__}")
        return int(v), int(v)
    if kind == "dim":
        size = _size(values, tree[1], tree[2])
        return size, size
    if kind == "iv":
        return interval(tree[1], values)[0], interval(tree[2], values)[1] - 1
    if kind == "wrap":
        lo, hi = interval(tree[2], values)
        low, high = -(1 << (tree[1] - 1)), (1 << (tree[1] - 1)) - 1
        return (lo, hi) if low <= lo and hi <= high else (low, high)
    a, b = interval(tree[1], values), interval(tree[2], values)
    if kind in _UNSIGNED_OPS:
        if min(a[0], b[0]) < 0:
            return _UNBOUNDED  # a negative operand is a huge unsigned one
        kind = _UNSIGNED_OPS[kind]
    return _combine(kind, a, b)


def _size(values: Sequence[Any], i: int, d: int) -> int:
    shape = arg_shape(values[i])
    if d >= len(shape):
        raise ScanWeaverValueError(f"argument #{i} has shape {shape}; the function reads its dimension {d}")
    return shape[d]


def _combine(op: str, a: Interval, b: Interval) -> Interval:
    if op == "+":
        return a[0] + b[0], a[1] + b[1]
    if op == "-":
        return a[0] - b[1], a[1] - b[0]
    if op == "*":
        p = [a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1]]
        return min(p), max(p)
    if op == "min":
        return min(a[0], b[0]), min(a[1], b[1])
    if op == "max":
        return max(a[0], b[0]), max(a[1], b[1])
    if b[0] <= 0:  # division or remainder by a value that may be <= 0: no bound
        return _UNBOUNDED
    if op in ("/", "//"):  # arith.divsi rounds toward zero, floordivsi down
        div = _truncating_div if op == "/" else operator.floordiv
        q = [div(a[0], b[0]), div(a[0], b[1]), div(a[1], b[0]), div(a[1], b[1])]
        return min(q), max(q)
    return (0, b[1] - 1) if a[0] >= 0 else (-(b[1] - 1), b[1] - 1)


def _never(pred: int, a: Interval, b: Interval) -> bool:
    """Whether `a <pred> b` (cmpi slt, sle, sgt, sge: 2..5) is false for every pair of values."""
    if pred == 2:
        return a[0] >= b[1]
    if pred == 3:
        return a[0] > b[1]
    if pred == 4:
        return a[1] <= b[0]
    return a[1] < b[0]


def _truncating_div(n: int, d: int) -> int:
    q = abs(n) // abs(d)
    return q if (n < 0) == (d < 0) else -q


def check_contract(contract: dict[str, Any], values: Sequence[Any]) -> None:
    """Raise ScanWeaverValueError when these arguments could be accessed out of bounds."""
    name, names = contract["name"], contract["arg_names"]
    arg = lambda i: f"argument '{names[i]}' (#{i})"  # noqa: E731
    for i, j, di, dj in contract["same_shape"]:
        si, sj = arg_shape(values[i]), arg_shape(values[j])
        if [_size(values, i, d) for d in di] != [_size(values, j, d) for d in dj]:
            raise ScanWeaverValueError(
                f"@{name}: {arg(i)} has shape {si} and {arg(j)} has shape {sj}: "
                f"dimensions {di} of the first must equal dimensions {dj} of the second"
            )
    for acc in contract["accesses"]:
        if any(interval(ub, values)[1] <= interval(lb, values)[0] for lb, ub in acc["loops"]) or any(
            _never(pred, interval(x, values), interval(y, values)) for pred, x, y in acc.get("when", [])
        ):
            continue  # never executed with these sizes
        local = acc["arg"] is None
        sizes = tuple(acc["local_shape"]) if local else arg_shape(values[acc["arg"]])
        for d, (index, extent) in enumerate(zip(acc["indices"], acc["extents"])):
            lo, hi = interval(index, values)
            hi += extent - 1
            if lo < 0 or hi >= (sizes[d] if local else _size(values, acc["arg"], d)):
                what = "a local buffer" if local else arg(acc["arg"])
                raise ScanWeaverValueError(
                    f"@{name}: {what} has shape {sizes}, but `{acc['op']}` "
                    f"{'writes' if acc['write'] else 'reads'} dimension {d} at indices {lo}..{hi} "
                    f"(index {acc['index_texts'][d]}); the call would touch memory outside the array"
                )


def validate_contract(contract: Any, arg_count: int, ranks: dict[int, int], scalars: set[int]) -> str | None:
    """None when `contract` (from a file) is well formed for a function of `arg_count`
    arguments, else what is wrong.  `ranks`: the rank of each array argument the
    kernels take; any other non-scalar argument may be an array of rank up to 64 (its
    dimensions are checked against the array passed, at the call)."""
    ranks = {i: ranks.get(i, 64) for i in range(arg_count) if i not in scalars}
    try:
        _validate(contract, arg_count, ranks)
    except (TypeError, ValueError, KeyError, IndexError) as e:
        return str(e) or type(e).__name__
    return None


def _validate(c: Any, n: int, ranks: dict[int, int]) -> None:
    if not isinstance(c, dict) or not isinstance(c.get("name"), str):
        raise ValueError("needs a function name")
    # results returned through trailing arguments (`cuda_results`) have no names here
    if not _strings(c.get("arg_names"), None) or len(c["arg_names"]) > n:
        raise ValueError("needs one name per argument")
    for i, j, di, dj in c["same_shape"]:
        if i not in ranks or j not in ranks or len(di) != len(dj) or not all(
            _int(d, 0, ranks[a] - 1) for a, ds in ((i, di), (j, dj)) for d in ds
        ):
            raise ValueError(f"same_shape entry {[i, j, di, dj]} names no dimensions of array arguments")
    for acc in c["accesses"]:
        a, local = acc["arg"], acc.get("local_shape", [])
        rank = len(acc["indices"])
        if a is None:  # a local buffer: its static shape, one size per index
            if len(local) != rank or not all(_int(s, 0, 1 << 62) for s in local):
                raise ValueError("a local buffer's access does not match its shape")
        elif a not in ranks or rank > ranks[a] or len(acc["extents"]) != rank or local:
            raise ValueError(f"access of argument {a} does not match its rank")
        if len(acc["extents"]) != rank:
            raise ValueError(f"access {acc['op']!r} is malformed")
        if not (isinstance(acc["op"], str) and isinstance(acc["write"], bool) and _strings(acc["index_texts"], rank)
                and all(_int(e, 1, 1 << 20) for e in acc["extents"])):
            raise ValueError(f"access {acc['op']!r} is malformed")
        when = acc.get("when", [])
        if not isinstance(when, list) or not all(isinstance(w, list) and len(w) == 3 and _int(w[0], 2, 5) for w in when):
            raise ValueError(f"access {acc['op']!r} has a malformed size guard")
        guards = [t for w in when for t in w[1:]]
        for tree in [*acc["indices"], *(t for loop in acc["loops"] for t in _pair(loop)), *guards]:
            _tree(tree, n, ranks, 0)
    if not _strings(c.get("unchecked", []), None):
        raise ValueError("unchecked must be a list of op texts")


def _tree(t: Any, n: int, ranks: dict[int, int], depth: int) -> None:
    if depth > _MAX_DEPTH or not isinstance(t, list) or not t:
        raise ValueError("an index tree is malformed or too deep")
    kind = t[0]
    ok = (
        (kind == "const" and len(t) == 2 and _int(t[1], -(1 << 62), 1 << 62))
        or (kind == "arg" and len(t) == 2 and _int(t[1], 0, n - 1) and t[1] not in ranks)
        or (kind == "dim" and len(t) == 3 and t[1] in ranks and _int(t[2], 0, ranks.get(t[1], 0) - 1))
        or ((kind == "iv" or kind in _OPS) and len(t) == 3)
        or (kind == "wrap" and len(t) == 3 and _int(t[1], 1, 64))
    )
    if not ok:
        raise ValueError(f"index tree node {str(t)[:60]} is malformed")
    if kind == "wrap":
        _tree(t[2], n, ranks, depth + 1)
    elif kind == "iv" or kind in _OPS:
        _tree(t[1], n, ranks, depth + 1)
        _tree(t[2], n, ranks, depth + 1)


def _int(v: Any, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _strings(v: Any, n: int | None) -> bool:
    return isinstance(v, list) and all(isinstance(s, str) for s in v) and (n is None or len(v) == n)


def _pair(loop: Any) -> list[Any]:
    if not isinstance(loop, list) or len(loop) != 2:
        raise ValueError("a loop is [lower bound, upper bound]")
    return loop


__all__ = ["arg_shape", "check_contract", "interval", "validate_contract"]
