"""Interpreter implementations for upstream ops that ScanWeaver's IR uses.

Two kinds: ops xDSL 0.74 has no implementation for (math functions, several arith
conversions, memref.alloca/dim/copy), and float arithmetic re-implemented to round
to the result type after every op (xDSL computes in binary64 and rounds only on
store; compiled code rounds every f32 op, and the oracle must match it).
"""

from __future__ import annotations

import math
from typing import Any

from xdsl.dialects import arith, memref
from xdsl.dialects import math as mathd
from xdsl.dialects.builtin import DYNAMIC_INDEX, ComplexType, IntegerType
from xdsl.interpreter import (
    Interpreter,
    InterpreterFunctions,
    PythonValues,
    impl,
    register_impls,
)
from xdsl.interpreters.builtin import xtype_for_el_type
from xdsl.interpreters.shaped_array import ShapedArray
from xdsl.interpreters.utils.ptr import TypedPtr
from xdsl.ir import Operation

from scanweaver.interp.numerics import round_to, wrap_int


def _result(op: Operation, value: Any) -> PythonValues:
    return (round_to(op.results[0].type, value),)


def _safe(f):
    """Math functions with IEEE results where Python raises (exp overflow, log(0))."""

    def g(x: float) -> float:
        try:
            return f(x)
        except OverflowError:
            return math.inf
        except ValueError:
            if x == 0 and f in (math.log, math.log2, math.log10):
                return -math.inf
            if x == -1 and f is math.log1p:
                return -math.inf
            return math.nan

    return g


_UNARY_MATH = {
    mathd.ExpOp: _safe(math.exp),
    mathd.Exp2Op: _safe(lambda x: 2.0**x),
    mathd.ExpM1Op: _safe(math.expm1),
    mathd.LogOp: _safe(math.log),
    mathd.Log1pOp: _safe(math.log1p),
    mathd.Log2Op: _safe(math.log2),
    mathd.Log10Op: _safe(math.log10),
    mathd.SqrtOp: _safe(math.sqrt),
    mathd.RsqrtOp: _safe(lambda x: 1.0 / math.sqrt(x) if x != 0 else math.inf),
    mathd.TanhOp: math.tanh,
    mathd.SinOp: _safe(math.sin),
    mathd.CosOp: _safe(math.cos),
    mathd.AbsFOp: abs,
    mathd.FloorOp: _safe(lambda x: float(math.floor(x))),
    mathd.CeilOp: _safe(lambda x: float(math.ceil(x))),
    mathd.ErfOp: math.erf,
    mathd.TanOp: _safe(math.tan),
    mathd.AtanOp: math.atan,
    mathd.AsinOp: _safe(math.asin),
    mathd.AcosOp: _safe(math.acos),
    mathd.SinhOp: _safe(math.sinh),
    mathd.CoshOp: _safe(math.cosh),
    mathd.AsinhOp: math.asinh,
    mathd.AcoshOp: _safe(math.acosh),
    mathd.AtanhOp: _safe(lambda x: math.copysign(math.inf, x) if abs(x) == 1 else math.atanh(x)),
    mathd.CbrtOp: lambda x: math.copysign(abs(x) ** (1.0 / 3.0), x) if math.isfinite(x) else x,
    mathd.TruncOp: lambda x: float(math.trunc(x)) if math.isfinite(x) else x,
    mathd.RoundOp: lambda x: (
        math.copysign(math.floor(abs(x) + 0.5), x) if math.isfinite(x) else x
    ),
    mathd.RoundEvenOp: lambda x: math.copysign(float(round(x)), x) if math.isfinite(x) else x,
}


def _powf(x: float, y: float) -> float:
    """IEEE pow (C99 Annex F) where Python raises: 0**-y -> inf, x<0 ** non-integer
    -> NaN, overflow -> inf."""
    try:
        r = math.pow(x, y)
    except OverflowError:
        odd = float(y).is_integer() and int(y) % 2 == 1
        return -math.inf if (x < 0 and odd) else math.inf
    except ValueError:
        if x == 0:
            odd = float(y).is_integer() and int(y) % 2 == 1
            return math.copysign(math.inf, x) if odd else math.inf
        return math.nan
    return r


def _ipowi(base: int, exp: int, width: int) -> int:
    """math.ipowi: wrap-around power; a negative exponent gives 0 except for the
    bases 1 and -1 (MLIR's definition), and division by zero for base 0 (here 0)."""
    if exp < 0:
        if base == 1:
            return 1
        if base == -1:
            return -1 if exp % 2 else 1
        return 0
    return wrap_int(pow(base, exp, 1 << width), width)


def _maxnum(x: float, y: float) -> float:
    if math.isnan(x):
        return y
    if math.isnan(y):
        return x
    return max(x, y)


def _minnum(x: float, y: float) -> float:
    if math.isnan(x):
        return y
    if math.isnan(y):
        return x
    return min(x, y)


def _divf(x: float, y: float) -> float:
    if y == 0:
        if x == 0 or math.isnan(x):
            return math.nan
        return math.copysign(math.inf, x) * math.copysign(1.0, y)
    return x / y


def _unsigned(x: int, width: int) -> int:
    return x & ((1 << width) - 1)


#: arith::AtomicRMWKind number -> (old, value, width) -> new, for integer memref.atomic_rmw
_INT_ATOMICS = {
    1: lambda a, b, w: a + b,  # addi
    2: lambda a, b, w: a & b,  # andi
    3: lambda a, b, w: b,  # assign
    6: lambda a, b, w: max(a, b),  # maxs
    7: lambda a, b, w: max(_unsigned(a, w), _unsigned(b, w)),  # maxu
    10: lambda a, b, w: min(a, b),  # mins
    11: lambda a, b, w: min(_unsigned(a, w), _unsigned(b, w)),  # minu
    13: lambda a, b, w: a * b,  # muli
    14: lambda a, b, w: a | b,  # ori
    15: lambda a, b, w: a ^ b,  # xori
}


class UpstreamFunctions(InterpreterFunctions):
    # -- memref.atomic_rmw: addf (channel-program gradients) and the integer kinds a
    # multi-block protocol uses (ticket counters, status flags); the interpreter and the
    # GPU simulator run one op at a time, so each is a plain read-modify-write
    @impl(memref.AtomicRMWOp)
    def run_atomic_rmw(self, interpreter: Interpreter, op: memref.AtomicRMWOp, args: PythonValues):
        value, buf, *idx = args
        old = buf.load(tuple(idx))
        kind = op.kind.value.data
        if kind == 0:
            new = round_to(op.result.type, old + value)
        elif kind in _INT_ATOMICS:
            width = op.result.type.width.data  # type: ignore[attr-defined]
            new = wrap_int(_INT_ATOMICS[kind](old, value, width), width)
        else:
            raise NotImplementedError(f"memref.atomic_rmw kind {kind} (addf and integer kinds only)")
        buf.store(tuple(idx), new)
        return (old,)

    # -- float arithmetic, rounded to the result type -------------------------------
    @impl(arith.AddfOp)
    def run_addf(self, interpreter: Interpreter, op: arith.AddfOp, args: PythonValues):
        return _result(op, args[0] + args[1])

    @impl(arith.SubfOp)
    def run_subf(self, interpreter: Interpreter, op: arith.SubfOp, args: PythonValues):
        return _result(op, args[0] - args[1])

    @impl(arith.MulfOp)
    def run_mulf(self, interpreter: Interpreter, op: arith.MulfOp, args: PythonValues):
        return _result(op, args[0] * args[1])

    @impl(arith.DivfOp)
    def run_divf(self, interpreter: Interpreter, op: arith.DivfOp, args: PythonValues):
        return _result(op, _divf(args[0], args[1]))

    @impl(arith.NegfOp)
    def run_negf(self, interpreter: Interpreter, op: arith.NegfOp, args: PythonValues):
        return (-args[0],)

    @impl(arith.MaxnumfOp)
    def run_maxnumf(self, interpreter: Interpreter, op: Operation, args: PythonValues):
        return (_maxnum(args[0], args[1]),)

    @impl(arith.MinnumfOp)
    def run_minnumf(self, interpreter: Interpreter, op: Operation, args: PythonValues):
        return (_minnum(args[0], args[1]),)

    @impl(mathd.FmaOp)
    def run_fma(self, interpreter: Interpreter, op: mathd.FmaOp, args: PythonValues):
        a, b, c = args
        return _result(op, math.fma(a, b, c) if hasattr(math, "fma") else a * b + c)

    @impl(mathd.PowFOp)
    def run_powf(self, interpreter: Interpreter, op: Operation, args: PythonValues):
        return _result(op, _powf(args[0], args[1]))

    @impl(mathd.FPowIOp)
    def run_fpowi(self, interpreter: Interpreter, op: Operation, args: PythonValues):
        return _result(op, _powf(args[0], float(args[1])))

    @impl(mathd.IPowIOp)
    def run_ipowi(self, interpreter: Interpreter, op: Operation, args: PythonValues):
        t = op.results[0].type
        width = t.width.data if isinstance(t, IntegerType) else 64
        return (_ipowi(int(args[0]), int(args[1]), width),)

    @impl(mathd.Atan2Op)
    def run_atan2(self, interpreter: Interpreter, op: Operation, args: PythonValues):
        return _result(op, math.atan2(args[0], args[1]))

    @impl(mathd.CopySignOp)
    def run_copysign(self, interpreter: Interpreter, op: Operation, args: PythonValues):
        return _result(op, math.copysign(args[0], args[1]))

    @impl(mathd.AbsIOp)
    def run_absi(self, interpreter: Interpreter, op: Operation, args: PythonValues):
        return _result(op, abs(args[0]))  # wraps: abs(INT_MIN) == INT_MIN

    # -- conversions ---------------------------------------------------------------
    @impl(arith.ExtFOp)
    def run_extf(self, interpreter: Interpreter, op: arith.ExtFOp, args: PythonValues):
        return (args[0],)

    @impl(arith.TruncFOp)
    def run_truncf(self, interpreter: Interpreter, op: Operation, args: PythonValues):
        return _result(op, args[0])

    @impl(arith.SIToFPOp)
    def run_sitofp(self, interpreter: Interpreter, op: Operation, args: PythonValues):
        return _result(op, float(args[0]))

    @impl(arith.FPToSIOp)
    def run_fptosi(self, interpreter: Interpreter, op: Operation, args: PythonValues):
        return _result(op, int(args[0]))

    @impl(arith.ExtSIOp)
    def run_extsi(self, interpreter: Interpreter, op: Operation, args: PythonValues):
        return _result(op, args[0])

    @impl(arith.TruncIOp)
    def run_trunci(self, interpreter: Interpreter, op: Operation, args: PythonValues):
        return _result(op, args[0])

    @impl(arith.DivUIOp)
    def run_divui(self, interpreter: Interpreter, op: Operation, args: PythonValues):
        t = op.results[0].type
        width = t.width.data if isinstance(t, IntegerType) else 64
        mask = (1 << width) - 1
        return _result(op, (args[0] & mask) // (args[1] & mask))

    @impl(arith.RemUIOp)
    def run_remui(self, interpreter: Interpreter, op: Operation, args: PythonValues):
        t = op.results[0].type
        width = t.width.data if isinstance(t, IntegerType) else 64
        mask = (1 << width) - 1
        return _result(op, (args[0] & mask) % (args[1] & mask))

    @impl(arith.MaxSIOp)
    def run_maxsi(self, interpreter: Interpreter, op: Operation, args: PythonValues):
        return (max(args[0], args[1]),)

    @impl(arith.MinSIOp)
    def run_minsi(self, interpreter: Interpreter, op: Operation, args: PythonValues):
        return (min(args[0], args[1]),)

    @impl(arith.MaxUIOp)
    def run_maxui(self, interpreter: Interpreter, op: Operation, args: PythonValues):
        mask = _mask(op)
        return _result(op, max(args[0] & mask, args[1] & mask))

    @impl(arith.MinUIOp)
    def run_minui(self, interpreter: Interpreter, op: Operation, args: PythonValues):
        mask = _mask(op)
        return _result(op, min(args[0] & mask, args[1] & mask))

    @impl(arith.CeilDivUIOp)
    def run_ceildivui(self, interpreter: Interpreter, op: Operation, args: PythonValues):
        mask = _mask(op)
        x, y = args[0] & mask, args[1] & mask
        return _result(op, -(-x // y))

    @impl(arith.CeilDivSIOp)
    def run_ceildivsi(self, interpreter: Interpreter, op: Operation, args: PythonValues):
        x, y = args
        q = abs(x) // abs(y)
        if (x % y != 0) and ((x < 0) == (y < 0)):
            q += 1
        return _result(op, q if (x < 0) == (y < 0) else -q)

    @impl(arith.ShRUIOp)
    def run_shrui(self, interpreter: Interpreter, op: Operation, args: PythonValues):
        return _result(op, (args[0] & _mask(op)) >> args[1])

    @impl(arith.UIToFPOp)
    def run_uitofp(self, interpreter: Interpreter, op: Operation, args: PythonValues):
        t = op.operands[0].type
        width = t.width.data if isinstance(t, IntegerType) else 64
        return _result(op, float(args[0] & ((1 << width) - 1)))

    # -- memref -------------------------------------------------------------------
    @impl(memref.AllocOp)
    def run_alloc(self, interpreter: Interpreter, op: memref.AllocOp, args: PythonValues):
        return _allocate(interpreter, op, args)  # xDSL's own ignores dynamic sizes

    @impl(memref.AllocaOp)
    def run_alloca(self, interpreter: Interpreter, op: memref.AllocaOp, args: PythonValues):
        return _allocate(interpreter, op, args)

    @impl(memref.DimOp)
    def run_dim(self, interpreter: Interpreter, op: memref.DimOp, args: PythonValues):
        array, index = args
        return (array.shape[index],)

    @impl(memref.CopyOp)
    def run_copy(self, interpreter: Interpreter, op: memref.CopyOp, args: PythonValues):
        src, dst = args
        for idx in src.indices():
            dst.store(idx, src.load(idx))
        return ()

    @impl(memref.CastOp)
    def run_cast(self, interpreter: Interpreter, op: memref.CastOp, args: PythonValues):
        return (args[0],)


def _mask(op: Operation) -> int:
    t = op.results[0].type
    return (1 << (t.width.data if isinstance(t, IntegerType) else 64)) - 1


def _allocate(interpreter: Interpreter, op, args: PythonValues) -> PythonValues:
    """A zero-filled buffer for memref.alloc/alloca, dynamic sizes taken from `args`."""
    t = op.memref.type
    dyn = iter(args)
    shape = [next(dyn) if d == DYNAMIC_INDEX else d for d in t.get_shape()]
    el = t.get_element_type()
    if isinstance(el, ComplexType):
        from scanweaver.interp.complex_impls import ComplexStorage

        xtype = ComplexStorage(el)
    else:
        xtype = xtype_for_el_type(el, interpreter.index_bitwidth)
    return (ShapedArray(TypedPtr[Any].zeros(math.prod(shape), xtype=xtype), shape),)


def _unary_math_impl(op_type, fn):
    def run(self, interpreter: Interpreter, op: Operation, args: PythonValues):
        return _result(op, fn(args[0]))

    return impl(op_type)(run)


# One method per unary math op, generated from the table above; then register all.
for _op_type, _fn in _UNARY_MATH.items():
    setattr(
        UpstreamFunctions,
        f"run_{_op_type.name.replace('.', '_')}",
        _unary_math_impl(_op_type, _fn),
    )
UpstreamFunctions = register_impls(UpstreamFunctions)
