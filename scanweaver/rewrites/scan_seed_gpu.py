"""The associative raise's host copies around a `scan.scan`, recognised for the GPU.

`raise_assoc.py` raises `h = op(h, x[t])` (a running max / min / and / or / xor) to

    X = alloc(n + 1); P = alloc(n + 1)
    X[0] = h0
    for j < n: X[j + 1] = x[j]                  (producer: a copy)
    scan.scan ins(X) outs(P) axis 0 { op }
    for j < n: y[j] = P[j + 1]                  (consumer: a copy)
    r = P[n]; dealloc X, P                      (after gpu-results-to-args: result0[] = r)

The CUDA runtime runs no host loops and allocates no temporaries.  By associativity
P[j + 1] = h0 (+) inclusive_scan(x)[j] and P[n] is the last of them (h0 when n == 0),
so the whole group is one scan of x into y, *seeded* with h0 (combined on the left of
every prefix, the loop's order), that also writes its last value to result0.
`match_seeded` recognises exactly that group and nothing wider (anything else keeps
the refusal: the log-sum-exp pair's producer computes, it does not copy); `scan_gpu.py`
(one block) or `scan_time_blocks.py` (the seed in every chunk's carry) emits the seeded
kernels and `erase_host_copies` removes the group's host ops.  The
seeded form exists only inside the GPU lowering (no new op or operand), so the
interpreter, scan-to-loops and the CPU lowering are untouched.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects import arith, func, memref, scf
from xdsl.dialects.builtin import Float32Type, Float64Type, IndexType, IntegerType, MemRefType
from xdsl.ir import Block, BlockArgument, Operation, SSAValue
from xdsl.rewriter import Rewriter

from scanweaver.dialects import scan
from scanweaver.rewrites.gpu_kernel import const_int


@dataclass
class SeededScan:
    """`dst = seed (+) inclusive_scan(src)` and, when `final` is set, `final[] = last`."""

    src: SSAValue  # 1-D memref function argument, read
    dst: SSAValue  # 1-D memref function argument, written
    seed: SSAValue  # a scalar function argument or an arith.constant
    final: SSAValue | None  # rank-0 memref function argument (result0), or None
    host_ops: list[Operation]  # the copies, allocs, stores and loads to erase


def _strip(v: SSAValue) -> SSAValue:
    """`v` with identity index arithmetic removed: x + 0, 0 + x, x * 1, 1 * x, x - 0,
    ceildiv(x, 1) and max(x, 0) (this last one only where x is a `memref.dim`, >= 0)."""
    while True:
        o = v.owner
        if isinstance(o, arith.AddiOp | arith.MuliOp):
            unit = 0 if isinstance(o, arith.AddiOp) else 1
            if const_int(o.lhs) == unit:
                v = o.rhs
                continue
            if const_int(o.rhs) == unit:
                v = o.lhs
                continue
        if isinstance(o, arith.SubiOp | arith.CeilDivUIOp) and const_int(o.rhs) == (
            0 if isinstance(o, arith.SubiOp) else 1
        ):
            v = o.lhs
            continue
        if isinstance(o, arith.MaxSIOp) and const_int(o.rhs) == 0 and _nonnegative(_strip(o.lhs)):
            v = o.lhs
            continue
        return v


def _nonnegative(v: SSAValue) -> bool:
    c = const_int(v)
    return isinstance(v.owner, memref.DimOp) or (c is not None and c >= 0)


def _is_plus_one(v: SSAValue, x: SSAValue) -> bool:
    o = v.owner
    return isinstance(o, arith.AddiOp) and (
        (_strip(o.lhs) is x and const_int(o.rhs) == 1) or (_strip(o.rhs) is x and const_int(o.lhs) == 1)
    )


def _dim0_of(v: SSAValue) -> SSAValue | None:
    o = _strip(v).owner
    if isinstance(o, memref.DimOp) and const_int(o.index) == 0:
        return o.source
    return None


def _func_arg(v: SSAValue, fn: func.FuncOp, rank: int | None) -> bool:
    if not (isinstance(v, BlockArgument) and v.owner is fn.body.block):
        return False
    return rank is None or (isinstance(v.type, MemRefType) and v.type.get_num_dims() == rank)


def _is_kernel_scalar(t) -> bool:
    """A type the CUDA runtime passes as a scalar kernel parameter (not f16/bf16/i1)."""
    if isinstance(t, IntegerType):
        return t.width.data in (8, 16, 32, 64)
    return isinstance(t, Float32Type | Float64Type | IndexType)


def _copy_loop(loop: Operation | None, n: SSAValue) -> tuple[memref.LoadOp, memref.StoreOp] | None:
    """`for j = 0 to n step 1 { v = load A[..]; store v, B[..] }` plus pure index
    arithmetic: its (load, store), or None."""
    if not isinstance(loop, scf.ForOp) or loop.iter_args or loop.ub is not n:
        return None
    if const_int(loop.lb) != 0 or const_int(loop.step) != 1:
        return None
    loads = [o for o in loop.body.block.ops if isinstance(o, memref.LoadOp)]
    stores = [o for o in loop.body.block.ops if isinstance(o, memref.StoreOp)]
    pure = (arith.ConstantOp, arith.AddiOp, arith.MuliOp, scf.YieldOp)
    if len(loads) != 1 or len(stores) != 1 or stores[0].value is not loads[0].res:
        return None
    if any(not isinstance(o, pure) for o in loop.body.block.ops if o not in (loads[0], stores[0])):
        return None
    if len(loads[0].indices) != 1 or len(stores[0].indices) != 1:
        return None
    return loads[0], stores[0]


def match_seeded(op: scan.ScanOp) -> SeededScan | None:
    """The seeded scan the group around `op` computes (module doc), or None."""
    if len(op.inputs) != 1 or len(op.outputs) != 1 or op.axis_value != 0 or op.is_reverse:
        return None
    X, P = op.inputs[0], op.outputs[0]
    xa, pa = X.owner, P.owner
    if X is P or not isinstance(xa, memref.AllocOp) or not isinstance(pa, memref.AllocOp):
        return None
    if X.type.get_num_dims() != 1 or len(xa.dynamic_sizes) != 1 or len(pa.dynamic_sizes) != 1:  # type: ignore[attr-defined]
        return None
    block = op.parent_block()
    fn = op.parent_op()
    if not isinstance(fn, func.FuncOp) or not isinstance(block, Block) or xa.parent_block() is not block:
        return None
    m = xa.dynamic_sizes[0]
    if pa.dynamic_sizes[0] is not m or not isinstance(m.owner, arith.AddiOp):
        return None
    n = m.owner.lhs if const_int(m.owner.rhs) == 1 else m.owner.rhs if const_int(m.owner.lhs) == 1 else None
    if n is None:
        return None
    producer, consumer = op.prev_op, op.next_op
    init = producer.prev_op if producer is not None else None
    prod, cons = _copy_loop(producer, n), _copy_loop(consumer, n)
    if prod is None or cons is None or not isinstance(init, memref.StoreOp):
        return None
    (p_load, p_store), (c_load, c_store) = prod, cons
    iv_p, iv_c = producer.body.block.args[0], consumer.body.block.args[0]  # type: ignore[union-attr]
    # X[0] = h0; X[j + 1] = x[j]; y[j] = P[j + 1]
    if init.memref is not X or len(init.indices) != 1 or const_int(init.indices[0]) != 0:
        return None
    seed = init.value
    if not (_func_arg(seed, fn, None) and _is_kernel_scalar(seed.type) or isinstance(seed.owner, arith.ConstantOp)):
        return None
    if p_store.memref is not X or not _is_plus_one(p_store.indices[0], iv_p) or _strip(p_load.indices[0]) is not iv_p:
        return None
    if c_load.memref is not P or not _is_plus_one(c_load.indices[0], iv_c) or _strip(c_store.indices[0]) is not iv_c:
        return None
    src, dst = p_load.memref, c_store.memref
    if not (_func_arg(src, fn, 1) and _func_arg(dst, fn, 1)):  # src is dst: in place, fine
        return None
    # n is the length of x or of y (the launch checks that both are equal), or a
    # constant equal to both static lengths
    length = const_int(_strip(n))
    if length is not None:
        if any(v.type.get_shape()[0] != length for v in (src, dst)):  # type: ignore[attr-defined]
            return None
    elif _dim0_of(n) not in (src, dst):
        return None
    # every use of the temporaries is one of the group's
    last = [u.operation for u in P.uses if isinstance(u.operation, memref.LoadOp) and u.operation is not c_load]
    deallocs = [u.operation for v in (X, P) for u in v.uses if isinstance(u.operation, memref.DeallocOp)]
    if len(last) != 1 or last[0].parent_block() is not block or list(last[0].indices) != [n]:
        return None
    final_load = last[0]
    expected = {init, p_store, op, c_load, final_load, *deallocs}
    if {u.operation for v in (X, P) for u in v.uses} != expected:
        return None
    # the last value: unused, or stored once to a rank-0 argument used by nothing else
    final: SSAValue | None = None
    host_ops: list[Operation] = [init, producer, consumer]  # type: ignore[list-item]
    r_uses = list(final_load.res.uses)
    if r_uses:
        st = r_uses[0].operation
        if len(r_uses) != 1 or not isinstance(st, memref.StoreOp) or st.value is not final_load.res:
            return None
        if st.indices or not _func_arg(st.memref, fn, 0) or len(list(st.memref.uses)) != 1:
            return None
        final = st.memref
        host_ops.append(st)
    host_ops.append(final_load)
    return SeededScan(src, dst, seed, final, [*host_ops, *deallocs, xa, pa])


def erase_host_copies(seeded: SeededScan) -> None:
    """Remove the group's host ops once the seeded kernel's launch replaces the scan."""
    for o in seeded.host_ops:
        Rewriter.erase_op(o)


__all__ = ["SeededScan", "erase_host_copies", "match_seeded"]
