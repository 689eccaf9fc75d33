"""The recurrence vectoriser's step buffers (`_RecurrenceVectorizer._step_buffers`):
the time-vectorised values a step reads (the selective scan's delta after softplus,
delta * u) are stored once per time block and read back by volatile loads, which x86
folds into broadcast operands.  The same bits as the vector.extract per step, for a
blocked run with a remainder."""

from __future__ import annotations

import numpy as np

from scanweaver.ir import make_context, parse_ir, print_ir
from scanweaver.rewrites import cpu_recurrence_vectorizer
from scanweaver.rewrites.exp_polynomial import rewrite_marked
from scanweaver.rewrites.scan_to_cpu import ScanToCpu
from scanweaver.runtime.cpu import CpuProgram
from scanweaver.runtime.cpu_jit import Kernel
from scanweaver.runtime.kernel_ir import kernel_ir
from scanweaver.toolchain.mlir import emit_c_interface, lower_to_llvm_ir
from scanweaver.workloads.specs import SelectiveScanSpec

SPEC = SelectiveScanSpec(16, "shared", "shared", True, True, True, True, True, True)


def vectorizer_program(switch: str, value: bool, monkeypatch) -> tuple[CpuProgram, str]:
    """The tiled selective kernel compiled with the vectorizer's class switch `switch` set to `value`."""
    monkeypatch.setattr(cpu_recurrence_vectorizer._RecurrenceVectorizer, switch, value)
    module = parse_ir(kernel_ir("selective_tiled", spec=SPEC).text)
    ScanToCpu().apply(make_context(), module)
    rewrite_marked(module)
    llvm_ir = lower_to_llvm_ir(print_ir(emit_c_interface(module)))
    return CpuProgram(llvm_ir), llvm_ir


def _program(step_buffers: bool, monkeypatch) -> tuple[CpuProgram, str]:
    return vectorizer_program("STEP_BUFFERS", step_buffers, monkeypatch)


def test_step_buffers_give_the_extracts_bits(monkeypatch):
    ir = kernel_ir("selective_tiled", spec=SPEC)
    (buffered, text_b), (extracted, text_e) = _program(True, monkeypatch), _program(False, monkeypatch)
    assert "load volatile" in text_b and "load volatile" not in text_e
    rng = np.random.default_rng(16)
    batch, D, N, L = 2, 5, 16, 3 * 16 + 7  # three blocks and a remainder
    u, z = (rng.standard_normal((batch, D, L)).astype(np.float32) for _ in range(2))
    delta = (0.5 * rng.standard_normal((batch, D, L))).astype(np.float32)
    A = (-np.exp(0.5 * rng.standard_normal((D, N)))).astype(np.float32)
    B, C = (rng.standard_normal((batch, N, L)).astype(np.float32) for _ in range(2))
    Dk, bias = rng.standard_normal(D).astype(np.float32), (0.1 * rng.standard_normal(D)).astype(np.float32)
    h0 = rng.standard_normal((batch, D, N)).astype(np.float32)
    results = []
    for program in (buffered, extracted):
        out, last = np.empty((batch, D, L), np.float32), np.empty((batch, D, N), np.float32)
        Kernel(program, ir.name, ir.args)(u, delta, A, B, C, Dk, z, bias, h0, out, last, 0, D)
        results.append((out, last))
    (out_b, last_b), (out_e, last_e) = results
    assert np.isfinite(out_b).all()
    assert out_b.tobytes() == out_e.tobytes() and last_b.tobytes() == last_e.tobytes()
