"""Device views off a 16-byte boundary run on the scalar path (`rewrites/gpu_aligned_bases.py`):
every kernel family with 16-byte vector accesses (affine, generic `scan.scan`, in one block
per channel and in time blocks, and the `scan.recurrence` step IO) in the thread-block
simulator with argument bases placed 4, 8 or 12 bytes past a 16-byte boundary
(`simulate_launch(base_offsets=...)`), against the interpreter, for every dtype the vector
paths cover (f32, f64, i32, i64): the same results (integers bit for bit), no vector
access, and bounds checked per element as always. Aligned bases keep their vectors."""

from __future__ import annotations

import numpy as np
import pytest
from xdsl.context import Context

from scanweaver.interp.gpu_sim import GpuSimError, simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import parse_ir
from scanweaver.rewrites import scan_to_gpu
from scanweaver.rewrites.launch import launch_descriptions
from scanweaver.rewrites.scan_to_gpu import ScanToGpu
from scanweaver.workloads.scans import affine_scan_ir
from test_gpu_time_blocks import affine_args
from test_scan_gpu import inputs, scan_text

BS, IPT = 8, 4  # 32-step tiles; a thread's run is whole 16-byte vectors of 4- and 8-byte types
NP = {"f32": np.float32, "f64": np.float64, "i32": np.int32, "i64": np.int64}


def vector_accesses(stats) -> int:
    return sum(s.get("vector_accesses", 0) for s in stats)


def check_scalar_where_misaligned(m, stats, aligned_stats, offsets):
    """A launch that binds a misaligned argument makes no vector access; the others
    (e.g. a reduce kernel that never sees the misaligned output) keep theirs."""
    hosts = {d.kernel_name: set(d.host_args) for d in launch_descriptions(m)}
    assert len(stats) == len(aligned_stats)
    for st, ref in zip(stats, aligned_stats):
        if hosts[st["kernel"]] & set(offsets):
            assert st.get("vector_accesses", 0) == 0, (st["kernel"], offsets)
        else:
            assert st.get("vector_accesses", 0) == ref.get("vector_accesses", 0), (st["kernel"], offsets)


def simulate(m, name, args, offsets):
    got = [a.copy() for a in args]
    stats: list = []
    simulate_launch(m, name, *got, stats=stats, base_offsets=offsets)
    return got, stats


def compare(got, ref, exact):
    for g, r in zip(got, ref):
        if exact:
            np.testing.assert_array_equal(g, r)
        else:
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


def _offsets(el: str, positions) -> list[dict[int, int]]:
    """Byte offsets off a 16-byte boundary that an `el` view can have (whole elements):
    one each time, by turns (4, 8, 12 for 4-byte types; 8 for 8-byte ones)."""
    size = np.dtype(NP[el]).itemsize
    offs = list(range(size, 16, size))
    return [{p: offs[(i + len(positions)) % len(offs)] for i, p in enumerate(positions)}]


def _shape(time_blocks: str) -> tuple[int, int]:
    """Two channels of two tiles, or one channel of two chunks (time blocks)."""
    return (2, 64) if time_blocks == "never" else (1, 128)


@pytest.mark.parametrize("time_blocks", ["never", "always"])
@pytest.mark.parametrize("el", ["f32", "f64", "i32", "i64"])
def test_affine_views(el, time_blocks):
    text = affine_scan_ir(("?", "?"), 1, el, el, init=True, final=True, reverse=el == "i64")
    args = affine_args(_shape(time_blocks), NP[el], NP[el], True, seed=3)  # a, b, h0, h, final
    ref = [a.copy() for a in args]
    run_function(text, "f", *ref)
    m = parse_ir(text)
    ScanToGpu(block_size=BS, items_per_thread=IPT, time_blocks=time_blocks, chunk_tiles=2).apply(Context(), m)
    exact = el[0] == "i"
    got, aligned = simulate(m, "f", args, None)
    compare(got, ref, exact)
    assert vector_accesses(aligned) > 0  # whole tiles of whole vectors: the vector path
    for positions in ([0], [3], [0, 1, 3]):  # a, b, h (an input, the output, all)
        for offsets in _offsets(el, positions):
            got, stats = simulate(m, "f", args, offsets)
            compare(got, ref, exact)
            check_scalar_where_misaligned(m, stats, aligned, offsets)


@pytest.mark.parametrize("time_blocks", ["never", "always"])
@pytest.mark.parametrize("name", ["cumsum_i32", "first_i64", "cumsum_f32", "max_via_scf_if_f64"])
def test_generic_scan_views(name, time_blocks):
    shape = _shape(time_blocks)
    text = scan_text(name, shape, 1, reverse=name == "first_i64")
    xs = inputs(name, shape)
    args = xs + [np.full_like(x, 77) for x in xs]
    ref = [a.copy() for a in args]
    run_function(text, "f", *ref)
    m = parse_ir(text)
    ScanToGpu(block_size=BS, items_per_thread=IPT, time_blocks=time_blocks, chunk_tiles=2).apply(Context(), m)
    exact = "f32" not in name or name.startswith("argmax")
    got, aligned = simulate(m, "f", args, None)
    compare(got, ref, exact)
    assert vector_accesses(aligned) > 0
    k = len(xs)
    el = str(xs[0].dtype).replace("float", "f").replace("int", "i")
    for positions in ([0], list(range(2 * k))):
        for offsets in _offsets(el, positions):
            got, stats = simulate(m, "f", args, offsets)
            compare(got, ref, exact)
            check_scalar_where_misaligned(m, stats, aligned, offsets)


@pytest.mark.parametrize("L", [64])
def test_selective_scan_step_io_views(L):
    """delta, u, z read and out written by vectors in full tiles (recurrence_vector_io.py)."""
    from test_recurrence_gpu import lowered, ssm_args

    from scanweaver.workloads import loops

    opts = dict(bc="shared", return_last_state=True)
    args = ssm_args(np.random.default_rng(L), 1, 2, L, 4, **opts)
    original, m = lowered(loops.selective_scan_loops(1, 2, L, 4, **opts), block_size=BS, items_per_thread=IPT)
    from scanweaver.rewrites.gpu_aligned_bases import guard_vector_paths

    guard_vector_paths(m)  # `lowered` runs the recurrence lowering alone, not the whole pass
    ref = [a.copy() for a in args]
    run_function(original, "selective_scan", *ref)
    got, stats = simulate(m, "selective_scan", args, None)
    compare(got, ref, False)
    assert vector_accesses(stats) > 0
    for offsets in ({0: 4}, {1: 8}, {i: 12 for i in range(len(args))}):
        got, stats = simulate(m, "selective_scan", args, offsets)
        compare(got, ref, False)
        assert vector_accesses(stats) == 0, offsets


@pytest.mark.parametrize("L", [0, 1, 31, 33, 161])
def test_lengths_around_tiles_on_a_view(L):
    text = affine_scan_ir(("?", "?"), 1, "i32", "i32", init=True, final=True)
    args = affine_args((3, L), np.int32, np.int32, True, seed=L)
    ref = [a.copy() for a in args]
    run_function(text, "f", *ref)
    m = parse_ir(text)
    ScanToGpu(block_size=BS, items_per_thread=IPT, time_blocks="never").apply(Context(), m)
    got, _ = simulate(m, "f", args, {0: 4, 3: 8})
    compare(got, ref, True)


def test_without_the_guard_a_view_faults(monkeypatch):
    """The check can fail: with the base test left out, the vector path runs on the
    misaligned view and the simulator reports the misaligned 16-byte access."""
    monkeypatch.setattr(scan_to_gpu, "guard_vector_paths", lambda op: None)
    text = affine_scan_ir(("?", "?"), 1, "f32", "f32", init=True, final=True)
    args = affine_args((2, 128), np.float32, np.float32, True, seed=1)
    m = parse_ir(text)
    ScanToGpu(block_size=BS, items_per_thread=IPT, time_blocks="never").apply(Context(), m)
    simulate(m, "f", args, None)
    with pytest.raises(GpuSimError, match="not 16-byte aligned"):
        simulate(m, "f", args, {0: 4})


def test_a_vector_access_without_a_scalar_twin_is_refused():
    """A builder that emits a 16-byte access outside a vector branch gets an error, not a
    kernel that could fault on a view."""
    from xdsl.dialects import arith, gpu, vector
    from xdsl.dialects.builtin import IndexType, IntegerAttr, VectorType, f32, i64
    from xdsl.rewriter import InsertPoint, Rewriter

    from scanweaver.errors import ScanWeaverError
    from scanweaver.rewrites.gpu_aligned_bases import guard_kernel

    m = parse_ir(affine_scan_ir(("?", "?"), 1, "f32", "f32"))
    ScanToGpu(block_size=BS, items_per_thread=IPT, time_blocks="never").apply(Context(), m)
    (kernel,) = [o for o in m.walk() if isinstance(o, gpu.FuncOp)]
    assert guard_kernel(kernel.clone()) == 2  # as built: the load and the store branch
    zero = arith.ConstantOp(IntegerAttr(0, IndexType()))
    load = vector.LoadOp(kernel.body.block.args[0], [zero.result, zero.result], VectorType(f32, [4]))
    load.attributes["alignment"] = IntegerAttr(16, i64)
    Rewriter.insert_op([zero, load], InsertPoint.at_start(kernel.body.block))
    with pytest.raises(ScanWeaverError, match="scalar else-branch"):
        guard_kernel(kernel)
