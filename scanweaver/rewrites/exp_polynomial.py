"""`math-exp-to-polynomial`: f32 `math.exp` (scalar or vector) as a polynomial in arith ops.

MLIR lowers `math.exp` to the `llvm.exp` intrinsic, which on CPU becomes a call to
libm's `expf` for *each lane* of a vector: 16 calls for a vector<16xf32>.  This rewrite
replaces it by straight-line arith code that vectorises (Cephes `expf`):

    exp(x) = 2^k * exp(r),   k = round(x / ln2),   r = x - k*ln2   (|r| <= ln2/2)

* round to nearest with the 1.5*2^23 trick: t = x*log2(e) + 12582912 has k in its low
  mantissa bits, so k = bitcast(t) - bitcast(12582912) (an integer), kf = t - 12582912;
* r = (x - kf*C1) - kf*C2 with ln2 = C1 + C2 split (Cody-Waite), C1 exact in 9 bits;
* exp(r) ~= 1 + r + r^2 * P(r), P of degree 5 (Cephes coefficients), Horner;
* 2^k is added into the exponent bits: bitcast(p) + (k << 23) as an integer add.
  Valid while the exponent stays normal: k is applied as kk = max(k, -125) that way and
  the rest (k - kk, from 0 down to -25) as a multiply by an exact power of two, so
  results in the subnormal range are rounded once, correctly; k = 128 (x close to
  88.72) overflows to +inf exactly when the true result does.
* x is clamped to [-104, 88.72283172607421875] first (x < -104 then gives 0: the true
  value is below half the smallest subnormal); x > 88.72283172607421875 gives +inf and
  NaN stays NaN (two selects at the end).

Accuracy, measured against float64 numpy over 2^24 points uniform in [-104, 88.7] and
2^20 in [-1, 1]: max relative error 8.1e-8 for normal results, at most 1 ulp from the
correctly rounded float32 (mean 0.1 ulp); subnormal results within 0.75 of the smallest
subnormal step; exp(+-0) = 1, exp(-inf) = 0, exp(x > 88.7228317) = +inf, exp(NaN) = NaN.
tests/test_scan_to_cpu.py checks <= 2 ulp.  Multiply and add stay separate ops (no FMA),
so scalar and vector code give the same bits, on every target; a math.exp marked
`FUSED_MARK` gets the fused form instead (fused multiply-adds, scalar and vector alike,
and a degree-6 polynomial of its own, `FUSED_Q`): measured the same way, max relative
error 7.6e-8 for normal results, at most 1 ulp (mean 0.06 ulp), subnormal results
within 0.86 of the smallest subnormal step, the same special values.
A fused exp also marked `SCALEF_MARK` (for a CPU with AVX-512F, VL and DQ) on 4, 8 or
16 lanes computes the same bits with fewer operations: 2^k applied by AVX-512's
`vscalefps` (p * 2^k rounded once, so subnormal results and overflow to +inf come out
as the integer steps give them), and instead of the two clamps of x and the two final
selects one `vrangeps` that bounds the reduced argument r (see `_expand_exp_scalef`):
12 x86 instructions instead of 24 (13 with the two clamps it had before; in the
selective kernel's loop the form with the one `vrangeps` ran 5-10% faster: thread CPU
time, medians of 9-15 interleaved calls at (2, 1536, 16, 1024), one thread, two runs).

Also here: `expand_log1p` (same style: Cephes logf on the mantissa, exponent by integer
ops, a rounding fix-up for 1 + x; at most 1 ulp measured, 2 checked), used by
`scan-to-cpu` for the softplus it vectorises over time, and `vector_compatible` /
`generic_op_class` for vector forms of ops that xDSL types as scalar-only.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from xdsl.builder import Builder
from xdsl.context import Context
from xdsl.dialects import arith, math
from xdsl.dialects.builtin import (
    DenseArrayBase,
    Float32Type,
    FloatAttr,
    IntegerAttr,
    ModuleOp,
    StringAttr,
    UnitAttr,
    VectorType,
    f32,
    i1,
    i8,
    i16,
    i32,
)
from xdsl.dialects import vector
from xdsl.dialects.utils.fast_math import FastMathFlag
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import (
    AnyAttr,
    IRDLOperation,
    irdl_op_definition,
    opt_prop_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.rewriter import InsertPoint
from xdsl.traits import Pure

# Cephes expf constants.
LOG2E = 1.44269504088896341
C1 = 0.693359375
C2 = -2.12194440e-4
P = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
#: The fused form's polynomial: exp(r) ~= 1 + r (1 + r (Q[4] + r (Q[3] + ... r Q[0]))),
#: degree 6, its coefficients fitted for this file (float32, minimax of the relative
#: error on |r| <= ln2/2 by iterated reweighted least squares: 3.1e-9 before rounding
#: them to float32), evaluated by Horner's scheme in 6 fused multiply-adds.
FUSED_Q = (0.0013814599, 0.008368717, 0.04166839, 0.16666521, 0.49999994)
MAGIC = 12582912.0  # 1.5 * 2**23
MAGIC_BITS = 0x4B400000
HI = 88.72283172607421875  # largest float x with exp(x) < FLT_MAX (128*ln2 rounded down)
LO = -104.0
#: The scalef form's bound on the reduced argument r (it clamps r, not x): above every
#: |r| of an x below 2^21 in magnitude (ln2/2 and a rounding: those r are never
#: changed), and small enough that exp(SCALEF_R) < 2 (see `_expand_exp_scalef`).
SCALEF_R = 0.5

#: AVX-512 `vscalefps` (x * 2^floor(y)) by vector length: the intrinsic, its mask type,
#: whether it takes a rounding argument (the 512-bit one only).
SCALEF_INTRINSICS = {
    16: ("llvm.x86.avx512.mask.scalef.ps.512", i16, True),
    8: ("llvm.x86.avx512.mask.scalef.ps.256", i8, False),
    4: ("llvm.x86.avx512.mask.scalef.ps.128", i8, False),
}
ROUND_CURRENT = 4  # the rounding argument: MXCSR's mode (round to nearest)
#: AVX-512DQ `vrangeps` by vector length, as in `SCALEF_INTRINSICS` (the 512-bit one's
#: last argument is its exception control: `ROUND_CURRENT`, none suppressed).
RANGE_INTRINSICS = {
    16: ("llvm.x86.avx512.mask.range.ps.512", i16, True),
    8: ("llvm.x86.avx512.mask.range.ps.256", i8, False),
    4: ("llvm.x86.avx512.mask.range.ps.128", i8, False),
}
#: vrangeps's immediate: of its two operands the one of smaller magnitude (imm[1:0] = 2)
#: with the first one's sign (imm[3:2] = 0), so (r, c) gives r clamped to [-c, c].
RANGE_MIN_ABS_SIGN_OF_FIRST = 2


def _is_f32_like(t: Attribute) -> bool:
    if isinstance(t, VectorType):
        return isinstance(t.element_type, Float32Type)
    return isinstance(t, Float32Type)


class _Emit:
    """Builds scalar or vector constants and ops of one shape."""

    def __init__(self, b: Builder, like: Attribute):
        self.b = b
        self.vt = like if isinstance(like, VectorType) else None
        self.ft = like
        self.it = VectorType(i32, like.get_shape()) if isinstance(like, VectorType) else i32

    def _splat(self, scalar: SSAValue, t: Attribute) -> SSAValue:
        if isinstance(t, VectorType):
            return self.b.insert(vector.BroadcastOp(scalar, t)).results[0]
        return scalar

    def f(self, value: float) -> SSAValue:
        c = self.b.insert(arith.ConstantOp(FloatAttr(value, f32))).results[0]
        return self._splat(c, self.ft)

    def i(self, value: int) -> SSAValue:
        c = self.b.insert(arith.ConstantOp(IntegerAttr(value, i32))).results[0]
        return self._splat(c, self.it)

    def op(self, op: Operation) -> SSAValue:
        return self.b.insert(op).results[0]


def scalef_lanes(t: Attribute) -> bool:
    """Whether the scalef form applies to f32 values of type `t` (4, 8 or 16 lanes)."""
    return isinstance(t, VectorType) and t.get_num_dims() == 1 and isinstance(t.element_type, Float32Type) \
        and t.get_shape()[0] in SCALEF_INTRINSICS


def expand_exp(b: Builder, x: SSAValue, fused: bool = False, scalef: bool = False) -> SSAValue:
    """Insert the polynomial exp of f32 (or vector of f32) `x` at `b`; return the result.

    fused: the multiply-adds (the rounding to k, both Cody-Waite steps) fused, and
    exp(r) by `FUSED_Q` in 6 fused multiply-adds: 11 operations fewer, each rounded
    once (other bits than the unfused form, within its error; see `FUSED_MARK`).
    scalef (with fused, on `scalef_lanes`; AVX-512 only): the fused form's bits with
    2^k applied by `vscalefps` (see the module docstring; `SCALEF_MARK`).
    """
    if fused and scalef and scalef_lanes(x.type):
        return _expand_exp_scalef(b, x)
    e = _Emit(b, x.type)
    mulf = lambda p, q: e.op(arith.MulfOp(p, q))  # noqa: E731
    addf = lambda p, q: e.op(arith.AddfOp(p, q))  # noqa: E731
    subf = lambda p, q: e.op(arith.SubfOp(p, q))  # noqa: E731
    if fused:
        muladd = lambda p, q, c: e.op(vector_compatible(math.FmaOp(p, q, c)))  # noqa: E731
    else:
        muladd = lambda p, q, c: addf(mulf(p, q), c)  # noqa: E731
    # Clamp with x86-friendly max/min (no NaN propagation: NaN is handled at the end).
    nnan = arith.FastMathFlagsAttr([FastMathFlag.NO_NANS])
    lo = e.op(arith.MaxnumfOp(x, e.f(LO), nnan))
    xc = e.op(arith.MinnumfOp(lo, e.f(HI), nnan))
    t = muladd(xc, e.f(LOG2E), e.f(MAGIC))
    kf = subf(t, e.f(MAGIC))
    k = e.op(arith.SubiOp(e.op(arith.BitcastOp(t, e.it)), e.i(MAGIC_BITS)))
    # kf * C1 has at most 17 bits, so it is exact and fusing it changes no bit.
    r1 = muladd(kf, e.f(-C1), xc) if fused else subf(xc, mulf(kf, e.f(C1)))
    r = muladd(kf, e.f(-C2), r1) if fused else subf(r1, mulf(kf, e.f(C2)))
    p = _fused_polynomial(e, muladd, r) if fused else _cephes_polynomial(e, muladd, r)
    kk = e.op(arith.MaxSIOp(k, e.i(-125)))
    shifted = e.op(arith.ShLIOp(kk, e.i(23)))
    scaled = e.op(arith.BitcastOp(e.op(arith.AddiOp(e.op(arith.BitcastOp(p, e.it)), shifted)), e.ft))
    # The rest of k (0 .. -25) as an exact power of two: 2^(k - kk) = bits (k - kk + 127) << 23.
    rest = e.op(arith.ShLIOp(e.op(arith.AddiOp(e.op(arith.SubiOp(k, kk)), e.i(127))), e.i(23)))
    y = mulf(scaled, e.op(arith.BitcastOp(rest, e.ft)))
    # x > HI: +inf; NaN: NaN (x < LO was clamped to LO, whose result rounds to 0).
    y = _select(e, _cmpf(e, "ogt", x, e.f(HI)), e.f(float("inf")), y)
    return _select(e, _cmpf(e, "uno", x, x), x, y)


def _expand_exp_scalef(b: Builder, x: SSAValue) -> SSAValue:
    """The fused form's exp with 2^k applied by `vscalefps`: for every non-NaN x the
    same bits, NaN in, NaN out.  x is not clamped; r is, to [-SCALEF_R, SCALEF_R], by one
    `vrangeps` (it returns the bound for a NaN r: the NaN comes out through k instead).
    * |x| < 2^21: k = round(x / ln2) exactly and |r| <= ln2/2 + a rounding < SCALEF_R,
      so r, p and k are the fused form's own for x in [LO, HI], and p * 2^k the same
      bits (exact for normal results, rounded once for subnormal ones either way).
      x > HI has k = 128 and r > 0 there (p >= 1), or k >= 129 (p > 0.7): p * 2^k
      overflows to +inf, as the fused form gives.
      x < LO has k = -150 and r < -0.027 (p < 0.973), or k <= -151 (p < exp(SCALEF_R) < 2):
      p * 2^k is below half the smallest subnormal, so 0, as the fused form gives.
    * larger finite |x|: |k| > 2^21 with the sign of x (not always an integer:
      `vscalefps` takes floor(k)), and r, clamped, gives a p in (0.6, 1.7): +inf or 0.
    * x = +-inf: k = +-inf, r NaN (clamped), p finite: +inf or 0.  NaN: k NaN, NaN."""
    e = _Emit(b, x.type)
    fma = lambda p, q, c: e.op(vector_compatible(math.FmaOp(p, q, c)))  # noqa: E731
    t = fma(x, e.f(LOG2E), e.f(MAGIC))
    kf = e.op(arith.SubfOp(t, e.f(MAGIC)))
    r1 = fma(kf, e.f(-C1), x)  # exact product: the unfused form's bits
    r = fma(kf, e.f(-C2), r1)
    rc = _x86_intrinsic(e, RANGE_INTRINSICS, [r, e.f(SCALEF_R)], [_i32(e, RANGE_MIN_ABS_SIGN_OF_FIRST)], r)
    return _scalef(e, _fused_polynomial(e, fma, rc), kf)


def _cephes_polynomial(e: "_Emit", muladd, r: SSAValue) -> SSAValue:
    """exp(r) ~= 1 + r + r^2 P(r), Cephes' P of degree 5 by Horner's scheme."""
    poly = e.f(P[0])
    for coeff in P[1:]:
        poly = muladd(poly, r, e.f(coeff))
    r2 = e.op(arith.MulfOp(r, r))
    return e.op(arith.AddfOp(muladd(poly, r2, r), e.f(1.0)))


def _fused_polynomial(e: "_Emit", fma, r: SSAValue) -> SSAValue:
    """exp(r) ~= `FUSED_Q`'s polynomial, Horner's scheme down to the two unit terms."""
    poly = e.f(FUSED_Q[0])
    for coeff in (*FUSED_Q[1:], 1.0, 1.0):
        poly = fma(poly, r, e.f(coeff))
    return poly


def _scalef(e: "_Emit", p: SSAValue, k: SSAValue) -> SSAValue:
    """p * 2^k (k integral) by the AVX-512 intrinsic of p's vector length, all lanes."""
    return _x86_intrinsic(e, SCALEF_INTRINSICS, [p, k], [], p)


def _i32(e: "_Emit", value: int) -> SSAValue:
    return e.op(arith.ConstantOp(IntegerAttr(value, i32)))


def _x86_intrinsic(e: "_Emit", table, sources: list[SSAValue], immediates: list[SSAValue], like: SSAValue) -> SSAValue:
    """The masked AVX-512 intrinsic of `table` for `like`'s vector length, on all lanes:
    `sources`, `immediates`, the passthrough `like` (unused: the mask is all ones), the
    mask, and the rounding argument where the 512-bit form takes one."""
    name, mask_type, rounds = table[like.type.get_shape()[0]]  # type: ignore[attr-defined]
    operands = [*sources, *immediates, like, e.op(arith.ConstantOp(IntegerAttr(-1, mask_type)))]
    if rounds:
        operands.append(_i32(e, ROUND_CURRENT))
    call = generic_op_class("llvm.call_intrinsic", ("intrin", "op_bundle_sizes", "operandSegmentSizes"))
    return e.op(call.create(
        operands=operands, result_types=[like.type],
        properties={"intrin": StringAttr(name), "op_bundle_sizes": DenseArrayBase.from_list(i32, []),
                    "operandSegmentSizes": DenseArrayBase.from_list(i32, [len(operands), 0])}))


# Cephes logf coefficients (log(1+f) = f - f^2/2 + f^3 P(f), |f| <= sqrt(2)-1).
LOG_P = (
    7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1,
    -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1,
)


@functools.cache
def generic_op_class(name: str, props: tuple[str, ...], pure: bool = True) -> type[IRDLOperation]:
    """An op class named `name` printed in generic form (no assembly format).

    For MLIR ops that xDSL lacks or types too narrowly; `pure=False` for ops with side
    effects (never removed as dead code).
    """
    fields: dict[str, object] = {
        "name": name,
        "args": var_operand_def(),
        "outs": var_result_def(),
        "traits": traits_def(Pure()) if pure else traits_def(),
        **{p: opt_prop_def(AnyAttr()) for p in props},
    }
    cls = type("Generic_" + name.replace(".", "_"), (IRDLOperation,), fields)
    return irdl_op_definition(cls)


def vector_compatible(op: Operation) -> Operation:
    """`op` itself if xDSL's definition accepts its (vector) types, else a generic twin.

    Some xDSL op definitions (arith.select, arith.cmpf, ...) accept scalars only although
    MLIR accepts vectors; the twin is an op of the same name, printed in generic form,
    which mlir-opt reads as the real op.  (Not an UnregisteredOp: xDSL treats those as
    having every trait, constant-like included, and canonicalize hoists them.)
    """
    try:
        op.verify()
        return op
    except Exception:  # noqa: BLE001 - any verifier complaint
        cls = generic_op_class(op.name, tuple(sorted(op.properties)))
        twin = cls.create(
            operands=list(op.operands),
            result_types=[r.type for r in op.results],
            properties=dict(op.properties),
            attributes=dict(op.attributes),
        )
        op.drop_all_references()
        return twin


def _cmpf(e: "_Emit", pred: str, p: SSAValue, q: SSAValue) -> SSAValue:
    proto = arith.CmpfOp(p, q, pred)
    if e.vt is None:
        return e.op(proto)
    cond_t = VectorType(i1, e.vt.get_shape())
    op = arith.CmpfOp.create(operands=[p, q], result_types=[cond_t], properties=dict(proto.properties))
    proto.drop_all_references()
    return e.op(vector_compatible(op))


def _select(e: "_Emit", cond: SSAValue, p: SSAValue, q: SSAValue) -> SSAValue:
    op = arith.SelectOp.create(operands=[cond, p, q], result_types=[p.type])
    return e.op(vector_compatible(op))


def expand_log1p(b: Builder, x: SSAValue, softplus: bool = False) -> SSAValue:
    """log1p of f32 (or vector of f32) `x` as arith ops (Cephes logf + a rounding fix-up).

    u = 1 + x is split as u = m * 2^k with m in [sqrt(1/2), sqrt(2)) by integer ops on
    its bits (no selects), log(u) = k*ln2 + log1p(m - 1) by a degree-9 polynomial, and
    the rounding of 1 + x is corrected by (x - (u - 1)) / u.  log1p(-1) = -inf,
    x < -1 or NaN gives NaN, +inf gives +inf.  Max error about 2 ulp.
    softplus: the log1p of softplus's exp (`SOFTPLUS_LOG1P_MARK`): without the four final
    selects, whose cases never occur there or are not used (x = +0 gives +0 without
    them, x = -0, x <= -1 cannot occur, +inf is not used): the same bits for every x
    in [0, inf), a NaN for a NaN.
    """
    e = _Emit(b, x.type)
    mulf = lambda p, q: e.op(arith.MulfOp(p, q))  # noqa: E731
    addf = lambda p, q: e.op(arith.AddfOp(p, q))  # noqa: E731
    subf = lambda p, q: e.op(arith.SubfOp(p, q))  # noqa: E731
    one = e.f(1.0)
    u = addf(x, one)
    corr = e.op(arith.DivfOp(subf(x, subf(u, one)), u))
    ix = e.op(arith.AddiOp(e.op(arith.BitcastOp(u, e.it)), e.i(0x3F800000 - 0x3F3504F3)))
    k = e.op(arith.SubiOp(e.op(arith.ShRSIOp(ix, e.i(23))), e.i(0x7F)))
    m = e.op(arith.BitcastOp(e.op(arith.AddiOp(e.op(arith.AndIOp(ix, e.i(0x007FFFFF))), e.i(0x3F3504F3))), e.ft))
    kf = subf(e.op(arith.BitcastOp(e.op(arith.AddiOp(k, e.i(MAGIC_BITS))), e.ft)), e.f(MAGIC))
    f = subf(m, one)
    z = mulf(f, f)
    poly = e.f(LOG_P[0])
    for coeff in LOG_P[1:]:
        poly = addf(mulf(poly, f), e.f(coeff))
    y = mulf(mulf(poly, f), z)
    y = addf(y, mulf(kf, e.f(C2)))
    y = subf(y, mulf(z, e.f(0.5)))
    r = addf(addf(f, y), mulf(kf, e.f(C1)))
    r = addf(r, corr)
    if softplus:
        return r
    r = _select(e, _cmpf(e, "oeq", x, e.f(0.0)), x, r)  # keeps the sign of -0.0
    r = _select(e, _cmpf(e, "oeq", x, e.f(float("inf"))), x, r)
    r = _select(e, _cmpf(e, "oeq", x, e.f(-1.0)), e.f(float("-inf")), r)
    return _select(e, _cmpf(e, "ult", x, e.f(-1.0)), e.f(float("nan")), r)


def _rewrite_all(root: Operation, op_type, expand) -> int:
    """Replace every f32 (scalar or 1-D vector) `op_type` nested in `root` by `expand`."""
    ops = [op for op in root.walk() if isinstance(op, op_type) and _is_f32_like(op.operand.type)]
    for op in ops:
        if isinstance(op.operand.type, VectorType) and op.operand.type.get_num_dims() != 1:
            continue
        y = expand(Builder(InsertPoint.before(op)), op.operand)
        op.result.replace_all_uses_with(y)
        op.detach()
        op.erase()
    return len(ops)


def rewrite_log1ps(root: Operation) -> int:
    """Rewrite every f32 math.log1p nested in `root` into `expand_log1p`; count them."""
    return _rewrite_all(root, math.Log1pOp, expand_log1p)


#: Unit attribute on the math.exp / math.log1p ops that `scan-to-cpu` built into a
#: vectorised recurrence; the pipeline's `math-exp-to-polynomial{marked_only=true}`
#: rewrites only these, so the sequential fallback and other user code keep libm calls.
POLY_MARK = "scanweaver.poly_exp"

#: Unit attribute a builder puts on a math.exp whose polynomial may use fused
#: multiply-adds (`expand_exp(fused=True)`): the selective scan's per-step exp(dt * A),
#: where the 9 operations saved are a sixth of a step.  Kept through vectorisation, so
#: the blocked steps and the remainder steps of a recurrence compute the same bits.
FUSED_MARK = "scanweaver.fused_exp"

#: Unit attribute a builder puts beside `FUSED_MARK` when the kernel is for a CPU with
#: AVX-512F, VL and DQ: the fused exp's bits in fewer operations (`expand_exp`'s
#: scalef form, on 4, 8 or 16 lanes; other shapes keep the fused form).  In the IR
#: text, so a kernel cached for one CPU is not taken for another.
SCALEF_MARK = "scanweaver.scalef_exp"

#: Unit attribute a builder puts on the math.log1p of softplus(x) = x > 20 ? x :
#: log1p(exp(x)): its operand is an exp (>= +0, or NaN) and its result is not used
#: where that exp is +inf, so `expand_log1p(softplus=True)` leaves out the selects for
#: those cases (the same bits; 8 vector operations fewer per softplus).
SOFTPLUS_LOG1P_MARK = "scanweaver.softplus_log1p"


def _expandable(op: Operation) -> bool:
    """An f32 math.exp / math.log1p on a scalar or a 1-D vector (what the polynomials take)."""
    t = op.operand.type  # type: ignore[attr-defined]
    return _is_f32_like(t) and not (isinstance(t, VectorType) and t.get_num_dims() != 1)


def mark_for_polynomial(root: Operation) -> int:
    """Mark every expandable math.exp and math.log1p nested in `root`; count them."""
    ops = [op for op in root.walk() if isinstance(op, (math.ExpOp, math.Log1pOp)) and _expandable(op)]
    for op in ops:
        op.attributes[POLY_MARK] = UnitAttr()
    return len(ops)


def rewrite_marked(root: Operation) -> int:
    """Expand every marked math.exp / math.log1p nested in `root`; count them."""
    ops = [op for op in root.walk() if POLY_MARK in op.attributes]
    for op in ops:
        assert isinstance(op, (math.ExpOp, math.Log1pOp)) and _expandable(op), op.name
        at = Builder(InsertPoint.before(op))
        if isinstance(op, math.ExpOp):
            y = expand_exp(at, op.operand, fused=FUSED_MARK in op.attributes, scalef=SCALEF_MARK in op.attributes)
        else:
            y = expand_log1p(at, op.operand, softplus=SOFTPLUS_LOG1P_MARK in op.attributes)
        op.result.replace_all_uses_with(y)
        op.detach()
        op.erase()
    return len(ops)


class ExpPolynomial(RewritePattern):
    """math.exp on f32 or vector<...xf32> -> the polynomial."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: math.ExpOp, rewriter: PatternRewriter) -> None:
        x = op.operand
        if not _is_f32_like(x.type):
            return
        if isinstance(x.type, VectorType) and x.type.get_num_dims() != 1:
            return
        y = expand_exp(Builder(InsertPoint.before(op)), x)
        rewriter.replace(op, [], [y])


def rewrite_exps(root: Operation) -> int:
    """Rewrite every f32 math.exp nested in `root` (without a pattern walker); count them."""
    return _rewrite_all(root, math.ExpOp, expand_exp)


@dataclass(frozen=True)
class ExpToPolynomial(ModulePass):
    """Rewrite f32 math.exp (scalar and 1-D vector) into a vectorisable polynomial.

    `marked_only`: rewrite only the math.exp and math.log1p ops carrying `POLY_MARK`
    (those `scan-to-cpu` vectorised; how the CPU pipeline runs this stage), leaving
    every other math.exp alone.
    """

    name = "math-exp-to-polynomial"

    marked_only: bool = False

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.marked_only:
            rewrite_marked(op)
            return
        PatternRewriteWalker(ExpPolynomial(), apply_recursively=False).rewrite_module(op)


__all__ = [
    "FUSED_MARK",
    "POLY_MARK",
    "SCALEF_MARK",
    "SOFTPLUS_LOG1P_MARK",
    "ExpPolynomial",
    "ExpToPolynomial",
    "expand_exp",
    "expand_log1p",
    "mark_for_polynomial",
    "rewrite_exps",
    "rewrite_log1ps",
    "rewrite_marked",
    "scalef_lanes",
    "vector_compatible",
]
