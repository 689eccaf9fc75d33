"""Input checks of the Python API: each bad argument gets one message naming it."""

from __future__ import annotations

import numpy as np
import pytest

import scanweaver
from scanweaver.errors import ScanWeaverError
from scanweaver.runtime.cuda import cuda_available

F = np.float32


def ok_selective(batch=1, dim=4, length=6, n=3):
    rng = np.random.default_rng(0)
    return dict(
        u=rng.standard_normal((batch, dim, length)).astype(F),
        delta=rng.standard_normal((batch, dim, length)).astype(F),
        A=-np.ones((dim, n), F),
        B=np.ones((dim, n), F),
        C=np.ones((dim, n), F),
    )


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(a=np.ones((2, 3), F), b=np.ones((2, 4), F)), r"argument 'b' has shape \(2, 4\); expected \(2, 3\)"),
        (dict(a=np.ones((2, 3), F), b=np.ones((2, 3), np.float64)), r"arguments 'a' \(float32\) and 'b' \(float64\) must have the same dtype"),
        (dict(a=np.ones((2, 3), np.uint8), b=np.ones((2, 3), np.uint8)), r"argument 'a' has dtype uint8"),
        (dict(a=np.ones((2, 3), F), b=np.ones((2, 3), F), axis=2), r"axis 2 is out of range for 2-dimensional inputs"),
        (dict(a=np.ones((2, 3), F), b=np.ones((2, 3), F), h0=np.ones(3, F)), r"argument 'h0' has shape \(3,\); expected \(2,\)"),
        (dict(a=np.float32(1), b=np.float32(1)), r"at least one dimension"),
        (dict(a=np.ones((2, 3), F), b=np.ones((2, 3), F), backend="tpu"), r"backend must be one of"),
        (dict(a="not an array", b=np.ones(2, F)), r"argument 'a' has dtype <U12"),
    ],
)
def test_linear_scan_rejects_bad_input(kwargs, message):
    with pytest.raises(ScanWeaverError, match=message):
        scanweaver.linear_scan(**kwargs)


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(u=np.ones((4, 6), F)), r"argument 'u' must have shape \(batch, D, L\)"),
        (dict(delta=np.ones((1, 4, 5), F)), r"argument 'delta' has shape \(1, 4, 5\); expected \(1, 4, 6\)"),
        (dict(A=np.ones((3, 3), F)), r"argument 'A' must have shape \(D, N\) = \(4, N\)"),
        (dict(B=np.ones((4, 2), F)), r"argument 'B' must have shape \(D, N\) = \(4, 3\), \(batch, N, L\) = \(1, 3, 6\)"),
        (dict(C=np.ones((1, 3, 3, 6), F)), r"argument 'C' \(grouped\) must have shape \(batch, G, N, L\)"),
        (dict(D=np.ones(5, F)), r"argument 'D' has shape \(5,\); expected \(4,\)"),
        (dict(z=np.ones((1, 4, 7), F)), r"argument 'z' has shape"),
        (dict(delta_bias=np.ones((4, 1), F)), r"argument 'delta_bias' has shape"),
        (dict(initial_state=np.ones((1, 4, 2), F)), r"argument 'initial_state' has shape \(1, 4, 2\); expected \(1, 4, 3\)"),
        (dict(u=np.ones((1, 4, 6), np.int32)), r"argument 'u' has dtype int32"),
    ],
)
def test_selective_scan_rejects_bad_input(change, message):
    kwargs = ok_selective()
    kwargs.update(change)
    with pytest.raises(ScanWeaverError, match=message):
        scanweaver.selective_scan(**kwargs)


def test_program_reports_unknown_function_and_stage():
    from scanweaver.api import Program

    prog = Program({"f": lambda: None}, [], "")
    with pytest.raises(ScanWeaverError, match=r"no function '@g' in the program \(have: f\)"):
        prog.g
    with pytest.raises(ScanWeaverError, match="no stage named 'raise'"):
        prog.stage_ir("raise")


def test_compile_rejects_unknown_target():
    with pytest.raises(ScanWeaverError, match="unknown target 'tpu'"):
        scanweaver.compile("func.func @f() { func.return }", target="tpu")


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(axis="1"), "axis must be an integer, got '1'"),
        (dict(axis=1.0), "axis must be an integer"),
        (dict(reverse="no"), "reverse must be True or False"),
        (dict(h0=np.full(2, 2.9)), "argument 'h0' has dtype float64, which does not fit the state dtype float32"),
    ],
)
def test_linear_scan_rejects_bad_options(kwargs, message):
    a = np.ones((2, 3), F)
    with pytest.raises(ScanWeaverError, match=message):
        scanweaver.linear_scan(a, a, **kwargs)


def test_selective_scan_rejects_zero_groups():
    kwargs = ok_selective()
    kwargs["B"] = np.ones((1, 0, 3, 6), F)
    with pytest.raises(ScanWeaverError, match=r"argument 'B' \(grouped\) must have shape"):
        scanweaver.selective_scan(**kwargs)


def test_mixed_host_and_device_arrays_are_rejected():
    class Fake:
        __cuda_array_interface__ = {"shape": (2, 3), "typestr": "<f4", "data": (0, False), "version": 3}

    with pytest.raises(ScanWeaverError, match="on the same device"):
        scanweaver.linear_scan(Fake(), np.ones((2, 3), F))


@pytest.mark.skipif(cuda_available(), reason="this machine has a GPU")
def test_gpu_selective_inputs_are_not_refused_for_their_form():
    """initial_state and mixed B/C layouts run on the GPU kernel too: without a GPU the
    only error is that CUDA is unavailable."""
    from scanweaver.errors import BackendUnavailableError

    kwargs = ok_selective()
    with pytest.raises(BackendUnavailableError, match="backend='cuda' is not available"):
        scanweaver.selective_scan(**kwargs, initial_state=np.zeros((1, 4, 3), F), backend="cuda")


def test_compile_rejects_non_text_and_program_attributes_behave():
    with pytest.raises(ScanWeaverError, match=r"compile\(\) takes MLIR text"):
        scanweaver.compile(123)
    from scanweaver.api import Program

    prog = Program({"f": lambda: None}, [], "")
    assert not hasattr(prog, "shape")
