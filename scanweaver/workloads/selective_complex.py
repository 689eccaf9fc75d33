"""Builder of Mamba's selective scan with complex A: one complex `scan.recurrence` per
(batch, channel).

    selective_scan_complex_recurrence(spec)
        func.func @selective_scan_complex(u, delta, A, B, C, [Dskip], [z], [bias], [h0],
                                          out, [last], d_begin, d_end)

The layout and the loops are those of the real kernel (`selective.py`): every size but
N is dynamic, `d_begin`/`d_end` pick the channels, B and C come time before the state
index.  u, delta, Dskip, z, bias and out are real in `spec.real`; A, B, C, h0, last and
the state are `complex<spec.real>`.  A real times a complex is written on the parts
(complex.re/im, arith.mulf, complex.create), as is the output 2 Re(sum_n h_n C_n).
The kernel's argument list is this function's signature (`kernel_arguments`).

    selective_scan_complex_gpu(spec, sizes=DYNAMIC)
        func.func @selective_scan_complex(u, delta, A, B, C, [Dskip], [z], [bias], [h0],
                                          out, [last])

The GPU form, as `selective_scan_gpu` is for the real builder: the state is allocated
in the channel loop (one block per (batch, channel) owns it), the channel loop covers
all of D (the grid covers the channels), and B/C keep the caller's layout, state index
before time: (D, N), (batch, N, L), (batch, G, N, L) of complex<real>, which is also
Mamba's real (re, im) pairs on a last axis of 2L seen as complex (no copy).  Same
operations in the same order per step as the CPU form.
"""

from __future__ import annotations

from xdsl.builder import ImplicitBuilder
from xdsl.dialects import arith, complex, func, memref, scf
from xdsl.dialects.builtin import ArrayAttr, ComplexType, FloatAttr, IndexType, ModuleOp
from xdsl.ir import Attribute, Block, Region, SSAValue

from scanweaver.dialects import scan
from scanweaver.workloads.loops import element_type
from scanweaver.workloads.selective import (
    BC_KINDS, DYNAMIC, Sizes, _bc_indices, _Body, _for, _named, selective_arguments, step_size, store_output,
)
from scanweaver.workloads.specs import ComplexSelectiveSpec
from scanweaver.workloads.types import memref_of

REALS = ("f32", "f64")


def _arguments(spec: ComplexSelectiveSpec, gpu: bool = False, sizes: Sizes = DYNAMIC) -> list[tuple[str, Attribute]]:
    return selective_arguments(spec, spec.real, ComplexType(element_type(spec.real)), gpu=gpu, sizes=sizes)


def selective_scan_complex_recurrence(spec: ComplexSelectiveSpec) -> ModuleOp:
    """`func.func @selective_scan_complex` for `spec`."""
    return _build(spec, False, DYNAMIC)


def selective_scan_complex_gpu(spec: ComplexSelectiveSpec, sizes: Sizes = DYNAMIC) -> ModuleOp:
    """The GPU form of `selective_scan_complex_recurrence` (module docstring): by
    default one build for every (batch, D, L); static `sizes` save the registers that
    dynamic strides take (see `runtime/cuda_scan.py`)."""
    return _build(spec, True, tuple(sizes))


def _build(spec: ComplexSelectiveSpec, gpu: bool, sizes: Sizes) -> ModuleOp:
    if spec.b_kind not in BC_KINDS or spec.c_kind not in BC_KINDS:
        raise ValueError(f"B/C kinds must be among {BC_KINDS}, got {spec.b_kind!r}, {spec.c_kind!r}")
    if spec.real not in REALS:
        raise ValueError(f"the complex state's parts must be among {REALS}, got {spec.real!r}")
    args = _arguments(spec, gpu, sizes)
    block = Block(arg_types=[t for _, t in args])
    for value, (hint, _) in zip(block.args, args):
        value.name_hint = hint
    v = dict(zip((hint for hint, _ in args), block.args))
    with ImplicitBuilder(block):
        _kernel_body(spec, v, gpu)
        func.ReturnOp()
    fn = func.FuncOp("selective_scan_complex", ([t for _, t in args], []), Region(block))
    return ModuleOp([fn])


class _Complex(_Body):
    """`_Body` plus the complex ops, on complex<el>."""

    def __init__(self, el: Attribute):
        super().__init__(el)
        self.c = ComplexType(el)

    def zero(self, hint: str) -> SSAValue:
        value = ArrayAttr([FloatAttr(0.0, self.el), FloatAttr(0.0, self.el)])
        return _named(complex.ConstantOp(value, self.c).complex, hint)

    def parts(self, z: SSAValue, hint: str) -> tuple[SSAValue, SSAValue]:
        return (_named(complex.ReOp(z).result, hint + "r"), _named(complex.ImOp(z).result, hint + "i"))

    def create(self, re: SSAValue, im: SSAValue, hint: str) -> SSAValue:
        return _named(complex.CreateOp(re, im, self.c).complex, hint)


def _kernel_body(spec: ComplexSelectiveSpec, v: dict[str, SSAValue], gpu: bool = False) -> None:
    """Constants and sizes, then the (batch, channel) loops around one scan.recurrence
    (the state allocated once on the CPU, per channel on the GPU)."""
    e = _Complex(element_type(spec.real))
    c0, c1, c2 = e.index(0, "c0"), e.index(1, "c1"), e.index(2, "c2")
    cN = e.index(spec.n, "cN")
    k = {"c0": c0, "c1": c1, "cN": cN, "zero": e.float(0.0, "zero"), "one": e.float(1.0, "one"),
         "two": e.float(2.0, "two"), "twenty": e.float(20.0, "twenty")}
    # the GPU kernel captures real constants only: there the zero state is made in the loop
    zero_state = (lambda: e.create(k["zero"], k["zero"], "czero")) if gpu else (lambda: k["czero"])
    if not gpu:
        k["czero"] = e.zero("czero")
    dim = lambda i, hint: _named(memref.DimOp(v["u"], i).result, hint)  # noqa: E731
    batch, k["Dn"], length = dim(c0, "batch"), dim(c1, "Dn"), dim(c2, "len")
    per: dict[str, SSAValue] = {}
    for name, kind in (("B", spec.b_kind), ("C", spec.c_kind)):
        if kind == "grouped":
            groups = _named(memref.DimOp(v[name], c1).result, f"ng{name}")
            per[name] = e.op(arith.DivUIOp, k["Dn"], groups, hint=f"per{name}")
    state_type = memref_of((spec.n,), e.c)
    new_state = lambda: _named(memref.AllocaOp.get(e.c, shape=[spec.n]).memref, "S")  # noqa: E731
    hoisted = None if gpu else new_state()

    def channel(b: SSAValue, d: SSAValue) -> None:
        state = new_state() if hoisted is None else hoisted
        group = {name: e.op(arith.DivUIOp, d, p, hint=f"g{name}") for name, p in per.items()}
        _for(c0, cN, c1, "n", lambda n: memref.StoreOp.get(
            e.load(v["h0"], [b, d, n], "v") if spec.has_h0 else zero_state(), state, [n]))
        bd = e.load(v["bias"], [d], "bd") if spec.has_bias else None
        dd = e.load(v["Dskip"], [d], "dd") if spec.has_d else None
        coeffs = _coeffs_region(e, spec, v, k, b, d, group, bd, gpu)
        emit = _emit_region(e, spec, v, k, state_type, b, d, group, dd, gpu)
        scan.RecurrenceOp(c0, length, c1, state, coeffs, emit)
        if spec.has_last:
            _for(c0, cN, c1, "n", lambda n: memref.StoreOp.get(
                e.load(state, [n], "v"), v["last"], [b, d, n]))

    d_begin, d_end = (c0, k["Dn"]) if gpu else (v["d_begin"], v["d_end"])
    _for(c0, batch, c1, "b", lambda b: _for(d_begin, d_end, c1, "d", lambda d: channel(b, d)))


def _coeffs_region(e: _Complex, spec, v, k, b, d, group, bd, gpu=False) -> Region:
    """(a, x) at step i, state index k: exp(dt * A[d, k]) and B[.., i, k] * (dt * u)."""
    block = Block(arg_types=[IndexType(), IndexType()])
    i, n = block.args
    i.name_hint, n.name_hint = "i", "k"
    with ImplicitBuilder(block):
        dt = step_size(e, spec, v, k, b, d, i, bd)
        # exp(dt * A): a real times a complex scales both parts
        akr, aki = e.parts(e.load(v["A"], [d, n], "ak"), "ak")
        da = e.create(e.op(arith.MulfOp, dt, akr, hint="dar"), e.op(arith.MulfOp, dt, aki, hint="dai"), "da")
        a = _named(complex.ExpOp(da).result, "a")
        bk = e.load(v["B"], _bc_indices(spec.b_kind, group.get("B"), b, d, i, n, gpu), "bk")
        dtu = e.op(arith.MulfOp, dt, e.load(v["u"], [b, d, i], "uu"), hint="dtu")
        bkr, bki = e.parts(bk, "bk")
        x = e.create(e.op(arith.MulfOp, bkr, dtu, hint="xr"), e.op(arith.MulfOp, bki, dtu, hint="xi"), "x")
        scan.YieldOp(a, x)
    return Region(block)


def _emit_region(e: _Complex, spec, v, k, state_type, b, d, group, dd, gpu=False) -> Region:
    """out[b, d, i] = (2 Re(C[.., i, :] . S)  [+ Dskip[d] u]) [* silu(z)]."""
    block = Block(arg_types=[IndexType(), state_type])
    i, s = block.args
    i.name_hint, s.name_hint = "i", "s"
    with ImplicitBuilder(block):
        y = e.op(arith.MulfOp, _re_dot_c(e, spec, v, k, s, b, d, i, group, gpu), k["two"], hint="y")
        store_output(e, spec, v, k, y, dd, b, d, i)
        scan.YieldOp()
    return Region(block)


def _re_dot_c(e: _Complex, spec, v, k, s, b, d, i, group, gpu=False) -> SSAValue:
    """Re(sum_n S[n] * C[.., i, n]) = sum_n (S.re C.re - S.im C.im), an scf.for reduction."""
    block = Block(arg_types=[IndexType(), e.el])
    n, acc = block.args
    n.name_hint, acc.name_hint = "n", "acc"
    with ImplicitBuilder(block):
        hv = e.load(s, [n], "hv")
        cv = e.load(v["C"], _bc_indices(spec.c_kind, group.get("C"), b, d, i, n, gpu), "cv")
        hr, hi = e.parts(hv, "h")
        cr, ci = e.parts(cv, "c")
        p1 = e.op(arith.MulfOp, hr, cr, hint="p1")
        p2 = e.op(arith.MulfOp, hi, ci, hint="p2")
        pr = e.op(arith.SubfOp, p1, p2, hint="pr")
        scf.YieldOp(e.op(arith.AddfOp, acc, pr, hint="acc2"))
    loop = scf.ForOp(k["c0"], k["cN"], k["c1"], [k["zero"]], Region(block))
    return _named(loop.results[0], "y1")


__all__ = ["ComplexSelectiveSpec", "REALS", "selective_scan_complex_gpu", "selective_scan_complex_recurrence"]
