"""The recurrence vectoriser's pipelined prologue (`_RecurrenceVectorizer.PIPELINED`):
each time block's time-vectorised values (the selective scan's softplus of delta,
delta * u, silu of z, D * u) are computed one block ahead, in the previous iteration of
the blocked loop, the first block's before the loop and only when there is one.

* the same bits as the prologue computed in its own block, for lengths with no block,
  one block, several blocks and a remainder;
* nothing is read past the arrays: rows that end at a page the process may not read
  (a short row with no block, and a remainder after the last block, whose next block
  is not loaded);
* the tiled kernel's stack buffers are cache-line aligned, and so is the output.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np

from scanweaver.runtime import cpu_scan
from scanweaver.runtime.cpu import CpuProgram
from scanweaver.runtime.cpu_jit import Kernel
from scanweaver.runtime.kernel_ir import kernel_ir
from scanweaver.workloads.specs import SelectiveScanSpec
from tests.test_recurrence_step_buffers import vectorizer_program

SPEC = SelectiveScanSpec(16, "shared", "shared", True, True, True, True, True, True)


def _program(pipelined: bool, monkeypatch) -> tuple[CpuProgram, str]:
    return vectorizer_program("PIPELINED", pipelined, monkeypatch)


def test_pipelined_prologue_gives_the_same_bits(monkeypatch):
    ir = kernel_ir("selective_tiled", spec=SPEC)
    (ahead, text_a), (own, text_o) = _program(True, monkeypatch), _program(False, monkeypatch)
    assert text_a != text_o
    rng = np.random.default_rng(23)
    batch, D, N = 2, 3, 16
    for L in (7, 16, 3 * 16 + 7, 5 * 16):  # no block, one, several and a remainder, several
        u, z = (rng.standard_normal((batch, D, L)).astype(np.float32) for _ in range(2))
        delta = (0.5 * rng.standard_normal((batch, D, L))).astype(np.float32)
        A = (-np.exp(0.5 * rng.standard_normal((D, N)))).astype(np.float32)
        B, C = (rng.standard_normal((batch, N, L)).astype(np.float32) for _ in range(2))
        Dk, bias = rng.standard_normal(D).astype(np.float32), (0.1 * rng.standard_normal(D)).astype(np.float32)
        h0 = rng.standard_normal((batch, D, N)).astype(np.float32)
        results = []
        for program in (ahead, own):
            out, last = np.empty((batch, D, L), np.float32), np.empty((batch, D, N), np.float32)
            Kernel(program, ir.name, ir.args)(u, delta, A, B, C, Dk, z, bias, h0, out, last, 0, D)
            results.append((out, last))
        (out_a, last_a), (out_o, last_o) = results
        assert np.isfinite(out_a).all(), L
        assert out_a.tobytes() == out_o.tobytes(), L
        assert last_a.tobytes() == last_o.tobytes(), L


_GUARDED = textwrap.dedent("""
    import ctypes, mmap, sys
    import numpy as np
    from scanweaver import selective_scan

    PAGE = mmap.PAGESIZE
    libc = ctypes.CDLL(None, use_errno=True)
    keep = []

    def guarded(x):
        # x's copy ending where a page the process may not read begins
        nbytes = x.nbytes
        pages = -(-nbytes // PAGE) + 1
        mm = mmap.mmap(-1, pages * PAGE)
        base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
        assert libc.mprotect(ctypes.c_void_p(base + (pages - 1) * PAGE), PAGE, 0) == 0
        y = np.frombuffer(mm, np.float32, x.size, (pages - 1) * PAGE - nbytes).reshape(x.shape)
        y[...] = x
        keep.append(mm)
        return y

    rng = np.random.default_rng(7)
    batch, D, N = 1, 3, 16
    for L in (7, 2 * 16 + 5):
        u, z = (rng.standard_normal((batch, D, L)).astype(np.float32) for _ in range(2))
        delta = (0.5 * rng.standard_normal((batch, D, L))).astype(np.float32)
        A = (-np.exp(0.5 * rng.standard_normal((D, N)))).astype(np.float32)
        B, C = (rng.standard_normal((batch, N, L)).astype(np.float32) for _ in range(2))
        Dk, bias = rng.standard_normal(D).astype(np.float32), rng.standard_normal(D).astype(np.float32)
        want = selective_scan(u, delta, A, B, C, Dk, z, bias, True)
        got = selective_scan(guarded(u), guarded(delta), A, B, C, Dk, guarded(z), bias, True)
        assert got.tobytes() == want.tobytes(), L
    print("ok")
""")


def test_rows_ending_at_an_unreadable_page_read_nothing_past_them():
    # the same kernel compiled here first, so the child takes it from the disk cache
    x = np.ones((1, 3, 7), np.float32)
    cpu_scan.selective_scan_cpu(x, x, -np.ones((3, 16), np.float32), np.ones((1, 16, 7), np.float32),
                                np.ones((1, 16, 7), np.float32), np.ones(3, np.float32), x,
                                np.ones(3, np.float32), True)
    done = subprocess.run([sys.executable, "-c", _GUARDED], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "ok", (done.returncode, done.stderr[-2000:])


def test_stack_buffers_and_output_are_cache_line_aligned():
    text = kernel_ir("selective_tiled", spec=SPEC).text
    allocas = [line for line in text.splitlines() if "memref.alloca" in line]
    assert allocas and all("alignment = 64" in line for line in allocas), allocas
    rng = np.random.default_rng(1)
    u = rng.standard_normal((1, 2, 40)).astype(np.float32)
    out = cpu_scan.selective_scan_cpu(u, np.abs(u), -np.ones((2, 16), np.float32),
                                      rng.standard_normal((1, 16, 40)).astype(np.float32),
                                      rng.standard_normal((1, 16, 40)).astype(np.float32))
    assert out.ctypes.data % 64 == 0


def test_state_update_kernel_of_the_compute_roofline():
    import pytest

    from scanweaver.errors import ScanWeaverTypeError, ScanWeaverValueError
    from scanweaver.runtime.cpu_selective_exp import state_update_kernel

    rng = np.random.default_rng(11)
    n = 64
    d, x = rng.uniform(0, 0.1, n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    a, h = -rng.uniform(0.5, 2, n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    want = h.astype(np.float64)
    for _ in range(3):
        want = np.exp(d.astype(np.float64) * a) * want + x
    update = state_update_kernel()
    update(d, a, x, h, 3)
    np.testing.assert_allclose(h, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ScanWeaverValueError, match="multiple of 16"):
        update(d[:10], a[:10], x[:10], h[:10])
    with pytest.raises(ScanWeaverTypeError, match="float32"):
        update(d.astype(np.float64), a, x, h)
