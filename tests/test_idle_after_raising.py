"""`compiler.lower(skip_idle=True)` on IR with loops to raise: raising runs first, then
the stages with nothing to do on the raised module are left out (`pipeline.
idle_after_raising`), and the lowered IR is the same as with every stage."""

from __future__ import annotations

from pathlib import Path

import pytest

from scanweaver.compiler import lower
from scanweaver.ir import make_context, parse_ir
from scanweaver.rewrites.pipeline import idle_after_raising
from scanweaver.rewrites.raise_affine import RaiseRecurrences
from scanweaver.runtime.kernel_ir import kernel_ir
from scanweaver.workloads.specs import SelectiveScanSpec

FILECHECK = Path(__file__).resolve().parent.parent / "filecheck"
COMPLEX = {"scan-complex-affine-to-loops", "scan-complex-to-real"}


def _raised(text: str):
    module = parse_ir(text)
    RaiseRecurrences().apply(make_context(), module)
    return module


def _selective(n: int = 4) -> str:
    spec = SelectiveScanSpec(n, "shared", "shared", True, True, False, True, False, True)
    return kernel_ir("selective_tiled", spec=spec, scalef=False).text


def test_a_raised_real_kernel_leaves_the_pair_and_complex_stages_out():
    text = _selective()
    assert "scf.for" in text and "complex" not in text
    assert idle_after_raising(_raised(text)) == {"scan-pairs-to-complex", *COMPLEX}


@pytest.mark.parametrize("name", ["pair.mlir", "iter_arg.mlir"])
def test_pairs_or_complex_values_keep_their_stages(name):
    text = (FILECHECK / "complex" / name).read_text()
    idle = idle_after_raising(_raised(text))
    assert not idle & COMPLEX, name


def test_a_complex_type_only_in_a_signature_is_seen():
    text = ("func.func @f(%m: memref<4xcomplex<f32>>) {\n"
            "  %c0 = arith.constant 0 : index\n  %c4 = arith.constant 4 : index\n  %c1 = arith.constant 1 : index\n"
            "  scf.for %i = %c0 to %c4 step %c1 {\n  }\n  func.return\n}\n")
    assert idle_after_raising(_raised(text)) == {"scan-pairs-to-complex"}


@pytest.mark.parametrize("target", ["loops", "cpu"])
def test_the_same_ir_with_and_without_skipping(target):
    for text in (_selective(), (FILECHECK / "complex" / "pair.mlir").read_text(),
                 (FILECHECK / "complex" / "iter_arg.mlir").read_text()):
        plain = lower(text, target, keep_stages=False, cleanup=False).text
        assert lower(text, target, keep_stages=False, cleanup=False, skip_idle=True).text == plain


def test_the_stages_kept_are_recorded_in_order():
    stages = [s.name for s in lower(_selective(), "cpu", keep_stages=True, cleanup=False, skip_idle=True).stages]
    assert stages[:2] == ["input", "scanweaver-raise"]
    assert not {"scan-pairs-to-complex", *COMPLEX} & set(stages)


COLD_SELECTIVE = """
import json, sys
import numpy as np, scanweaver as sw
rng = np.random.default_rng(0)
u, dl = rng.standard_normal((1, 8, 64)).astype(np.float32), rng.uniform(0, .1, (1, 8, 64)).astype(np.float32)
A = -rng.uniform(.5, 2, (8, 4)).astype(np.float32)
B, C = rng.standard_normal((1, 4, 64)).astype(np.float32), rng.standard_normal((1, 4, 64)).astype(np.float32)
y = sw.selective_scan(u, dl, A, B, C)
print(json.dumps({"finite": bool(np.isfinite(y).all()), "complex": "xdsl.dialects.complex" in sys.modules}))
"""


def test_a_cold_real_selective_call_imports_no_complex_dialect(tmp_path):
    """The raise and the lowering of a real kernel never touch complex ops: the complex
    dialect's import (about 40 ms of a cold first call, `python -X importtime`) is left
    to the kernels that have them."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, SCANWEAVER_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", COLD_SELECTIVE], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"finite": True, "complex": False}
