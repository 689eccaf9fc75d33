"""Python error conventions (issue 10, item 11): every bad argument raises a
ScanWeaverError that is also a ValueError (values, shapes) or a TypeError (types,
dtypes, missing or non-array arguments), with a message that names the argument.
"""

from __future__ import annotations

import numpy as np
import pytest

import scanweaver
from scanweaver.errors import ScanWeaverError, ScanWeaverTypeError, ScanWeaverValueError

F = np.float32
A2 = np.full((2, 3), 0.5, F)


def _ls(**change):
    kwargs = dict(a=A2, b=A2)
    kwargs.update(change)
    return lambda: scanweaver.linear_scan(**kwargs)


# (case, call, expected class, text the message must contain)
LINEAR = [
    ("a None", _ls(a=None), TypeError, "'a'"),
    ("b None", _ls(b=None), TypeError, "'b'"),
    ("a str", _ls(a="abc"), TypeError, "'a'"),
    ("b str", _ls(b="abc"), TypeError, "'b'"),
    ("a object", _ls(a=object()), TypeError, "'a'"),
    ("complex a, int b", _ls(a=A2 * 1j, b=np.ones((2, 3), np.int32)), TypeError, "'b'"),
    ("complex a, h0 too wide", _ls(a=A2 * 1j, b=A2 * 1j, h0=np.ones(2)), TypeError, "'h0'"),
    ("a bool", _ls(a=A2 > 0, b=A2 > 0), TypeError, "'a'"),
    ("a ragged", _ls(a=[[1.0, 2.0], [3.0]]), ValueError, "'a'"),
    ("scalars", _ls(a=5.0, b=5.0), ValueError, "'a'"),
    ("b shape", _ls(b=np.ones((2, 4), F)), ValueError, "'b'"),
    ("b dtype", _ls(b=A2.astype(np.float64)), TypeError, "'b'"),
    ("h0 str", _ls(h0="abc"), TypeError, "'h0'"),
    ("h0 None in list", _ls(h0=[None, 1.0]), TypeError, "'h0'"),
    ("h0 shape", _ls(h0=np.ones(3, F)), ValueError, "'h0'"),
    ("h0 list shape", _ls(h0=[1.0, 2.0, 3.0]), ValueError, "'h0'"),
    ("h0 float64 array", _ls(h0=np.ones(2)), TypeError, "'h0'"),
    ("h0 overflow", _ls(h0=[1e300, 0.0]), ValueError, "'h0'"),
    ("h0 float for int", _ls(a=np.ones((2, 3), np.int32), b=np.ones((2, 3), np.int32), h0=[1.5, 2]), TypeError, "'h0'"),
    ("h0 int overflow", _ls(a=np.ones((2, 3), np.int32), b=np.ones((2, 3), np.int32), h0=[2**40, 2]), ValueError, "'h0'"),
    ("axis str", _ls(axis="1"), TypeError, "axis"),
    ("axis None", _ls(axis=None), TypeError, "axis"),
    ("axis float", _ls(axis=1.0), TypeError, "axis"),
    ("axis range", _ls(axis=5), ValueError, "axis"),
    ("reverse str", _ls(reverse="yes"), TypeError, "reverse"),
    ("reverse None", _ls(reverse=None), TypeError, "reverse"),
    ("final str", _ls(return_final_state="x"), TypeError, "return_final_state"),
    ("backend name", _ls(backend="tpu"), ValueError, "backend"),
    ("backend int", _ls(backend=3), TypeError, "backend"),
    ("backend None", _ls(backend=None), TypeError, "backend"),
]


def _ok_selective():
    rng = np.random.default_rng(0)
    return dict(
        u=rng.standard_normal((1, 4, 6)).astype(F),
        delta=rng.standard_normal((1, 4, 6)).astype(F),
        A=-np.ones((4, 3), F),
        B=np.ones((4, 3), F),
        C=np.ones((4, 3), F),
    )


def _ss(**change):
    kwargs = _ok_selective()
    kwargs.update(change)
    return lambda: scanweaver.selective_scan(**kwargs)


SELECTIVE = [
    *[(f"{n} None", _ss(**{n: None}), TypeError, f"'{n}'") for n in ("u", "delta", "A", "B", "C")],
    *[
        (f"{n} str", _ss(**{n: "abc"}), TypeError, f"'{n}'")
        for n in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "initial_state")
    ],
    *[
        (f"{n} scalar", _ss(**{n: 1.0}), ValueError, f"'{n}'")
        for n in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "initial_state")
    ],
    *[
        (f"{n} int dtype", _ss(**{n: np.ones(s, np.int32)}), TypeError, f"'{n}'")
        for n, s in (("u", (1, 4, 6)), ("A", (4, 3)), ("D", (4,)), ("initial_state", (1, 4, 3)))
    ],
    ("u rank", _ss(u=np.ones((4, 6), F)), ValueError, "'u'"),
    ("delta shape", _ss(delta=np.ones((1, 4, 5), F)), ValueError, "'delta'"),
    ("A shape", _ss(A=np.ones((3, 3), F)), ValueError, "'A'"),
    ("B shape", _ss(B=np.ones((4, 2), F)), ValueError, "'B'"),
    ("C ragged", _ss(C=[[1.0], [1.0, 2.0]]), ValueError, "'C'"),
    ("D shape", _ss(D=np.ones(5, F)), ValueError, "'D'"),
    ("z list shape", _ss(z=[[1.0]]), ValueError, "'z'"),
    ("initial_state shape", _ss(initial_state=np.ones((1, 4, 2), F)), ValueError, "'initial_state'"),
    ("softplus str", _ss(delta_softplus="yes"), TypeError, "delta_softplus"),
    ("last state int", _ss(return_last_state=1), TypeError, "return_last_state"),
    ("backend name", _ss(backend="gpu"), ValueError, "backend"),
    ("backend None", _ss(backend=None), TypeError, "backend"),
]

PROGRAM_IR = """
func.func @fill(%x: memref<?xf32>, %v: f32) {
  %c0 = arith.constant 0 : index
  memref.store %v, %x[%c0] : memref<?xf32>
  func.return
}
func.func @seti(%x: memref<4xi32>, %v: i32) {
  %c0 = arith.constant 0 : index
  memref.store %v, %x[%c0] : memref<4xi32>
  func.return
}
"""


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    try:
        yield scanweaver.compile(PROGRAM_IR, target="cpu")
    finally:
        mp.undo()


def program_cases(p):
    x = np.zeros(3, F)
    i4 = np.zeros(4, np.int32)
    read_only = np.zeros(3, F)
    read_only.flags.writeable = False
    return [
        ("too few", lambda: p.fill(x), TypeError, "fill"),
        ("too many", lambda: p.fill(x, 1.0, 2.0), TypeError, "fill"),
        ("array str", lambda: p.fill("abc", 1.0), TypeError, "argument 0 of fill"),
        ("array None", lambda: p.fill(None, 1.0), TypeError, "argument 0 of fill"),
        ("array list", lambda: p.fill([0.0, 0.0], 1.0), TypeError, "argument 0 of fill"),
        ("array dtype", lambda: p.fill(np.zeros(3), 1.0), TypeError, "argument 0 of fill"),
        ("array rank", lambda: p.fill(np.zeros((3, 1), F), 1.0), ValueError, "argument 0 of fill"),
        ("read-only", lambda: p.fill(read_only, 1.0), ValueError, "argument 0 of fill"),
        ("negative strides", lambda: p.fill(np.zeros(4, F)[::-1], 1.0), ValueError, "argument 0 of fill"),
        ("static size", lambda: p.seti(np.zeros(5, np.int32), 1), ValueError, "argument 0 of seti"),
        ("scalar str", lambda: p.fill(x, "abc"), TypeError, "argument 1 of fill"),
        ("scalar None", lambda: p.fill(x, None), TypeError, "argument 1 of fill"),
        ("scalar array", lambda: p.fill(x, np.ones(2)), TypeError, "argument 1 of fill"),
        ("int from float", lambda: p.seti(i4, 1.5), TypeError, "argument 1 of seti"),
        ("int overflow", lambda: p.seti(i4, 2**40), ValueError, "argument 1 of seti"),
        ("no function", lambda: p.nothing, AttributeError, "@nothing"),
        ("no stage", lambda: p.stage_ir("nope"), ValueError, "'nope'"),
    ]


COMPILE = [
    ("text int", lambda: scanweaver.compile(123), TypeError, "MLIR text"),
    ("text None", lambda: scanweaver.compile(None), TypeError, "MLIR text"),
    ("text garbage", lambda: scanweaver.compile("func.func @f( {"), ValueError, "cannot parse"),
    ("unregistered op", lambda: scanweaver.compile('"bogus.op"() : () -> ()'), ValueError, "bogus.op"),
    ("target name", lambda: scanweaver.compile("", target="tpu"), ValueError, "target"),
    ("target None", lambda: scanweaver.compile("", target=None), TypeError, "target"),
]


def _check(case, call, kind, text):
    with pytest.raises(Exception) as info:
        call()
    e = info.value
    assert isinstance(e, ScanWeaverError), f"{case}: {type(e).__name__}: {e}"
    assert isinstance(e, kind), f"{case}: {type(e).__name__} is not a {kind.__name__}: {e}"
    if kind is ValueError:
        assert isinstance(e, ScanWeaverValueError) and not isinstance(e, TypeError), case
    if kind is TypeError:
        assert isinstance(e, ScanWeaverTypeError) and not isinstance(e, ValueError), case
    assert text in str(e), f"{case}: message does not name {text}: {e}"
    if not str(e).startswith("cannot parse"):  # parse errors quote the source around the error
        assert "\n" not in str(e).strip(), f"{case}: one line: {e}"


@pytest.mark.parametrize("case,call,kind,text", LINEAR + SELECTIVE + COMPILE, ids=lambda v: v if isinstance(v, str) else "")
def test_api_errors_are_value_or_type_errors(case, call, kind, text):
    _check(case, call, kind, text)


def test_compiled_program_errors_are_value_or_type_errors(program):
    for case, call, kind, text in program_cases(program):
        if kind is AttributeError:  # NoSuchFunctionError: hasattr() works on programs
            with pytest.raises(AttributeError, match=text):
                call()
        else:
            _check(case, call, kind, text)
    x = np.zeros(4, F)
    with pytest.raises(ValueError, match=r"@fill: arguments #0 and #1 overlap"):
        scanweaver.compile(PROGRAM_IR.replace("%v: f32", "%y: memref<?xf32>, %v: f32")).fill(x, x[1:], 1.0)
    program.fill(x, np.float32(2.5))  # the good calls still work
    assert x[0] == 2.5


def test_except_value_error_and_type_error_catch_everything():
    """The point of the convention: plain `except (ValueError, TypeError)` suffices."""
    caught = 0
    for case, call, kind, _ in LINEAR + SELECTIVE + COMPILE:
        try:
            call()
        except (ValueError, TypeError):
            caught += 1
    assert caught == len(LINEAR + SELECTIVE + COMPILE)


def test_interpreter_errors():
    from scanweaver.interp.run import run_function

    ir = PROGRAM_IR
    x = np.zeros(3, F)
    for call, kind, text in (
        (lambda: run_function(ir, "nope", x, 1.0), ValueError, "@nope"),
        (lambda: run_function(ir, "fill", x), TypeError, "@fill"),
        (lambda: run_function(ir, "fill", "abc", 1.0), TypeError, "#0 of @fill"),
        (lambda: run_function(ir, "fill", np.zeros(3), 1.0), TypeError, "#0 of @fill"),
        (lambda: run_function(ir, "seti", np.zeros(5, np.int32), 1), ValueError, "#0 of @seti"),
    ):
        _check(text, call, kind, text)


def test_h0_takes_the_array_likes_a_and_b_take():
    a = np.full((2, 5), 0.5, F)
    b = np.ones((2, 5), F)
    want = scanweaver.linear_scan(a, b, np.array([1.0, 2.0], F))
    for h0 in ([1.0, 2.0], (1, 2), np.array([1, 2], np.int16), [np.float32(1), 2.0]):
        got = scanweaver.linear_scan(a, b, h0)
        assert got.dtype == F and np.array_equal(got, want), h0
    # One value for every channel (a 0-d h0), as a Python or a numpy scalar.
    same = scanweaver.linear_scan(a, b, np.full(2, 3.0, F))
    for h0 in (3.0, 3, np.float32(3.0)):
        assert np.array_equal(scanweaver.linear_scan(a, b, h0), same), h0


def test_cuda_arguments_are_checked_before_the_device():
    """Host arguments of compiled CUDA programs (checked before any device call)."""
    pytest.importorskip("numba.cuda")
    from scanweaver.runtime.cuda import DeviceArguments

    for args, outputs, kind, text in (
        (["abc"], set(), TypeError, "argument #0"),
        ([None], set(), TypeError, "argument #0"),
        ([[[1.0], [1.0, 2.0]]], set(), ValueError, "argument #0"),
        ([[0.0, 0.0]], {0}, TypeError, "argument #0 is written by the kernel"),
    ):
        _check(text, lambda: DeviceArguments(None, args, outputs), kind, text)  # no driver: checked first
