"""More loops people write (tests/gpu_loop_forms_more/, one function per file), through
raise -> scan-to-gpu -> the thread-block simulator against the interpreter on the
original loops at lengths 0, 1, 2, odd and over two tiles; then ptxas for sm_80 and
sm_90 with no spills, and the command line.  Among them the forms the GPU lowering
used to refuse: the first element set before a time loop from 1 (`y[c, 0] = h0`,
also reversed and with step 2), two recurrences in one channel loop (also in a 3-D
nest, the second reading the first's output), a sign-extended i8 input (xDSL's
`arith.extsi` had no Pure trait, so the raise took it for a side effect), one
sequence whose final state is scaled before it is stored (`seq_both`) and one whose
first element is set before its time loop from 1 (`seq_lb1`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from xdsl.dialects import func
from xdsl.dialects.builtin import MemRefType

from scanweaver import compiler
from scanweaver.cli import main
from scanweaver.dtypes import NUMPY_DTYPES
from scanweaver.interp.gpu_sim import simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import parse_ir
from scanweaver.toolchain.gpu_export import export_gpu, ptxas_available
from test_gpu_loop_forms import lower_forms

FORMS = Path(__file__).parent / "gpu_loop_forms_more"

# name -> the role of each argument: CL / LC (channel, time), L, C, BDL / BLD (3-D), 1 (one
# element), s (a scalar), n (the length as an index)
ROLES = {
    "cond_emit": "CL s CL", "masked_if": "CL CL s CL", "seq_lb1": "L L L", "lb2_step3": "CL CL CL", "ub_lm5": "CL CL CL", "chan_const_sub": "CL CL CL",
    "chan_step2": "CL CL CL",
    "emit_prev_index": "CL CL CL", "per_chan_a": "C CL CL", "two_nest_shared_value": "C CL CL CL",
    "add_then_mul": "CL s CL", "max_and_ema": "CL s CL CL", "cascade_two_loops": "CL s s CL CL",
    "affine_emit": "CL CL s s CL", "cascade": "CL s s CL", "chain": "CL CL CL CL",
    "chan_coef": "CL CL", "clamp_b": "CL CL s s CL", "cumsum_i32": "CL CL", "dim_other": "CL CL CL",
    "div_form": "CL CL CL", "ema_f64": "CL CL CL", "emit_f64": "CL s CL", "emit_old_and_new": "CL s CL",
    "emit_rev_index": "CL s CL", "exclusive": "CL s CL", "exp_decay": "CL CL CL", "fma_form": "CL s CL",
    "i32_scalar_ch": "CL s CL", "i64_cumsum_ch": "CL CL", "i8_ext_i32": "CL CL", "index_arg": "CL n s CL",
    "index_coef": "CL CL", "index_in_b": "CL s CL", "init_final_inplace": "CL CL C CL", "init_load": "CL CL C CL",
    "init_scalar": "CL s s CL", "lb1": "CL CL CL", "lb1_noinit": "CL CL CL", "lb1_rev": "CL CL CL",
    "lb1_step2": "CL CL CL", "neg_a": "CL s CL", "offset_in": "CL CL CL", "relu_b": "CL s CL",
    "reset_i32": "CL CL CL", "reset_i8": "CL CL s CL", "rev_step2": "CL CL CL", "scalar_f64": "CL s s CL",
    "select_a": "CL s s CL", "seq_both": "L s L 1", "seq_f64_final": "L L 1", "seq_i64": "L L s L",
    "static_shape": "CL CL CL",
    "sub_form": "CL s CL", "three_d": "BDL BDL BDL", "three_d_mid": "BLD BLD BLD", "time_outer": "LC LC C LC",
    "time_outer_iter": "LC LC LC", "two_in_nest_3d": "BDL s BDL BDL", "two_in_one_nest": "CL CL CL CL",
    "two_outputs": "CL s CL CL", "two_reads": "CL s s CL CL", "ub_lm1": "CL CL CL",
}
# forms that read or write the first elements outside the time loop need that many
SHORTEST = {"lb1": 1, "lb1_noinit": 1, "lb1_rev": 1, "lb1_step2": 2, "two_nest_shared_value": 1, "seq_lb1": 1}
LENGTHS = (0, 1, 2, 7, 19)  # the simulated tile is 4 threads x 2 items: 19 spans three
C = 3
TEXT = "\n".join((FORMS / f"{n}.mlir").read_text() for n in sorted(ROLES))


def _arg(role: str, t, L: int, rng, first: bool, wide: bool):
    if role == "n":
        return L
    el = str(t.element_type if isinstance(t, MemRefType) else t)
    dt = NUMPY_DTYPES[el]
    shape = t.get_shape() if isinstance(t, MemRefType) and t.has_static_shape() else {
        "CL": (C, L), "LC": (L, C), "L": (L,), "C": (C,), "BDL": (2, C, L), "BLD": (2, L, C), "s": (), "1": (1,)
    }[role]
    if dt.kind == "i":
        lo, hi = (np.iinfo(dt).min, np.iinfo(dt).max) if wide or dt.itemsize == 1 else (-5, 6)
        v = rng.integers(lo, hi, shape, dtype=np.int64 if dt.itemsize < 8 else dt).astype(dt)
    else:  # the first argument is a decay in (0.5, 0.95) where it is one
        v = (rng.uniform(0.5, 0.95, shape) if first else rng.uniform(-1, 1, shape)).astype(dt)
    return dt.type(v) if role == "s" else v


def _args(name: str, L: int) -> list:
    """Random arguments of `@name` for time length `L` (integer sums wrap around)."""
    fn = next(op for op in parse_ir((FORMS / f"{name}.mlir").read_text()).ops if isinstance(op, func.FuncOp))
    roles = ROLES[name].split()
    types = fn.function_type.inputs.data
    assert len(roles) == len(types), name
    rng = np.random.default_rng(L * 31 + len(name))
    return [_arg(r, t, L, rng, i == 0, wide="cumsum" in name) for i, (r, t) in enumerate(zip(roles, types))]


@pytest.fixture(scope="module")
def lowered():
    m, raised, left = lower_forms(TEXT)
    assert raised == set(ROLES), f"not raised: {set(ROLES) - raised}"
    assert left == {}, f"left for the sequential lowering: {left}"
    return m


@pytest.mark.parametrize("name", sorted(ROLES))
def test_form_runs_like_the_loops(lowered, name):
    lengths = (0,) if name == "static_shape" else [L for L in LENGTHS if L >= SHORTEST.get(name, 0)]
    loops = parse_ir((FORMS / f"{name}.mlir").read_text())
    for L in lengths:
        ref = _args(name, L)
        got = [a.copy() if isinstance(a, np.ndarray) else a for a in ref]
        run_function(loops, name, *ref)
        simulate_launch(lowered, name, *got)
        for r, g in zip(ref, got):
            if not isinstance(r, np.ndarray):
                continue
            if r.dtype.kind == "i":
                np.testing.assert_array_equal(g, r, err_msg=f"L={L}")
            else:
                np.testing.assert_allclose(g.astype(np.float64), r.astype(np.float64), rtol=2e-3, atol=2e-3,
                                           err_msg=f"L={L}")


def test_sign_extended_input_on_the_cpu():
    """The raise now takes `arith.extsi` (pure): the CPU build of the raised loop runs
    like the loop, bit for bit, with i8 inputs across their whole range."""
    import scanweaver

    text = (FORMS / "i8_ext_i32.mlir").read_text()
    x, want = _args("i8_ext_i32", 300)
    got = want.copy()
    run_function(parse_ir(text), "i8_ext_i32", x, want)
    scanweaver.compile(text, "cpu").i8_ext_i32(x, got)
    np.testing.assert_array_equal(got, want)
    assert x.min() < -100 and x.max() > 100


def test_wrapping_sums_are_checked():
    """The i32 cumsum's inputs are wide enough that its sums wrap (the test covers it)."""
    x = _args("cumsum_i32", 19)[0]
    assert np.abs(np.cumsum(x.astype(np.int64), axis=1)).max() > 2**31


@pytest.mark.skipif(not ptxas_available(), reason="ptxas not found on PATH: spills not checked")
@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
def test_every_form_assembles_without_spills(chip):
    out = export_gpu(compiler.lower(TEXT, "gpu", keep_stages=False).module, chip)
    kernels = {k.split("_kernel")[0] for k in out["ptxas"]}
    assert len(out["ptxas"]) >= len(ROLES), sorted(kernels)
    for kernel, f in out["ptxas"].items():
        assert f["spill_stores"] == 0 and f["spill_loads"] == 0, (chip, kernel, f)


CLI_FORMS = ["lb1", "lb1_rev", "two_in_one_nest", "two_in_nest_3d", "i8_ext_i32", "chain", "seq_both", "seq_lb1",
             "two_nest_shared_value"]


@pytest.mark.parametrize("name", CLI_FORMS)
def test_command_line_writes_ptx(name, tmp_path, capsys):
    out = tmp_path / f"{name}.ptx"
    assert main(["compile", str(FORMS / f"{name}.mlir"), "--target", "ptx", "-o", str(out)]) == 0
    assert ".entry" in out.read_text()
    assert (tmp_path / f"{name}.ptx.launch.json").exists()
