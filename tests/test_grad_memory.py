"""Peak memory of ScanWeaver's forward + backward (benchmark helper `grad_memory`):
O(batch x D x L), never a (batch, D, L, N) array."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install '.[test]')")

from scanweaver.bench import grad_memory  # noqa: E402

# N = 16 and the full options: the kernels the benchmark compiles (disk cache)
PARAMS = {"batch": 1, "D": 64, "N": 16, "L": 4096, "with_D": True, "with_z": True,
          "with_delta_bias": True, "delta_softplus": True, "bc": "shared"}


def test_scanweaver_forward_backward_memory_is_linear_in_batch_d_l():
    m = grad_memory.measure("scanweaver-cpu", PARAMS, timeout_s=300)
    assert m["status"] == "ok", m
    unit = grad_memory.problem_bytes(PARAMS)  # one (batch, D, L) float32 array: 1 MiB
    # inputs' gradients (u, delta, z), the cotangent copy and scratch outputs: a few
    # units; one (batch, D, L, N) array would be 16 on its own
    assert 3 * unit <= m["numpy_traced_peak_bytes"] <= 10 * unit, m
    assert 0 <= m["extra_bytes"] <= 12 * unit, m
    text = grad_memory.readme_section({"cases": [{"label": "x", "params": PARAMS,
                                                  "peak_memory": {"scanweaver-cpu": m}}]})
    assert "| x | scanweaver-cpu |" in text

