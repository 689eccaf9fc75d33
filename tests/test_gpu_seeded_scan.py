"""Running max / min / xor on the GPU target (issue 14): the associative raise's host
copies around its `scan.scan` fold into one seeded kernel (`rewrites/scan_seed_gpu.py`)
whose last value goes to gpu-results-to-args' result0.  The thread-block simulator
against the interpreter on the original loop, bit for bit, at lengths around the tile
(4 threads x 2 items); the CUDA runtime with a driver whose launches run in the
simulator; ptxas (sm_80, sm_90, no spills)."""

from __future__ import annotations

import numpy as np
import pytest
from test_gpu_time_blocks import SimulatorDriver
from test_raise_forms import LSE, running, running_args
from xdsl.dialects import func

from scanweaver import compiler
from scanweaver.interp.gpu_sim import simulate_launch
from scanweaver.interp.run import numpy_dtype_for, run_function
from scanweaver.ir import make_context, parse_ir
from scanweaver.rewrites.blelloch_gpu import refusals
from scanweaver.rewrites.launch import launch_descriptions
from scanweaver.rewrites.pipeline import stages_for
from scanweaver.rewrites.raise_affine import RaiseRecurrences
from scanweaver.rewrites.scan_seed_gpu import match_seeded
from scanweaver.rewrites.scan_to_gpu import ScanToGpu
from scanweaver.runtime.cuda_program import _host_launches
from scanweaver.toolchain.gpu_export import export_gpu, ptxas_available

OPS = [("arith.maximumf", "f32"), ("arith.xori", "i32"), ("arith.minsi", "i64")]
LENGTHS = [0, 1, 2, 7, 8, 9, 15, 16, 17]  # 2^k - 1, 2^k, 2^k + 1 around the tile of 8

#: the seed as a constant (-inf for a running max from nothing) instead of an argument
CONST_SEED = running("arith.maximumf", "f32").replace(
    ", %h0: f32) -> f32 {", ") -> f32 {\n  %h0 = arith.constant 0xFF800000 : f32"
)


def gpu_module(src: str, time_blocks: str = "auto", reassociate: bool = False):
    """The whole GPU pipeline with small blocks, so tiles chain."""
    m = parse_ir(src)
    ctx = make_context()
    for p in stages_for("gpu"):
        if isinstance(p, ScanToGpu):
            p = ScanToGpu(block_size=4, items_per_thread=2, time_blocks=time_blocks, chunk_tiles=1)
        if isinstance(p, RaiseRecurrences) and reassociate:
            p = RaiseRecurrences(reassociate=True)
        p.apply(ctx, m)
    return m


def inputs(el: str, n: int, seed: bool = True) -> list:
    args = running_args(el, max(n, 25))
    args = [args[0][:n].copy(), args[1][:n].copy(), *args[2:]]
    return args if seed else args[:2]


def check(src: str, m, el: str, n: int, seed: bool = True) -> None:
    args = inputs(el, n, seed)
    copy = lambda xs: [x.copy() if isinstance(x, np.ndarray) else x for x in xs]  # noqa: E731
    ref, got = copy(args), copy(args)
    (want,) = run_function(parse_ir(src), "run", *ref)
    dt = args[0].dtype
    result = np.full((), 7, dt)
    simulate_launch(m, "run", *got, result)
    assert got[1].tobytes() == ref[1].tobytes(), (n, got[1], ref[1])
    assert result.tobytes() == np.asarray(want, dt).tobytes(), (n, result, want)


@pytest.mark.parametrize("op,el", OPS)
@pytest.mark.parametrize("time_blocks", ["auto", "always"])
def test_running_op_runs_in_one_seeded_kernel(op, el, time_blocks):
    src = running(op, el)
    m = gpu_module(src, time_blocks)
    (fn,) = [f for f in m.ops if isinstance(f, func.FuncOp)]
    assert refusals(fn) == []
    launches, _ = _host_launches(m)  # nothing but launches (and runtime scratch) on the host
    descs = launches["run"]
    if time_blocks == "auto":  # dynamic length: one block, chained tiles
        (desc,) = descs
        assert [a[:2] for a in desc.args] == [("x0", "in"), ("y0", "out"), ("init0", "scalar"), ("final0", "out")]
        assert "memref.alloc" not in [o.name for o in fn.body.walk()]
    else:  # chunks, their aggregates' scan, the carries (with the seed) and final
        assert len(descs) == 3
        assert [a[:2] for a in descs[-1].args][-2:] == [("init0", "scalar"), ("final0", "out")]
    for n in LENGTHS:
        check(src, m, el, n)


def test_a_constant_seed_is_cloned_into_the_kernel():
    m = gpu_module(CONST_SEED)
    (desc,) = launch_descriptions(m)
    assert [a[0] for a in desc.args] == ["x0", "y0", "final0"]
    for n in (0, 1, 9):
        check(CONST_SEED, m, "f32", n, seed=False)


def test_near_misses_keep_the_host_copies():
    """Only the exact group is folded: a result used by the host, or a consumer that
    computes (y[t] = 2 * h), keeps the refusal."""
    used = running("arith.maxsi", "i32").replace("func.return %r : i32", "%r2 = arith.addi %r, %r : i32\n  func.return %r2 : i32")
    lse = parse_ir(LSE.replace("func.return %r#0, %r#1", "%u = arith.addf %r#0, %r#1 : f32\n  func.return %u, %r#1"))
    RaiseRecurrences(reassociate=True).apply(make_context(), lse)
    assert [match_seeded(s) for s in lse.walk() if s.name == "scan.scan"] == [None]
    for src in (used,):
        m = gpu_module(src)
        (fn,) = [f for f in m.ops if isinstance(f, func.FuncOp)]
        assert any("operands are temporaries" in r for r in refusals(fn)), refusals(fn)


@pytest.mark.parametrize("time_blocks", ["auto", "always"])
def test_a_producer_that_computes_is_cloned_into_the_load(time_blocks):
    """h = max(h, x[t] + x[t]): the raised producer stores 2x, not a copy of x."""
    src = running("arith.maxsi", "i32").replace(
        "%xv = memref.load %x[%t] : memref<?xi32>",
        "%xw = memref.load %x[%t] : memref<?xi32>\n    %xv = arith.addi %xw, %xw : i32",
    )
    m = gpu_module(src, time_blocks)
    (fn,) = [f for f in m.ops if isinstance(f, func.FuncOp)]
    assert refusals(fn) == []
    for n in LENGTHS:
        check(src, m, "i32", n)


#: integer ones raise without the option: a wrapping product, and, or (bit for bit)
MORE_INT_OPS = [("arith.muli", "i32"), ("arith.andi", "i64"), ("arith.ori", "i32")]


@pytest.mark.parametrize("op,el", MORE_INT_OPS)
@pytest.mark.parametrize("time_blocks", ["auto", "always"])
def test_running_product_and_or_on_the_gpu(op, el, time_blocks):
    src = running(op, el)
    m = gpu_module(src, time_blocks)
    (fn,) = [f for f in m.ops if isinstance(f, func.FuncOp)]
    assert refusals(fn) == []
    # h * x[t] is affine (a = x, b = 0): the scan.recurrence kernel, in one launch, or
    # its time blocks (recurrence_time_blocks.py: reduce, carries, chunks)
    kernels = [d.kernel_name for d in launch_descriptions(m)]
    if op == "arith.muli":
        want = ["scan_recurrence"] if time_blocks == "auto" else ["scan_recurrence_tb_0"] * 3
        assert [k.rsplit("_", 1)[0] for k in kernels] == want
    else:  # one chained kernel, or chunks, their aggregates' scan, the carries
        assert len(kernels) == (1 if time_blocks == "auto" else 3) and kernels[0].startswith("scan_generic"), kernels
    for n in LENGTHS:
        check(src, m, el, n)


def lse_args(n: int, start: tuple[float, float]) -> list:
    x = np.random.default_rng(n).uniform(-4, 4, n).astype(np.float32)  # s sums many terms
    x[::5] *= 8  # and jumps of the max rescale it
    return [x, np.float32(start[0]), np.float32(start[1])]


#: (m0, s0): the usual start (-inf, 0), and a running pair carried in
LSE_STARTS = [(-np.inf, 0.0), (3.5, 2.25)]


def check_lse(m, n: int, start: tuple[float, float]) -> None:
    """m (a max) bit for bit; s reassociated (README numerics), close and finite."""
    args = lse_args(n, start)
    want = [np.float32(v) for v in run_function(parse_ir(LSE), "lse", *args)]
    res = [np.full((), 7, np.float32), np.full((), 7, np.float32)]
    simulate_launch(m, "lse", *args, *res)
    assert res[0].tobytes() == want[0].tobytes(), (n, res, want)
    assert np.isfinite(res[1]) == np.isfinite(want[1]) and np.isclose(res[1], want[1], rtol=2e-6, atol=0), (n, res, want)


@pytest.mark.parametrize("time_blocks", ["auto", "always"])
def test_log_sum_exp_runs_as_one_seeded_scan(time_blocks):
    """The online log-sum-exp pair (m, s): its producer maps x[t] to (x, 1.0) (cloned
    into the kernel's load), there is no output array, both results are rank-0."""
    m = gpu_module(LSE, time_blocks, reassociate=True)
    (fn,) = [f for f in m.ops if isinstance(f, func.FuncOp)]
    assert refusals(fn) == []
    descs = launch_descriptions(m)
    assert "memref.alloc" not in [o.name for o in fn.body.walk()] or time_blocks == "always"
    if time_blocks == "auto":
        (desc,) = descs
        assert [a[:2] for a in desc.args] == [("x0", "in"), ("init0", "scalar"), ("init1", "scalar"),
                                               ("final0", "out"), ("final1", "out")]
    else:
        assert len(descs) == 3
        (carry,) = [d for d in descs if d.kernel_name.endswith("_carry")]
        assert [a[0] for a in carry.args] == ["x0", "c0", "c1", "init0", "init1", "final0", "final1"]
    for n in LENGTHS:
        for start in LSE_STARTS:
            check_lse(m, n, start)


def test_log_sum_exp_storing_only_the_running_max():
    """y[t] = m: one output array for the first of two operands.  Time blocks would
    recombine whole tuples from the outputs, so `always` keeps the one-block kernel."""
    src = LSE.replace("%x: memref<?xf32>, %m0", "%x: memref<?xf32>, %y: memref<?xf32>, %m0").replace(
        "scf.yield %mn, %sn", "memref.store %mn, %y[%t] : memref<?xf32>\n    scf.yield %mn, %sn")
    for time_blocks in ("auto", "always"):
        m = gpu_module(src, time_blocks, reassociate=True)
        (fn,) = [f for f in m.ops if isinstance(f, func.FuncOp)]
        assert refusals(fn) == []
        (desc,) = launch_descriptions(m)
        assert [a[:2] for a in desc.args][:2] == [("x0", "in"), ("y0", "out")]
        for n in (0, 1, 9, 17):
            x, m0, s0 = lse_args(n, LSE_STARTS[1])
            y_ref, y_got = np.zeros(n, np.float32), np.zeros(n, np.float32)
            want = run_function(parse_ir(src), "lse", x, y_ref, m0, s0)
            res = [np.full((), 7, np.float32), np.full((), 7, np.float32)]
            simulate_launch(m, "lse", x, y_got, m0, s0, *res)
            assert y_got.tobytes() == y_ref.tobytes() and res[0] == np.float32(want[0]), (n, y_got, y_ref)
            assert np.isclose(res[1], want[1], rtol=2e-6, atol=0), (n, res, want)


class ScalarSimulatorDriver(SimulatorDriver):
    """`SimulatorDriver` that also passes scalar kernel parameters (the seed)."""

    def launch(self, name, grid, block, dynamic_shared, stream, params):
        from xdsl.dialects.builtin import MemRefType, SymbolRefAttr

        from scanweaver.interp.gpu_sim import _lookup_kernel, run_kernel
        from scanweaver.interp.run import _from_shaped, _to_shaped

        self.launches.append((name, grid))
        kernel = _lookup_kernel(self.module, SymbolRefAttr("scanweaver_kernels", [name]))
        values, views, p = [], [], 0
        for t in kernel.function_type.inputs.data:
            if not isinstance(t, MemRefType):
                values.append(params[p].value)
                views.append(None)
                p += 1
                continue
            rank = t.get_num_dims()
            ptr = params[p + 1].value or 0
            shape = tuple(int(params[p + 3 + i].value) for i in range(rank))
            p += 3 + 2 * rank
            dtype = numpy_dtype_for(t.element_type)
            n = int(np.prod(shape, dtype=np.int64))
            base = next(a for a, buf in self.buffers.items() if a <= ptr < a + max(buf.nbytes, 1))
            raw = self.buffers[base][ptr - base : ptr - base + n * dtype.itemsize]
            values.append(_to_shaped(np.frombuffer(raw.tobytes(), dtype, count=n).reshape(shape), t, "arg"))
            views.append(raw)
        run_kernel(self.interp, kernel, grid, block, tuple(values))
        for raw, shaped, t in zip(views, values, kernel.function_type.inputs.data):
            if raw is not None:
                out = _from_shaped(shaped, numpy_dtype_for(t.element_type))
                raw[...] = np.frombuffer(np.ascontiguousarray(out).tobytes(), np.uint8)


@pytest.mark.parametrize("op,el", OPS)
@pytest.mark.parametrize("time_blocks", ["auto", "always"])
def test_cuda_runtime_returns_the_running_value(op, el, time_blocks):
    from scanweaver.runtime.cuda import CudaFunction, CudaModule
    from scanweaver.runtime.cuda_results import with_results

    src = running(op, el)
    m = gpu_module(src, time_blocks)
    driver = ScalarSimulatorDriver(m)
    fn = with_results(CudaFunction(CudaModule("ptx", driver=driver), "run", _host_launches(m)[0]["run"], 4),
                      "run", [el], 4)
    for n in (0, 9, 17):
        x, y, h0 = inputs(el, n)
        ref = [x.copy(), y.copy(), h0]
        (want,) = run_function(parse_ir(src), "run", *ref)
        got = fn(x, y, h0)
        assert y.tobytes() == ref[1].tobytes()
        assert np.asarray(got, x.dtype).tobytes() == np.asarray(want, x.dtype).tobytes(), (n, got, want)


@pytest.mark.parametrize("time_blocks", ["auto", "always"])
def test_cuda_runtime_returns_the_log_sum_exp_pair(time_blocks):
    from scanweaver.runtime.cuda import CudaFunction, CudaModule
    from scanweaver.runtime.cuda_results import with_results

    m = gpu_module(LSE, time_blocks, reassociate=True)
    driver = ScalarSimulatorDriver(m)
    fn = with_results(CudaFunction(CudaModule("ptx", driver=driver), "lse", _host_launches(m)[0]["lse"], 5),
                      "lse", ["f32", "f32"], 5)
    for n in (0, 9, 17):
        args = lse_args(n, LSE_STARTS[0])
        want = run_function(parse_ir(LSE), "lse", *args)
        got = fn(*args)
        assert np.float32(got[0]).tobytes() == np.float32(want[0]).tobytes(), (n, got, want)
        assert np.isclose(got[1], want[1], rtol=2e-6), (n, got, want)


@pytest.mark.skipif(not ptxas_available(), reason="ptxas not found on PATH: spills not checked")
@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
def test_seeded_kernels_assemble_without_spills(chip):
    """Chained (one kernel each) and, asked for on the raised op, time blocks (3 kernels each)."""
    from scanweaver.ir import print_ir
    from scanweaver.runtime.cuda_launch import TIME_BLOCKS_ATTR
    from xdsl.dialects.builtin import StringAttr

    chained = "\n".join(running(op, el).replace("@run(", f"@run_{el}(") for op, el in OPS)
    blocked = parse_ir(chained.replace("@run_", "@tb_"))
    RaiseRecurrences().apply(make_context(), blocked)
    for s in [o for o in blocked.walk() if o.name == "scan.scan"]:
        s.attributes[TIME_BLOCKS_ATTR] = StringAttr("time_blocks")
    text = chained + "\n" + "\n".join(print_ir(o) for o in blocked.ops)
    out = export_gpu(compiler.lower(text, "gpu", keep_stages=False).module, chip)
    assert len(out["ptxas"]) == len(OPS) * 4
    for kernel, f in out["ptxas"].items():
        assert f["spill_stores"] == 0 and f["spill_loads"] == 0, (chip, kernel, f)


@pytest.mark.skipif(not ptxas_available(), reason="ptxas not found on PATH: spills not checked")
@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
def test_log_sum_exp_and_or_kernels_assemble_without_spills(chip):
    """The log-sum-exp pair (reassociate=true), running and / or: chained (one kernel
    each), and the log-sum-exp in time blocks (3 kernels)."""
    from scanweaver.ir import print_ir
    from scanweaver.runtime.cuda_launch import TIME_BLOCKS_ATTR
    from xdsl.dialects.builtin import StringAttr

    ints = [running(op, el).replace("@run(", f"@run_{el}(") for op, el in MORE_INT_OPS[1:]]
    raised = parse_ir("\n".join([LSE, LSE.replace("@lse(", "@lse_tb("), *ints]))
    RaiseRecurrences(reassociate=True).apply(make_context(), raised)
    for s in [o for o in raised.walk() if o.name == "scan.scan"]:
        if s.parent_op().sym_name.data == "lse_tb":
            s.attributes[TIME_BLOCKS_ATTR] = StringAttr("time_blocks")
    out = export_gpu(compiler.lower(print_ir(raised), "gpu", keep_stages=False).module, chip)
    assert len(out["ptxas"]) == 1 + 3 + 2, sorted(out["ptxas"])
    for kernel, f in out["ptxas"].items():
        assert f["spill_stores"] == 0 and f["spill_loads"] == 0, (chip, kernel, f)


def test_running_max_compiles_on_the_command_line(tmp_path):
    from scanweaver.cli import main

    f = tmp_path / "run.mlir"
    f.write_text(running("arith.maximumf", "f32"))
    out = tmp_path / "run.ptx"
    assert main(["compile", str(f), "--target", "ptx", "-o", str(out)]) == 0
    assert ".entry scan_generic_0" in out.read_text()


@pytest.mark.parametrize("time_blocks", ["auto", "always"])
def test_in_place_running_xor(time_blocks):
    """x[t] = h = h ^ x[t]: the scan reads and writes x (an inout kernel argument)."""
    src = running("arith.xori", "i32").replace("memref.store %hn, %y[%t]", "memref.store %hn, %x[%t]")
    m = gpu_module(src, time_blocks)
    (fn,) = [f for f in m.ops if isinstance(f, func.FuncOp)]
    assert refusals(fn) == []
    for n in (0, 1, 9, 17):
        x, y, h0 = inputs("i32", n)
        ref, got = [x.copy(), y.copy(), h0], [x.copy(), y.copy(), h0]
        (want,) = run_function(parse_ir(src), "run", *ref)
        result = np.full((), 7, np.int32)
        simulate_launch(m, "run", *got, result)
        assert got[0].tobytes() == ref[0].tobytes() and result[()] == want, (n, got[0], ref[0])


def static_running(length: int, static: int) -> str:
    """The running min over `memref<static x i64>` with the constant trip count `length`."""
    return running("arith.minsi", "i64").replace("memref<?xi64>", f"memref<{static}xi64>").replace(
        "%r = scf.for %t = %c0 to %n", f"%cn = arith.constant {length} : index\n  %r = scf.for %t = %c0 to %cn"
    )


def test_a_constant_trip_count_equal_to_the_static_length():
    src = static_running(17, 17)
    m = gpu_module(src)
    (fn,) = [f for f in m.ops if isinstance(f, func.FuncOp)]
    assert refusals(fn) == []
    check(src, m, "i64", 17)
    # a shorter loop over a longer array leaves y's tail alone: not one scan of x into y
    m = gpu_module(static_running(16, 17))
    (fn,) = [f for f in m.ops if isinstance(f, func.FuncOp)]
    assert any("operands are temporaries" in r for r in refusals(fn)), refusals(fn)
