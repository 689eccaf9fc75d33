"""`stages_for(text=...)` / `lower(skip_idle=True)` (what `compiler.build_cpu` runs):
the stages that can find nothing to rewrite in the input are left out, and the lowered
IR is the same as with every stage."""

from __future__ import annotations

from pathlib import Path

import pytest

from scanweaver.compiler import lower
from scanweaver.rewrites.pipeline import stages_for
from scanweaver.runtime.cpu_scan import _affine_options
from scanweaver.runtime.kernel_ir import kernel_ir

FILECHECK = Path(__file__).resolve().parent.parent / "filecheck"
ALL = {"scanweaver-raise", "scan-pairs-to-complex", "scan-complex-affine-to-loops", "scan-complex-to-real"}


def _inputs():
    yield "affine f32", kernel_ir("affine", **_affine_options("f32", 2, True, True, False)).text, ALL
    yield "affine complex", kernel_ir("affine", **_affine_options("complex<f32>", 2, False, False, True)).text, {
        "scanweaver-raise", "scan-pairs-to-complex"}
    for name in ("pair.mlir", "iter_arg.mlir"):  # loops to raise, (re, im) pairs, complex states
        yield name, (FILECHECK / "complex" / name).read_text(), set()


@pytest.mark.parametrize("target", ["loops", "cpu"])
def test_idle_stages_left_out_and_the_same_ir(target):
    full = [s.name for s in stages_for(target)]
    for what, text, idle in _inputs():
        kept = [s.name for s in stages_for(target, text=text)]
        assert kept == [n for n in full if n not in idle], what
        plain = lower(text, target, keep_stages=False, cleanup=False).text
        assert lower(text, target, keep_stages=False, cleanup=False, skip_idle=True).text == plain, what


def test_the_gpu_target_keeps_every_stage():
    text = kernel_ir("affine", **_affine_options("f32", 2, False, False, False)).text
    assert [s.name for s in stages_for("gpu", text=text)] == [s.name for s in stages_for("gpu")]
