"""Builder of the affine-scan workload: one `scan.affine` in a `func.func`.

    affine_scan(shape, axis, in_el, state_el, init=, final=, reverse=, name=)
        func.func @name(%a, %b, [%h0], %h, [%hT]) { scan.affine ... }

A dimension given as "?" (or None) is dynamic: one compiled kernel then serves every
size.  `init` adds the initial state h0 (h without `axis`), `final` the last state
hT; the CPU and GPU drivers, the benchmarks and the tests all build from here.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.builder import ImplicitBuilder
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Region

from scanweaver.dialects import scan
from scanweaver.workloads.types import Dim, memref_of

def affine_scan(
    shape: Sequence[Dim],
    axis: int,
    in_el: str,
    state_el: str,
    *,
    init: bool = False,
    final: bool = False,
    reverse: bool = False,
    name: str = "f",
) -> ModuleOp:
    """`func.func @name(a, b, [h0], h, [hT])` holding one scan.affine along `axis`."""
    channels = [d for i, d in enumerate(shape) if i != axis]
    t_in, t_h, t_c = memref_of(shape, in_el), memref_of(shape, state_el), memref_of(channels, state_el)
    args = [("a", t_in), ("b", t_in)] + ([("h0", t_c)] if init else []) + [("h", t_h)]
    args += [("hT", t_c)] if final else []
    block = Block(arg_types=[t for _, t in args])
    for value, (hint, _) in zip(block.args, args):
        value.name_hint = hint
    v = dict(zip((hint for hint, _ in args), block.args))
    with ImplicitBuilder(block):
        scan.AffineOp(
            v["a"], v["b"], v["h"], axis, init=v.get("h0"), final=v.get("hT"), reverse=reverse
        )
        func.ReturnOp()
    fn = func.FuncOp(name, ([t for _, t in args], []), Region(block))
    return ModuleOp([fn])


__all__ = ["affine_scan", "memref_of"]  # memref_of re-exported for scans.py
