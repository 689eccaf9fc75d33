"""The forms `scanweaver-raise` learned in issue 14, through scan-to-gpu: the thread-block
simulator against the interpreter on the original loops, and ptxas (sm_80, sm_90, no
spills).  Dynamic channel counts (the state `memref<?xf32>` itself, or a temporary
slice of another memref) and a static state of more than 64 elements become one block
per state element (`gpu_split_state.py`);
single-series multi-lag recurrences and lfilter (final state stored to an argument)
run in one block; masked updates and `math.fma` lower like any recurrence; a dynamic
2-D state summed over in emit (dynamic RetNet) takes the state matrix kernel.  The forms
still kept from the CUDA runtime are pinned with their reasons."""

from __future__ import annotations

import re

import numpy as np
import pytest
from test_raise_forms import (
    FMA,
    LSE,
    dyn_args,
    dyn_channels,
    lfilter,
    lfilter_args,
    lfilter_memory,
    lfilter_memory_args,
    lfilter_memory_channels,
    lfilter_memory_channels_args,
    masked,
    masked_args,
    multilag,
    multilag_args,
    multilag_channels_inside,
    multilag_channels_inside_args,
    retnet,
    retnet_args,
    running,
    running_args,
    DYN_NC_OF_X,
)
from xdsl.dialects import func

from scanweaver.cli import main
from scanweaver.interp.gpu_sim import simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import make_context, parse_ir
from scanweaver.rewrites.blelloch_gpu import ScanToGpu, refusals
from scanweaver.rewrites.raise_affine import RaiseRecurrences
from scanweaver.rewrites.scan_to_loops import ScanToLoops
from scanweaver.runtime.cuda_program import _host_launches
from scanweaver.toolchain.gpu_export import export_gpu, ptxas_available


def stored_result(src: str, el: str, k: int) -> str:
    """`src` with its `func.return` of k state values replaced by stores to a new
    `%out: memref<k x el>` argument (what a GPU caller writes)."""
    src = re.sub(r"\) -> \(?[a-z0-9, ]+\)? \{", f", %out: memref<{k}x{el}>) {{", src, count=1)
    ret = re.search(r"func\.return (.+) : .+", src)
    assert ret is not None
    vals = [v.strip() for v in ret.group(1).split(",")]
    stores = "\n  ".join(
        f"%oi{i} = arith.constant {i} : index\n  memref.store {v}, %out[%oi{i}] : memref<{k}x{el}>"
        for i, v in enumerate(vals)
    )
    return src[: ret.start()] + stores + "\n  func.return" + src[ret.end():]


def rename(src: str, old: str, new: str) -> str:
    return src.replace(f"func.func @{old}(", f"func.func @{new}(", 1)


def _dyn(n=37, c=5):
    return dyn_args(n, c, c)


# name -> (source, arguments, exact comparison)
FORMS = {
    "dyn_direct": (rename(dyn_channels(), "ema", "dyn_direct"), _dyn, False),
    "dyn_slice": (rename(dyn_channels(DYN_NC_OF_X), "ema", "dyn_slice"), _dyn, False),
    "big_static": (
        rename(dyn_channels().replace("memref<?x?xf32>", "memref<?x80xf32>").replace("memref<?xf32>", "memref<80xf32>"),
               "ema", "big_static"),
        lambda: dyn_args(13, 80, 80),
        False,
    ),
    "iir_seq": (rename(multilag(), "iir", "iir_seq"), lambda: multilag_args("f32", 3, n=45), False),
    "iir_seq_i32": (rename(multilag("i32"), "iir", "iir_seq_i32"), lambda: multilag_args("i32", 3, n=45), True),
    "lfilter_seq": (
        rename(stored_result(lfilter("f32"), "f32", 2), "lfilter", "lfilter_seq"),
        lambda: [*lfilter_args("f32", n=41), np.zeros(2, np.float32)],
        False,
    ),
    "lfilter_seq_i64": (
        rename(stored_result(lfilter("i64"), "i64", 2), "lfilter", "lfilter_seq_i64"),
        lambda: [*lfilter_args("i64", n=41), np.zeros(2, np.int64)],
        True,
    ),
    "masked_seq_i32": (
        rename(stored_result(masked("i32", mask="i32"), "i32", 1), "masked", "masked_seq_i32"),
        lambda: [*masked_args("i32", n=29, mask_dtype=np.int32), np.zeros(1, np.int32)],
        True,
    ),
    "masked_ch": (rename(masked("f32", channels=True, mask="i32"), "masked", "masked_ch"),
                  lambda: masked_args("f32", n=23, channels=True, mask_dtype=np.int32), False),
    "fma_seq": (
        rename(stored_result(FMA, "f32", 1), "fma", "fma_seq"),
        lambda: [np.random.default_rng(3).uniform(-1, 1, 33).astype(np.float32),
                 np.random.default_rng(4).uniform(0.5, 0.9, 33).astype(np.float32), np.float32(0.25),
                 np.zeros(1, np.float32)],
        False,
    ),
    "retnet": (retnet(T=10, D=4, E=3), lambda: retnet_args(10, 4, 3), False),
    # dynamic D, E: the state matrix kernel (gpu_state_matrix.py; more: tests/test_gpu_state_matrix.py)
    "retnet_dyn": (rename(retnet(dynamic=True), "retnet", "retnet_dyn"), lambda: retnet_args(11, 6, 3), False),
    # raised after a reshape (raise_reshape.py): channel loop moved outside; zi promoted
    "iirc_dyn": (rename(multilag_channels_inside("f32"), "iirc", "iirc_dyn"),
                 lambda: multilag_channels_inside_args("f32", 37, 5), False),
    "iirc_i32": (rename(multilag_channels_inside("i32", dynamic=False), "iirc", "iirc_i32"),
                 lambda: multilag_channels_inside_args("i32", 37, 6), True),
    "lfm": (rename(lfilter_memory("f32"), "lfm", "lfm"), lambda: lfilter_memory_args("f32", 41), False),
    "lfmc_inner": (rename(lfilter_memory_channels("f32"), "lfmc", "lfmc_inner"),
                   lambda: lfilter_memory_channels_args("f32", n=33), False),
    "lfmc_outer_i32": (rename(lfilter_memory_channels("i32", time_outer=False), "lfmc", "lfmc_outer_i32"),
                       lambda: lfilter_memory_channels_args("i32", False, n=33), True),
    "lfm_i64": (rename(lfilter_memory("i64"), "lfm", "lfm_i64"), lambda: lfilter_memory_args("i64", 41), True),
}


@pytest.fixture(scope="module")
def lowered():
    text = "\n".join(src for src, _, _ in FORMS.values())
    m = parse_ir(text)
    ctx = make_context()
    RaiseRecurrences().apply(ctx, m)
    ScanToGpu(block_size=4, items_per_thread=2).apply(ctx, m)
    left = {
        fn.sym_name.data: refusals(fn) for fn in m.ops if isinstance(fn, func.FuncOp) and refusals(fn)
    }
    assert left == {}, left
    assert not [o.name for o in m.walk() if o.name.startswith("scan.") and o.name != "scan.yield"]
    ScanToLoops().apply(ctx, m)
    launches, _ = _host_launches(m)  # nothing but launches and index math on the host
    assert all(launches[n] for n in FORMS), launches
    return text, m


@pytest.mark.parametrize("name", sorted(FORMS))
def test_form_runs_like_the_loops(lowered, name):
    text, m = lowered
    _, make, exact = FORMS[name]
    args = make()
    ref = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    got = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    run_function(parse_ir(text), name, *ref)
    simulate_launch(m, name, *got)
    for r, g in zip(ref, got):
        if not isinstance(r, np.ndarray):
            continue
        if exact:
            assert g.tobytes() == r.tobytes(), (name, g, r)
        else:
            assert np.all(np.isfinite(g)) == np.all(np.isfinite(r))
            np.testing.assert_allclose(g.astype(np.float64), r.astype(np.float64), rtol=1e-4, atol=1e-5)


def test_dynamic_state_becomes_one_block_per_element(lowered):
    from scanweaver.rewrites.launch import launch_descriptions

    descs = {d.func_name: d for d in launch_descriptions(lowered[1])}
    assert descs["dyn_direct"].grid == ("h.shape[0]", 1, 1)
    assert descs["dyn_slice"].grid == ("x.shape[1]", 1, 1)
    assert descs["iir_seq"].grid == (1, 1, 1)
    assert descs["big_static"].grid == (80, 1, 1)  # more than 64 elements: one block each


def test_dynamic_state_sizes_are_checked_against_the_loops(lowered):
    from scanweaver.rewrites.launch import launch_descriptions

    descs = {d.func_name: d for d in launch_descriptions(lowered[1])}
    # a[c] and y[t, c] are read/written for every channel of h: they must be that large
    assert ("a", 0, "h", 0) in descs["dyn_direct"].covers_dims


@pytest.mark.skipif(not ptxas_available(), reason="ptxas not found on PATH: spills not checked")
@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
def test_every_form_assembles_without_spills(chip):
    from scanweaver import compiler

    text = "\n".join(src for src, _, _ in FORMS.values())
    out = export_gpu(compiler.lower(text, "gpu", keep_stages=False).module, chip)
    assert len(out["ptxas"]) == len(FORMS)
    for kernel, f in out["ptxas"].items():
        assert f["spill_stores"] == 0 and f["spill_loads"] == 0, (chip, kernel, f)


# ---------------------------------------------------------------------------
# What the CUDA runtime still does not take, with the reason
# ---------------------------------------------------------------------------

REFUSED = {
    # a 2-D state of dynamic shape whose readout combines a column by other than a sum
    # (a sum runs: the state matrix kernel, tests/test_gpu_state_matrix.py)
    "retnet_max": (
        rename(retnet(dynamic=True), "retnet", "retnet_max").replace(
            "%an = arith.addf %a, %p", "%an = arith.maximumf %a, %p"),
        "scan.recurrence: emit does not read the state in one loop nest from 0 to each state "
        "dimension step 1 (a state of dynamic shape or of more than 64 elements splits into channels only "
        "element by element); nor as a state matrix (one block per column): emit's sum loop must end "
        "with 'arith.addf %acc, %term' yielded",
    ),
    # (a final state returned as the function's result runs: tests/test_gpu_results.py;
    # a running max / min / xor runs as one seeded kernel: tests/test_gpu_seeded_scan.py)
    # a bool mask array: MLIR cannot load i1 elements in a kernel
    "masked_bool": (
        rename(stored_result(masked("f32"), "f32", 1), "masked", "masked_bool"),
        "scan.recurrence: %mask is a memref of i1 (bool), which GPU kernels cannot load; pass it as i8 or i32",
    ),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refusal_is_named_on_the_command_line(name, tmp_path, capsys):
    src, why = REFUSED[name]
    f = tmp_path / f"{name}.mlir"
    f.write_text(src)
    out = tmp_path / f"{name}.ptx"
    argv = ["compile", str(f), "--target", "ptx", "-o", str(out)]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"scanweaver: error: function @{name} ")
    assert why in err, err
    assert not out.exists()


def test_log_sum_exp_runs_with_reassociation():
    """Online log-sum-exp is raised only with reassociate=true (not the command line's default);
    its producer computes the pair (x, 1) and it has no output array: the seeded scan
    (scan_seed_gpu.py) folds that group, so nothing but a launch is left on the host.
    (Its results against the loop: tests/test_gpu_seeded_scan.py.)"""
    from scanweaver.rewrites.pipeline import stages_for
    from scanweaver.runtime.cuda_program import _host_launches

    m, ctx = parse_ir(LSE), make_context()
    for p in stages_for("gpu"):  # the whole GPU pipeline, the raise with the option
        (RaiseRecurrences(reassociate=True) if isinstance(p, RaiseRecurrences) else p).apply(ctx, m)
    (fn,) = [op for op in m.ops if isinstance(op, func.FuncOp)]
    assert refusals(fn) == []
    assert not any(o.name in ("scf.for", "memref.alloc", "scan.scan") for o in fn.body.walk())
    (desc,) = _host_launches(m)[0]["lse"]
    assert [a[0] for a in desc.args] == ["x0", "init0", "init1", "final0", "final1"]


@pytest.mark.parametrize("op,el", [("arith.maximumf", "f32"), ("arith.xori", "i32"), ("arith.minsi", "i64")])
def test_associative_scan_kernel_runs_like_the_loop(op, el):
    """The scan.scan kernel of a running max / xor / min, lowered alone (without
    gpu-results-to-args the result stays returned, so the host copies stay around the
    unseeded kernel) is right: simulator against the interpreter, bit for bit."""
    src = running(op, el)
    m = parse_ir(src)
    ctx = make_context()
    RaiseRecurrences().apply(ctx, m)
    ScanToGpu(block_size=4, items_per_thread=2).apply(ctx, m)
    assert not any(o.name == "scan.scan" for o in m.walk())
    ScanToLoops().apply(ctx, m)
    args = running_args(el, 37)
    ref = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    got = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    r_ref = run_function(parse_ir(src), "run", *ref)
    r_got = simulate_launch(m, "run", *got)
    assert got[1].tobytes() == ref[1].tobytes()
    if r_got is not None:
        assert np.float64(r_got[0]).tobytes() == np.float64(r_ref[0]).tobytes()


def test_command_line_names_every_refused_function(tmp_path, capsys):
    """Not only the first function that fails: one line per op the GPU lowering left."""
    f = tmp_path / "two.mlir"
    f.write_text(REFUSED["retnet_max"][0] + REFUSED["masked_bool"][0])
    assert main(["compile", str(f), "--target", "mlir", "--lower-for", "gpu", "-o", str(tmp_path / "o.mlir")]) == 0
    lines = [x for x in capsys.readouterr().err.splitlines() if "not lowered for the GPU" in x]
    assert lines == [
        f"[scanweaver] @retnet_max: not lowered for the GPU: {REFUSED['retnet_max'][1]}",
        f"[scanweaver] @masked_bool: not lowered for the GPU: {REFUSED['masked_bool'][1]}",
    ]


@pytest.mark.parametrize("nc", ["%nc = memref.dim %h, %c0 : memref<?xf32>", DYN_NC_OF_X])
def test_a_split_the_kernel_refuses_is_undone(nc):
    """Emit writes y[t] from every element (the last element wins each step): per element
    the order of those writes would change, so the kernel lowering refuses the split
    form and the original recurrence comes back unchanged, for the sequential lowering."""
    from scanweaver.ir import print_ir

    src = dyn_channels(nc).replace("memref.store %hn, %y[%t, %c] : memref<?x?xf32>",
                                   "memref.store %hn, %y[%t, %c0] : memref<?x?xf32>")
    m = parse_ir(src)
    RaiseRecurrences().apply(make_context(), m)
    before = print_ir(m)
    ScanToGpu().apply(make_context(), m)
    (fn,) = [op for op in m.ops if isinstance(op, func.FuncOp)]
    (why,) = refusals(fn)
    assert why.startswith("scan.recurrence: ") and "%y" in why, why
    del fn.attributes["scanweaver.gpu_refused"]
    m.attributes.pop("gpu.container_module", None)
    after = "\n".join(x for x in print_ir(m).splitlines() if "gpu.module" not in x)
    assert after.replace(" attributes {gpu.container_module}", "").strip() == before.strip()
    args = dyn_args(9, 4, 4)
    ref = [a.copy() for a in args]
    got = [a.copy() for a in args]
    run_function(parse_ir(src), "ema", *ref)
    ScanToLoops().apply(make_context(), m)
    run_function(m, "ema", *got)
    for r, g in zip(ref, got):
        assert r.tobytes() == g.tobytes()
