"""The recurrence vectoriser's blocked sums (`rewrites/cpu_blocked_sums.py`): the
selective VJP's adjoint scan reduces its two stored sums over the state a time block of
steps at a time (`TreeSums`) instead of one `vector.reduction` per step.  The same bits
as the per-step reduction, for chunks with whole blocks and a remainder; the plan is
found on the adjoint scan only (its stores are at `c - step`)."""

from __future__ import annotations

import numpy as np
import pytest

from scanweaver.bench import vjp_stages
from scanweaver.bench.harness import make_inputs, selective_grad_case
from scanweaver.dialects import scan
from scanweaver.ir import make_context, parse_ir
from scanweaver.rewrites import cpu_recurrence_vectorizer
from scanweaver.rewrites.cpu_blocked_sums import sums_plan
from scanweaver.rewrites.cpu_recurrence_vectorizer import TIME_BLOCK
from scanweaver.rewrites.grad import ScanweaverGrad

torch = pytest.importorskip("torch")

from scanweaver.torch import _kernels  # noqa: E402
from scanweaver.torch.selective import _arrays, _spec  # noqa: E402

KEYS = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")


def _case(D: int, L: int):
    inp = make_inputs(selective_grad_case(1, D, 16, L, True))
    t = [torch.from_numpy(inp[k]) for k in KEYS]
    return inp, _spec(16, t[3], t[4], True, True), _arrays(*t)[1]


def _gradients(blocked: bool, D: int, L: int, monkeypatch, tmp_path) -> list[np.ndarray]:
    """The VJP compiled with the switch set (its own disk cache: the cache key is the
    IR text, not the switch), run on all channels; the input gradients."""
    monkeypatch.setattr(cpu_recurrence_vectorizer._RecurrenceVectorizer, "BLOCKED_SUMS", blocked)
    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path / f"blocked{int(blocked)}"))
    inp, spec, arrs = _case(D, L)
    _, kernel = vjp_stages._kernel(spec, None)
    out, last = np.empty((1, D, L), np.float32), np.empty((1, D, 16), np.float32)
    shadows = [np.zeros_like(a) for a in arrs] + [inp["g"].copy(), np.zeros_like(last)]
    kernel(*arrs, out, last, 0, D, *shadows)
    return shadows[:-2]


@pytest.mark.parametrize("L", [2 * 64 + TIME_BLOCK + 5, 40])
def test_blocked_sums_give_the_per_step_bits(L, monkeypatch, tmp_path):
    blocked = _gradients(True, 3, L, monkeypatch, tmp_path)
    per_step = _gradients(False, 3, L, monkeypatch, tmp_path)
    assert all(np.isfinite(g).all() for g in blocked)
    assert any(np.abs(g).max() > 0 for g in blocked)
    for a, b in zip(blocked, per_step):
        assert a.tobytes() == b.tobytes()


def test_the_plan_is_the_adjoint_scans():
    _, spec, _ = _case(2, 64)
    module = parse_ir(_kernels.selective_ir(spec, False).text)
    ScanweaverGrad(chunk=_kernels.CHUNK).apply(make_context(), module)
    recurrences = [op for op in module.walk() if isinstance(op, scan.RecurrenceOp)]
    vectorizers = [cpu_recurrence_vectorizer._RecurrenceVectorizer(op, True) for op in recurrences]
    plans = [sums_plan(op, v.N, TIME_BLOCK, True, v.is_state_loop) for op, v in zip(recurrences, vectorizers)]
    found = [p for p in plans if p is not None]
    assert len(found) == 1 and found[0].reverse and len(found[0].stores) == 2
    # not without reassociation (the per-step reduction is then sequential: other bits)
    op, v = next((op, v) for op, v, p in zip(recurrences, vectorizers, plans) if p is not None)
    assert sums_plan(op, v.N, TIME_BLOCK, False, v.is_state_loop) is None
