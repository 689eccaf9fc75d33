"""Builder of the VJP of Mamba's selective scan with complex A (`selective_complex.py`):
the backward as compiled `scan.recurrence`s, recomputing the states in chunks.

    selective_scan_complex_vjp(spec)
        func.func @selective_scan_complex_vjp(u, delta, A, B, C, Dskip, [z], bias, h0, dout,
            dlast, ckpt, du, ddelta, dA, dB, dC, dD, [dz], dbias, dh0, d_begin, d_end)

Layouts as in the forward (B, C and their gradients time before the state index; A, B,
C, h0, dlast, ckpt and the complex gradients `complex<spec.real>`).  Gradients follow
PyTorch's complex convention (grad = dL/dRe + i dL/dIm).  dA, dB, dC, dD and dbias are
accumulated into (the caller zeroes them); the others are written.  Per (batch,
channel), with a_t = exp(dt_t A), x_t = dt_t u_t B_t, y_t = 2 Re(sum_n C_t h_t):

  1. forward in chunks of `spec.chunk` steps, the state before each chunk saved in
     ckpt[b, d, chunk, :] (the only state storage: L / chunk states per channel);
  2. chunks last to first: recompute the chunk's states from its checkpoint into a
     (chunk + 1, N) stack buffer (and y_t), then the adjoint, a reverse recurrence
         lam_t = conj(a_{t+1}) lam_{t+1} + 2 dy_t conj(C_t)       (lam_L = dlast)
     whose `emit` turns lam_t and h_{t-1}, h_t into the step's gradients:
         dx = lam, grad w = lam conj(h_{t-1}) conj(a_t) (w = dt A), dA += dt grad w,
         dB += dt u lam, dC += 2 dy conj(h_t), d(dt) = u Re(lam conj(B)) + Re(grad w conj(A));
  3. dh0 = conj(a_0) lam_0.

Nothing of size (batch, D, L, N) exists.  The caller needs L >= 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.builder import ImplicitBuilder
from xdsl.dialects import arith, complex, func, memref, scf
from xdsl.dialects import math as mathd
from xdsl.dialects.builtin import ComplexType, IndexType, ModuleOp
from xdsl.ir import Attribute, Block, Region, SSAValue

from scanweaver.dialects import scan
from scanweaver.workloads.loops import element_type
from scanweaver.workloads.selective import BC_KINDS, _bc_indices, _for, _named, bc_type, step_size
from scanweaver.workloads.selective_complex import REALS, _Complex
from scanweaver.workloads.types import memref_of


@dataclass(frozen=True)
class ComplexSelectiveVjpSpec:
    """The compile-time shape of the complex selective VJP kernel (always D, bias, h0)."""

    n: int
    real: str  # "f32" | "f64"
    b_kind: str
    c_kind: str
    has_z: bool
    softplus: bool
    chunk: int = 64
    has_bias: bool = True  # step_size reads these two
    has_d: bool = True


def vjp_arguments(spec: ComplexSelectiveVjpSpec) -> list[tuple[str, Attribute]]:
    n, el, c = spec.n, spec.real, ComplexType(element_type(spec.real))
    m3 = memref_of(("?", "?", "?"), el)
    vec, st3 = memref_of(("?",), el), memref_of(("?", "?", n), c)
    z = [("z", m3)] if spec.has_z else []
    dz = [("dz", m3)] if spec.has_z else []
    return [("u", m3), ("delta", m3), ("A", memref_of(("?", n), c)), ("B", bc_type(spec.b_kind, n, c)),
            ("C", bc_type(spec.c_kind, n, c)), ("Dskip", vec), *z, ("bias", vec), ("h0", st3), ("dout", m3),
            ("dlast", st3), ("ckpt", memref_of(("?", "?", "?", n), c)),
            ("du", m3), ("ddelta", m3), ("dA", memref_of(("?", n), c)), ("dB", bc_type(spec.b_kind, n, c)),
            ("dC", bc_type(spec.c_kind, n, c)), ("dD", vec), *dz, ("dbias", vec), ("dh0", st3),
            ("d_begin", IndexType()), ("d_end", IndexType())]


def selective_scan_complex_vjp(spec: ComplexSelectiveVjpSpec) -> ModuleOp:
    """`func.func @selective_scan_complex_vjp` for `spec`."""
    if spec.b_kind not in BC_KINDS or spec.c_kind not in BC_KINDS:
        raise ValueError(f"B/C kinds must be among {BC_KINDS}, got {spec.b_kind!r}, {spec.c_kind!r}")
    if spec.real not in REALS:
        raise ValueError(f"the complex state's parts must be among {REALS}, got {spec.real!r}")
    if spec.chunk < 1:
        raise ValueError(f"chunk must be positive, got {spec.chunk}")
    args = vjp_arguments(spec)
    block = Block(arg_types=[t for _, t in args])
    for value, (hint, _) in zip(block.args, args):
        value.name_hint = hint
    v = dict(zip((hint for hint, _ in args), block.args))
    with ImplicitBuilder(block):
        _Vjp(spec, v).body()
        func.ReturnOp()
    fn = func.FuncOp("selective_scan_complex_vjp", ([t for _, t in args], []), Region(block))
    return ModuleOp([fn])


class _Vjp:
    """The kernel body; `e` emits at the current ImplicitBuilder point."""

    def __init__(self, spec: ComplexSelectiveVjpSpec, v: dict[str, SSAValue]):
        self.spec, self.v = spec, v
        self.e = e = _Complex(element_type(spec.real))
        self.k = {"c0": e.index(0, "c0"), "c1": e.index(1, "c1"), "cN": e.index(spec.n, "cN"),
                  "cT": e.index(spec.chunk, "cT"), "zero": e.float(0.0, "zero"), "one": e.float(1.0, "one"),
                  "two": e.float(2.0, "two"), "twenty": e.float(20.0, "twenty")}

    # -- small helpers
    def f(self, make, *operands, hint: str) -> SSAValue:
        return self.e.op(make, *operands, hint=hint)

    def cop(self, make, *operands, hint: str) -> SSAValue:
        return _named(make(*operands).result, hint)

    def scaled(self, s: SSAValue, z: SSAValue, hint: str, conj: bool = False) -> SSAValue:
        """s * z (or s * conj(z)) for a real s."""
        zr, zi = self.e.parts(z, hint)
        im = self.f(arith.MulfOp, s, zi, hint=hint + "si")
        return self.e.create(self.f(arith.MulfOp, s, zr, hint=hint + "sr"),
                             self.f(arith.NegfOp, im, hint=hint + "sn") if conj else im, hint)

    def exp_dt_a(self, dt: SSAValue, a: SSAValue, conj: bool, hint: str) -> SSAValue:
        """exp(dt * A) or its conjugate exp(dt * conj(A)) (dt real)."""
        return self.cop(complex.ExpOp, self.scaled(dt, a, hint + "w", conj), hint=hint)

    def add_into(self, m: SSAValue, idx: list[SSAValue], value: SSAValue, complex_: bool, hint: str) -> None:
        old = self.e.load(m, idx, hint + "o")
        if complex_:
            new = self.cop(complex.AddOp, old, value, hint=hint)
        else:
            new = self.f(arith.AddfOp, old, value, hint=hint)
        memref.StoreOp.get(new, m, idx)

    def sigmoid(self, x: SSAValue, hint: str) -> SSAValue:
        ex = self.f(mathd.ExpOp, self.f(arith.NegfOp, x, hint=hint + "n"), hint=hint + "e")
        return self.f(arith.DivfOp, self.k["one"], self.f(arith.AddfOp, self.k["one"], ex, hint=hint + "d"), hint=hint)

    def dt_at(self, t: SSAValue) -> SSAValue:
        return step_size(self.e, self.spec, self.v, self.k, self.b, self.d, t, self.bd)

    def bc(self, name: str, kind: str, t: SSAValue, n: SSAValue) -> list[SSAValue]:
        return _bc_indices(kind, self.group.get(name), self.b, self.d, t, n)

    # -- structure
    def body(self) -> None:
        e, k, v, spec = self.e, self.k, self.v, self.spec
        dim = lambda m, i, hint: _named(memref.DimOp(m, i).result, hint)  # noqa: E731
        self.batch, self.dn, self.length = dim(v["u"], k["c0"], "batch"), dim(v["u"], k["c1"], "Dn"), \
            dim(v["u"], e.index(2, "c2"), "len")
        self.per = {}
        for name, kind in (("B", spec.b_kind), ("C", spec.c_kind)):
            if kind == "grouped":
                self.per[name] = self.f(arith.DivUIOp, self.dn, dim(v[name], k["c1"], f"ng{name}"), hint=f"per{name}")
        tm1 = self.f(arith.SubiOp, k["cT"], k["c1"], hint="tm1")
        self.nch = self.f(arith.DivUIOp, self.f(arith.AddiOp, self.length, tm1, hint="lt"), k["cT"], hint="nch")
        self.lm1 = self.f(arith.SubiOp, self.length, k["c1"], hint="lm1")
        self.state_type = memref_of((spec.n,), e.c)
        self.S = _named(memref.AllocaOp.get(e.c, shape=[spec.n]).memref, "S")
        self.Lam = _named(memref.AllocaOp.get(e.c, shape=[spec.n]).memref, "Lam")
        self.H = _named(memref.AllocaOp.get(e.c, shape=[spec.chunk + 1, spec.n]).memref, "H")
        self.Y = _named(memref.AllocaOp.get(e.el, shape=[spec.chunk]).memref, "Y")
        _for(k["c0"], self.batch, k["c1"], "b",
             lambda b: _for(v["d_begin"], v["d_end"], k["c1"], "d", lambda d: self.channel(b, d)))

    def each_n(self, body) -> None:
        _for(self.k["c0"], self.k["cN"], self.k["c1"], "n", body)

    def chunk_range(self, c: SSAValue) -> tuple[SSAValue, SSAValue]:
        lo = self.f(arith.MuliOp, c, self.k["cT"], hint="lo")
        end = self.f(arith.AddiOp, lo, self.k["cT"], hint="end")
        return lo, self.f(arith.MinUIOp, end, self.length, hint="hi")

    def channel(self, b: SSAValue, d: SSAValue) -> None:
        e, k, v = self.e, self.k, self.v
        self.b, self.d = b, d
        self.group = {name: self.f(arith.DivUIOp, d, p, hint=f"g{name}") for name, p in self.per.items()}
        self.bd, self.dd = e.load(v["bias"], [d], "bd"), e.load(v["Dskip"], [d], "dd")
        self.each_n(lambda n: memref.StoreOp.get(e.load(v["h0"], [b, d, n], "v"), self.S, [n]))

        def checkpoint(c: SSAValue) -> None:
            lo, hi = self.chunk_range(c)
            self.each_n(lambda n: memref.StoreOp.get(e.load(self.S, [n], "v"), v["ckpt"], [b, d, c, n]))
            scan.RecurrenceOp(lo, hi, k["c1"], self.S, self.forward_coeffs(), self.empty_emit())

        _for(k["c0"], self.nch, k["c1"], "c", checkpoint)
        self.each_n(lambda n: memref.StoreOp.get(e.load(v["dlast"], [b, d, n], "v"), self.Lam, [n]))

        def backward_chunk(cr: SSAValue) -> None:
            last = self.f(arith.SubiOp, self.nch, k["c1"], hint="lastc")
            c = self.f(arith.SubiOp, last, cr, hint="c")
            lo, hi = self.chunk_range(c)

            def restore(n: SSAValue) -> None:
                h = e.load(v["ckpt"], [b, d, c, n], "v")
                memref.StoreOp.get(h, self.S, [n])
                memref.StoreOp.get(h, self.H, [k["c0"], n])

            self.each_n(restore)
            scan.RecurrenceOp(lo, hi, k["c1"], self.S, self.forward_coeffs(), self.recompute_emit(lo))
            steps = self.f(arith.SubiOp, hi, lo, hint="m")
            scan.RecurrenceOp(k["c0"], steps, k["c1"], self.Lam, self.adjoint_coeffs(hi), self.adjoint_emit(lo, hi))

        _for(k["c0"], self.nch, k["c1"], "cr", backward_chunk)
        dt0 = self.dt_at(k["c0"])

        def initial_grad(n: SSAValue) -> None:
            a0c = self.exp_dt_a(dt0, e.load(v["A"], [d, n], "an"), True, "a0c")
            lam = e.load(self.Lam, [n], "l0")
            memref.StoreOp.get(self.cop(complex.MulOp, a0c, lam, hint="dh"), v["dh0"], [b, d, n])

        self.each_n(initial_grad)

    # -- regions
    def forward_coeffs(self) -> Region:
        """exp(dt_i A_k), dt_i u_i B_i,k: the forward's producer."""
        e, v = self.e, self.v
        block = Block(arg_types=[IndexType(), IndexType()])
        i, n = block.args
        with ImplicitBuilder(block):
            dt = self.dt_at(i)
            a = self.exp_dt_a(dt, e.load(v["A"], [self.d, n], "ak"), False, "a")
            dtu = self.f(arith.MulfOp, dt, e.load(v["u"], [self.b, self.d, i], "uu"), hint="dtu")
            x = self.scaled(dtu, e.load(v["B"], self.bc("B", self.spec.b_kind, i, n), "bk"), "x")
            scan.YieldOp(a, x)
        return Region(block)

    def empty_emit(self) -> Region:
        block = Block(arg_types=[IndexType(), self.state_type])
        with ImplicitBuilder(block):
            scan.YieldOp()
        return Region(block)

    def re_dot_c(self, s: SSAValue, t: SSAValue) -> SSAValue:
        """Re(sum_n s[n] C[t, n])."""
        block = Block(arg_types=[IndexType(), self.e.el])
        n, acc = block.args
        with ImplicitBuilder(block):
            hc = self.cop(complex.MulOp, self.e.load(s, [n], "hv"),
                          self.e.load(self.v["C"], self.bc("C", self.spec.c_kind, t, n), "cv"), hint="hc")
            scf.YieldOp(self.f(arith.AddfOp, acc, self.cop(complex.ReOp, hc, hint="hcr"), hint="acc2"))
        loop = scf.ForOp(self.k["c0"], self.k["cN"], self.k["c1"], [self.k["zero"]], Region(block))
        return _named(loop.results[0], "y1")

    def recompute_emit(self, lo: SSAValue) -> Region:
        """H[i - lo + 1, :] = h_i and Y[i - lo] = y_i."""
        e, k = self.e, self.k
        block = Block(arg_types=[IndexType(), self.state_type])
        i, s = block.args
        with ImplicitBuilder(block):
            j = self.f(arith.SubiOp, i, lo, hint="j")
            j1 = self.f(arith.AddiOp, j, k["c1"], hint="j1")
            self.each_n(lambda n: memref.StoreOp.get(e.load(s, [n], "hv"), self.H, [j1, n]))
            memref.StoreOp.get(self.f(arith.MulfOp, self.re_dot_c(s, i), k["two"], hint="y"), self.Y, [j])
            scan.YieldOp()
        return Region(block)

    def gate(self, t: SSAValue, j: SSAValue) -> SSAValue:
        """dy_t: dout through the silu gate; writes dz_t on the way."""
        e, v = self.e, self.v
        dout = e.load(v["dout"], [self.b, self.d, t], "go0")
        if not self.spec.has_z:
            return dout
        zz = e.load(v["z"], [self.b, self.d, t], "zz")
        sz = self.sigmoid(zz, "sz")
        pre = self.f(arith.AddfOp, e.load(self.Y, [j], "yj"),
                     self.f(arith.MulfOp, self.dd, e.load(v["u"], [self.b, self.d, t], "uz"), hint="du0"), hint="pre")
        one_m = self.f(arith.SubfOp, self.k["one"], sz, hint="oms")
        dsilu = self.f(arith.MulfOp, sz, self.f(arith.AddfOp, self.k["one"],
                                                self.f(arith.MulfOp, zz, one_m, hint="zo"), hint="zo1"), hint="dsilu")
        dz = self.f(arith.MulfOp, self.f(arith.MulfOp, dout, pre, hint="dp"), dsilu, hint="dzv")
        memref.StoreOp.get(dz, v["dz"], [self.b, self.d, t])
        return self.f(arith.MulfOp, dout, self.f(arith.MulfOp, zz, sz, hint="silu"), hint="go")

    def step_back(self, hi: SSAValue, r: SSAValue) -> SSAValue:
        """t = hi - 1 - r: the adjoint walks the chunk backwards."""
        return self.f(arith.SubiOp, self.f(arith.SubiOp, hi, self.k["c1"], hint="hm1"), r, hint="t")

    def adjoint_coeffs(self, hi: SSAValue) -> Region:
        """conj(a_{t+1}) (1 at t = L - 1: lam_L = dlast) and 2 dy_t conj(C_t, k)."""
        e, k, v = self.e, self.k, self.v
        block = Block(arg_types=[IndexType(), IndexType()])
        r, n = block.args
        with ImplicitBuilder(block):
            t = self.step_back(hi, r)
            t1 = self.f(arith.AddiOp, t, k["c1"], hint="t1")
            inside = _named(arith.CmpiOp(t1, self.length, "ult").result, "inside")
            dtn = self.dt_at(self.f(arith.MinUIOp, t1, self.lm1, hint="tn"))
            dtn = _named(arith.SelectOp(inside, dtn, k["zero"]).result, "dtn")
            a = self.exp_dt_a(dtn, e.load(v["A"], [self.d, n], "ak"), True, "ac")
            go = e.load(v["dout"], [self.b, self.d, t], "go0")
            if self.spec.has_z:
                zz = e.load(v["z"], [self.b, self.d, t], "zz")
                go = self.f(arith.MulfOp, go, self.f(arith.MulfOp, zz, self.sigmoid(zz, "sz"), hint="silu"), hint="go")
            g2 = self.f(arith.MulfOp, go, k["two"], hint="g2")
            x = self.scaled(g2, e.load(v["C"], self.bc("C", self.spec.c_kind, t, n), "ck"), "g", conj=True)
            scan.YieldOp(a, x)
        return Region(block)

    def adjoint_emit(self, lo: SSAValue, hi: SSAValue) -> Region:
        """The step's gradients from lam_t (the state) and h_{t-1}, h_t (from H)."""
        e, k, v, spec = self.e, self.k, self.v, self.spec
        b, d = self.b, self.d
        block = Block(arg_types=[IndexType(), self.state_type])
        r, lam = block.args
        with ImplicitBuilder(block):
            t = self.step_back(hi, r)
            j = self.f(arith.SubiOp, t, lo, hint="j")
            j1 = self.f(arith.AddiOp, j, k["c1"], hint="j1")
            dt = self.dt_at(t)
            uu = e.load(v["u"], [b, d, t], "uu")
            s = self.f(arith.MulfOp, dt, uu, hint="s")
            go = self.gate(t, j)
            g2 = self.f(arith.MulfOp, go, k["two"], hint="g2")
            self.add_into(v["dD"], [d], self.f(arith.MulfOp, go, uu, hint="gu"), False, "dDn")

            inner = Block(arg_types=[IndexType(), e.el, e.el])
            n, ds, dw = inner.args
            with ImplicitBuilder(inner):
                ln = e.load(lam, [n], "ln")
                bidx = self.bc("B", spec.b_kind, t, n)
                bn = e.load(v["B"], bidx, "bn")
                # Re(lam conj(B)) = Re(conj(B) lam)
                ds2 = self.f(arith.AddfOp, ds, self.cop(complex.ReOp, self.cop(
                    complex.MulOp, ln, self.cop(complex.ConjOp, bn, hint="bc"), hint="lb"), hint="lbr"), hint="ds2")
                self.add_into(v["dB"], bidx, self.scaled(s, ln, "gb"), True, "dBn")
                cidx = self.bc("C", spec.c_kind, t, n)
                self.add_into(v["dC"], cidx, self.scaled(g2, e.load(self.H, [j1, n], "hc"), "gc", conj=True),
                              True, "dCn")
                an = e.load(v["A"], [d, n], "an")
                ac = self.exp_dt_a(dt, an, True, "ac")  # conj(a_t)
                hp = self.cop(complex.ConjOp, e.load(self.H, [j, n], "hp"), hint="hpc")
                gw = self.cop(complex.MulOp, self.cop(complex.MulOp, ln, hp, hint="gda"), ac, hint="gw")
                self.add_into(v["dA"], [d, n], self.scaled(dt, gw, "ga"), True, "dAn")
                gwa = self.cop(complex.ReOp, self.cop(complex.MulOp, gw, self.cop(complex.ConjOp, an, hint="anc"),
                                                      hint="gwa"), hint="gwar")
                scf.YieldOp(ds2, self.f(arith.AddfOp, dw, gwa, hint="dw2"))
            loop = scf.ForOp(k["c0"], k["cN"], k["c1"], [k["zero"], k["zero"]], Region(inner))
            ds_t, dw_t = loop.results
            du = self.f(arith.AddfOp, self.f(arith.MulfOp, ds_t, dt, hint="dsd"),
                        self.f(arith.MulfOp, go, self.dd, hint="gd"), hint="dun")
            memref.StoreOp.get(du, v["du"], [b, d, t])
            ddt = self.f(arith.AddfOp, self.f(arith.MulfOp, ds_t, uu, hint="dsu"), dw_t, hint="ddt")
            if spec.softplus:
                raw = self.f(arith.AddfOp, e.load(v["delta"], [b, d, t], "dl"), self.bd, hint="raw")
                scaled = self.f(arith.MulfOp, ddt, self.sigmoid(raw, "sr"), hint="ddts")
                big = _named(arith.CmpfOp(raw, k["twenty"], "ogt").result, "big")
                ddt = _named(arith.SelectOp(big, ddt, scaled).result, "ddtp")
            memref.StoreOp.get(ddt, v["ddelta"], [b, d, t])
            self.add_into(v["dbias"], [d], ddt, False, "dbn")
            scan.YieldOp()
        return Region(block)


__all__ = ["ComplexSelectiveVjpSpec", "selective_scan_complex_vjp", "vjp_arguments"]
