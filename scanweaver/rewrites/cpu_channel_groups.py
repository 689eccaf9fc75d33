"""The loop over the full channel groups of a tiled `scan.affine` lowering: an
`scf.for`, or with `parallel` an `scf.parallel` (for `convert-scf-to-openmp`: an
`omp.wsloop` whose iterations run on OpenMP threads; the groups are independent)."""

from __future__ import annotations

from collections.abc import Callable

from xdsl.builder import Builder
from xdsl.dialects import scf
from xdsl.dialects.builtin import IndexType
from xdsl.ir import Block, Region, SSAValue
from xdsl.rewriter import InsertPoint

from scanweaver.rewrites.loop_utils import for_loop

#: A group's body: (builder, first channel, carried values) -> values to carry.
GroupBody = Callable[[Builder, SSAValue, list[SSAValue]], list[SSAValue]]


def channel_groups_loop(
    b: Builder, start: SSAValue, end: SSAValue, step: SSAValue, group: GroupBody, parallel: bool
) -> None:
    """Run `group(builder, c0, [])` for c0 = start, start + step, ... < end (no carried values)."""
    if parallel:
        blk = Block(arg_types=[IndexType()])
        pb = Builder(InsertPoint.at_end(blk))
        group(pb, blk.args[0], [])
        pb.insert(scf.ReduceOp())
        b.insert(scf.ParallelOp([start], [end], [step], Region(blk)))
    else:
        for_loop(b, start, end, step, [], group)
