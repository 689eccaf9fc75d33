"""examples/train_mamba_tiny.py on a small size: ScanWeaver's selective_scan_fn trains like
the PyTorch reference (same initial weights, same batches)."""

from __future__ import annotations

import importlib.util
import os

import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install '.[test]')")

EXAMPLE = os.path.join(os.path.dirname(__file__), os.pardir, "examples", "train_mamba_tiny.py")


def _example():
    spec = importlib.util.spec_from_file_location("train_mamba_tiny", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_loss_curves_agree_over_20_steps():
    lines = []
    ours, ref, t_ours, t_ref = _example().compare(
        steps=20, batch=4, length=12, vocab=6, d_model=8, layers=2, d_state=3, delay=2, lr=1e-2,
        log=lines.append)
    assert len(ours) == len(ref) == 20
    assert max(abs(a - b) for a, b in zip(ours, ref)) <= 1e-3
    assert min(ours[-5:]) < ours[0]  # it learns
    assert any(line.startswith("time per step") for line in lines)
