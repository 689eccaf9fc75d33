"""`Kernel.bind_each` (runtime/cpu_jit.py): the calls `bind` makes, with the common
arguments converted once."""

import numpy as np
import pytest

from scanweaver.errors import ScanWeaverValueError
from scanweaver.runtime.cpu_scan import compile_cpu
from scanweaver.runtime.cpu_jit import Kernel
from scanweaver.workloads.scans import affine_scan_ir


@pytest.fixture(scope="module")
def kernel():
    text = affine_scan_ir(("?", "?"), 1, "f32", "f32", init=True, reverse=False, name="linear_scan")
    return Kernel(compile_cpu(text), "linear_scan", [2, 2, 1, 2])


def test_each_call_is_binds(kernel):
    rng = np.random.default_rng(0)
    a, b = rng.uniform(0.5, 1, (3, 50)).astype(np.float32), rng.standard_normal((3, 50)).astype(np.float32)
    h0 = rng.standard_normal(3).astype(np.float32)
    b2 = rng.standard_normal((3, 50)).astype(np.float32)
    outs = [np.empty_like(a) for _ in range(3)]
    calls = kernel.bind_each([a, b, h0, outs[0]], [{}, {3: outs[1], 1: b2}, {3: outs[2], 0: a[:, :20]}])
    for call in calls:
        call()
    for values, got in (([a, b, h0], outs[0]), ([a, b2, h0], outs[1]), ([a[:, :20], b, h0], outs[2])):
        expect = np.empty_like(values[0])
        kernel.bind(*values, expect)()
        np.testing.assert_array_equal(got[:, :expect.shape[1]], expect)


def test_checks_as_bind(kernel):
    a, h0 = np.ones((2, 8), np.float32), np.ones(2, np.float32)
    with pytest.raises(ScanWeaverValueError, match="takes 4 arguments"):
        kernel.bind_each([a, a, h0], [{}])
    kernel.bind_each([a, a, h0, a], [{}, {3: a[:, :4]}])  # fine
    with pytest.raises(ScanWeaverValueError, match="strides"):
        kernel.bind_each([a, a, h0, a], [{}, {3: a[:, ::2]}])
    with pytest.raises(ScanWeaverValueError, match="2-D"):
        kernel.bind_each([a, a, h0, a], [{3: a[0]}])
