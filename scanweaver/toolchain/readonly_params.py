"""Read-only kernel inputs as `ld.global.nc` (the non-coherent, read-only data path).

NVPTX selects `ld.global.nc` for a global load that is `!invariant.load`, or whose
pointer comes from a kernel parameter that is both `noalias` and `readonly`. MLIR 22's
`convert-gpu-to-nvvm` copies `llvm.readonly` from a memref argument of a `gpu.func` onto
the descriptor's two pointer parameters, but drops `llvm.noalias` ("Cannot copy noalias
with non-bare pointers"). So the promise is made in two steps:

1. `mark_readonly_args` (xDSL, before printing): `llvm.readonly` on every memref argument
   of a kernel that the kernel only reads (`readonly_memref_args`) and that no launch
   binds to the memory of an argument the kernel may write;
2. `add_noalias_to_readonly_params` (text, on the LLVM-dialect kernels between
   `convert-gpu-to-nvvm` and `gpu-module-to-binary`, see `mlir.gpu_to_ptx`):
   `llvm.noalias` next to each `llvm.readonly` pointer parameter of a `gpu.kernel`;
3. `mark_readonly_loads_invariant` (text, same place): `invariant` on the loads whose
   address is such a parameter or a `getelementptr` chain on one (NVPTX's own test of
   the parameter gives up on long chains).

Why `noalias` holds: LLVM's `noalias` only constrains memory that is modified during
the call, and a read-only argument's memory is modified by the kernel only if a written
argument overlaps it. Every runtime path refuses overlapping array arguments
(`CudaFunction.check_arguments`, `check_no_overlap`), host arrays are staged into fresh
device buffers, and scratch buffers are fresh allocations. The descriptor's allocated
and aligned pointers point into the same memory and both get the promise; only reads
go through either, so the promise holds for both. Between launches the read-only cache
is not coherent with earlier writes of the same kernel only; each launch starts clean,
so an array written by one launch and read by the next may take `.nc` in the second.
"""

from __future__ import annotations

import re

from xdsl.dialects import gpu, memref, scf, vector
from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, MemRefType, ModuleOp, UnitAttr
from xdsl.ir import BlockArgument, Operation, SSAValue

from scanweaver.toolchain.shared_reloads import mark_loads_on_chains

READONLY = "llvm.readonly"


def _only_read(value: SSAValue) -> bool:
    """Every use of `value` reads through it (load, vector load) or reads its shape."""
    for use in value.uses:
        op: Operation = use.operation
        if isinstance(op, memref.LoadOp | vector.LoadOp) and use.index == 0:
            continue
        if isinstance(op, memref.DimOp | memref.ExtractStridedMetaDataOp):
            continue
        if isinstance(op, memref.ExtractAlignedPointerAsIndexOp) and _arith_only(op.results[0]):
            continue  # the base's address, tested for alignment (rewrites/gpu_aligned_bases.py)
        return False  # a store, a view, a call, an atomic: not provably read-only
    return True


def _arith_only(value: SSAValue, seen: set | None = None) -> bool:
    """`value` (an address as an integer) only flows through arith ops into `scf.if`
    conditions: never back into a pointer, so no access goes through it."""
    seen = set() if seen is None else seen
    for use in value.uses:
        op = use.operation
        if op in seen:
            continue
        seen.add(op)
        if isinstance(op, scf.IfOp) and use.index == 0:
            continue
        if not op.name.startswith("arith.") or not all(_arith_only(r, seen) for r in op.results):
            return False
    return True


def readonly_memref_args(fn: gpu.FuncOp) -> list[int]:
    """Positions of the memref arguments of `fn` that `fn` never writes."""
    if not fn.body.blocks:
        return []
    args: tuple[BlockArgument, ...] = fn.body.blocks[0].args
    return [a.index for a in args if isinstance(a.type, MemRefType) and _only_read(a)]


# Ops whose result views their first operand's memory.
_VIEWS = (memref.CastOp, memref.SubviewOp, memref.ReinterpretCastOp, memref.CollapseShapeOp,
          memref.ExpandShapeOp, memref.ViewOp, memref.MemorySpaceCastOp)


def _root(value: SSAValue) -> SSAValue:
    """The memref a launch operand views (through casts, subviews, reshapes)."""
    while isinstance(value.owner, _VIEWS):
        value = value.owner.operands[0]
    return value


def _not_aliased_at_launches(module: ModuleOp, name: str, positions: list[int]) -> list[int]:
    """`positions` less those that a launch of kernel `name` binds to memory it also
    passes as an argument the kernel may write; none when no launch of it is seen."""
    launches = [
        op for op in module.walk()
        if isinstance(op, gpu.LaunchFuncOp) and op.kernel.nested_references.data[-1].data == name
    ]
    if not launches:
        return []
    keep = set(positions)
    for launch in launches:
        roots = [_root(v) for v in launch.kernelOperands]
        for i in positions:
            if any(roots[j] is roots[i] for j in range(len(roots)) if j != i and j not in positions):
                keep.discard(i)
    return sorted(keep)


def mark_readonly_args(module: ModuleOp) -> ModuleOp:
    """Set `llvm.readonly` on the read-only memref arguments of every kernel (in place),
    those a launch also binds to an argument the kernel may write excepted.

    Upstream keeps argument attributes in the `arg_attrs` property of `gpu.func`, which
    xDSL 0.74's op does not define: the property is set for printing only (the marked
    module is a copy that goes straight to mlir-opt, unverified)."""
    for op in list(module.walk()):
        if not isinstance(op, gpu.FuncOp) or (op.kernel is None and "gpu.kernel" not in op.attributes):
            continue
        positions = _not_aliased_at_launches(module, op.sym_name.data, readonly_memref_args(op))
        if not positions:
            continue
        old = op.properties.get("arg_attrs")
        dicts = list(old.data) if isinstance(old, ArrayAttr) else [DictionaryAttr({})] * len(op.function_type.inputs)
        for i in positions:
            dicts[i] = DictionaryAttr({**dicts[i].data, READONLY: UnitAttr()})
        op.properties["arg_attrs"] = ArrayAttr(dicts)
    return module


_KERNEL_HEAD = re.compile(r"^(\s*llvm\.func @[\w$.-]+\()(.*)$", re.M)
_READONLY_PTR = re.compile(r"(: !llvm\.ptr(?:<\d+>)? \{)llvm\.readonly\}")


def add_noalias_to_readonly_params(llvm_text: str) -> str:
    """`{llvm.readonly}` pointer parameters of `gpu.kernel` functions in printed
    LLVM-dialect MLIR become `{llvm.noalias, llvm.readonly}` (module doc)."""

    def one(match: re.Match[str]) -> str:
        head, rest = match.groups()
        if "gpu.kernel" not in rest:
            return match.group(0)
        return head + _READONLY_PTR.sub(r"\1llvm.noalias, llvm.readonly}", rest)

    return _KERNEL_HEAD.sub(one, llvm_text)


_PARAM = re.compile(r"(%[\w$.-]+): !llvm\.ptr(?:<\d+>)? \{[^}]*\bllvm\.readonly\b[^}]*\}")


def mark_readonly_loads_invariant(llvm_text: str) -> str:
    """Loads of `gpu.kernel` functions in printed LLVM-dialect MLIR whose address is a
    `{llvm.readonly}` pointer parameter or a chain of `llvm.getelementptr` on one become
    `invariant` (`!invariant.load`): the promise `noalias readonly` makes (module doc),
    spelled on the load, so NVPTX selects `ld.global.nc` for it however long the chain.
    Its own test of the parameters (`getUnderlyingObjects`) gives up after 6 steps, and
    LLVM builds the addresses of a kernel's consecutive rows (the selective scan's B and
    C) one from the previous: the last rows lost `.nc`.

    The mark lives only as long as the load: LLVM's VectorCombine (`scalarizeLoadExtract`)
    splits a vector load whose users are all `extractelement`s in its own block, with no
    write between, into scalar loads without it; the load-store vectorizer joins them
    again, and NVPTX's own tagging misses the rows with the longest chains (the selective
    scan's B and C at N = 16: 2 of 32 16-byte loads plain, N = 24 and 32: 8). So the
    kernels never take a lane out next to its load (`recurrence_vector_io.load_runs`:
    staged lanes each just before its store, other vectors whole out of their branch);
    every read-only load of the benchmark's kernels is then `ld.global.nc`, with the same
    registers (ptxas sm_80, sm_90; tests/test_readonly_invariant_loads.py). `mlir-opt
    -disable-vector-combine` would keep the marks too, but costs the affine time-block
    reduce kernel 32 to 40 registers (occupancy 1.0 to 0.75, ptxas sm_90)."""
    return mark_loads_on_chains(llvm_text, "invariant", lambda head, _body: set(_PARAM.findall(head)))
