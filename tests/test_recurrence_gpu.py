"""`scan-to-gpu` on `scan.recurrence`: the fused kernel (producer, Blelloch scan over N
state elements, consumer) run in the thread-block simulator (races and barrier
divergence checked) against the sequential oracle (`run_function` on the original
loops). Small blocks (4 threads x 2 items) so that L up to 40 spans several chained
tiles, partial tiles and idle threads."""

from __future__ import annotations

import numpy as np
import pytest
from xdsl.dialects import func, gpu

from scanweaver.dialects import scan
from scanweaver.interp.gpu_sim import simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import make_context, parse_ir, print_ir
from scanweaver.rewrites.blelloch_gpu import ScanToGpu
from scanweaver.rewrites.launch import launch_descriptions
from scanweaver.rewrites.raise_affine import RaiseRecurrences
from scanweaver.rewrites.recurrence_gpu import lower_recurrences
from scanweaver.runtime.cuda_program import _HOST_OPS
from scanweaver.workloads import loops


def lowered(module, block_size=4, items_per_thread=2, keep_pairs=None):
    """(original loops, raised + lowered module)."""
    original = parse_ir(print_ir(module))
    m = parse_ir(print_ir(module))
    ctx = make_context()
    RaiseRecurrences().apply(ctx, m)
    assert any(isinstance(o, scan.RecurrenceOp) for o in m.walk())
    skipped = lower_recurrences(m, block_size, items_per_thread, keep_pairs)
    assert not skipped, skipped
    m.verify()
    return original, m


def assert_host_only_launches(m):
    for fn in m.ops:
        if isinstance(fn, func.FuncOp):
            for op in fn.body.walk():
                assert isinstance(op, _HOST_OPS), op.name
    assert not any(isinstance(o, scan.RecurrenceOp) for o in m.walk())


def check(module, fname, args, *, rtol=1e-5, atol=1e-6, **kw):
    original, m = lowered(module, **kw)
    assert_host_only_launches(m)
    ref = [a.copy() for a in args]
    got = [a.copy() for a in args]
    run_function(original, fname, *ref)
    simulate_launch(m, fname, *got)
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=rtol, atol=atol)
    return m


def f32(rng, *shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def ssm_args(rng, batch, D, L, N, *, bc="constant", groups=1, with_D=True, with_z=True,
             with_delta_bias=True, return_last_state=False, **_):
    shape_bc = {"constant": (D, N), "shared": (batch, N, L), "grouped": (batch, groups, N, L)}[bc]
    args = [
        f32(rng, batch, D, L),  # u
        f32(rng, batch, D, L, lo=-2.0, hi=0.5),  # delta
        f32(rng, D, N, lo=-2.0, hi=-0.1),  # A (negative: decays)
        f32(rng, *shape_bc),
        f32(rng, *shape_bc),
    ]
    if with_D:
        args.append(f32(rng, D))
    if with_z:
        args.append(f32(rng, batch, D, L))
    if with_delta_bias:
        args.append(f32(rng, D, lo=-0.5, hi=0.5))
    args.append(np.zeros((batch, D, L), np.float32))
    if return_last_state:
        args.append(np.zeros((batch, D, N), np.float32))
    return args


SSM_CASES = {
    # name: (batch, D, L, N, builder options)
    "full_L13": (2, 2, 13, 3, dict(return_last_state=True)),
    "L1": (1, 2, 1, 2, dict(return_last_state=True)),
    "L5_plain": (1, 3, 5, 4, dict(with_D=False, with_z=False, with_delta_bias=False, delta_softplus=False)),
    "L40_constant": (1, 2, 40, 3, dict(return_last_state=True)),
    "shared_bc": (2, 2, 13, 2, dict(bc="shared", return_last_state=True)),
    "grouped_bc": (1, 2, 13, 2, dict(bc="grouped", groups=2, with_z=False)),
    "no_softplus": (2, 2, 5, 2, dict(delta_softplus=False, with_D=False)),
}


@pytest.mark.parametrize("name", sorted(SSM_CASES))
def test_selective_scan(name):
    batch, D, L, N, opts = SSM_CASES[name]
    module = loops.selective_scan_loops(batch, D, L, N, **opts)
    args = ssm_args(np.random.default_rng(len(name)), batch, D, L, N, **opts)
    check(module, "selective_scan", args)


def test_selective_scan_kept_pairs_and_larger_block():
    """Both replay strategies; a block of 8 threads x 3 items (partial last tile)."""
    opts = dict(return_last_state=True)
    module = loops.selective_scan_loops(1, 2, 40, 3, **opts)
    args = ssm_args(np.random.default_rng(7), 1, 2, 40, 3, **opts)
    for keep in (True, False):
        check(module, "selective_scan", args, keep_pairs=keep)
    check(module, "selective_scan", args, block_size=8, items_per_thread=3)


def test_selective_scan_component_groups(monkeypatch):
    """A small shared-memory budget forces the N components into groups of sweeps."""
    import scanweaver.rewrites.recurrence_gpu as rg

    monkeypatch.setattr(rg, "SWEEP_SHARED_BUDGET", 2 * 4 * 4 * 2)  # 2 components
    monkeypatch.setattr(rg, "WARP_SHUFFLE_SCANS", False)  # the sweep's groups (f32 takes shuffles)
    opts = dict(return_last_state=True)
    module = loops.selective_scan_loops(1, 1, 13, 3, **opts)
    args = ssm_args(np.random.default_rng(3), 1, 1, 13, 3, **opts)
    m = check(module, "selective_scan", args)
    (desc,) = launch_descriptions(m)
    assert "2 components per sweep" in desc.notes


@pytest.mark.parametrize("L", [0, 1, 5, 13, 40])
def test_ema_with_outputs(L):
    rng = np.random.default_rng(L)
    C = 2
    args = [f32(rng, C, L), f32(rng, C, lo=0.5, hi=1.0), f32(rng, C), np.zeros((C, L), np.float32),
            np.zeros(C, np.float32)]
    check(loops.ema_loops(C, L), "ema", args)


@pytest.mark.parametrize("L", [5, 13])
def test_discounted_return_reversed(L):
    """G[c, L-1-t] (injective in t) and the write-through g[c] (last step only)."""
    rng = np.random.default_rng(L)
    C = 3
    args = [f32(rng, C, L), f32(rng, C, lo=0.5, hi=1.0), f32(rng, C), np.zeros((C, L), np.float32)]
    check(loops.discounted_return_loops(C, L), "discounted_return", args)


@pytest.mark.parametrize("L", [5, 13])
def test_reset_state_argument(L):
    """Depth 0: the state is a function argument, the channels are the state vector."""
    rng = np.random.default_rng(L)
    C = 3
    done = (rng.uniform(size=L) < 0.3).astype(np.int32)
    args = [f32(rng, L, C), f32(rng, L, C, lo=0.5, hi=1.0), done, f32(rng, C), np.zeros((L, C), np.float32)]
    m = check(loops.reset_loops(C, L), "reset", args)
    (desc,) = launch_descriptions(m)
    assert desc.grid == (1, 1, 1)
    assert dict((n, k) for n, k, _, _ in desc.args)["h"] == "inout"


@pytest.mark.parametrize("block_size", [4, 128])
def test_launch_description_and_structure(block_size):
    module = loops.selective_scan_loops(2, 3, 5, 4, return_last_state=True)
    _, m = lowered(module, block_size=block_size, items_per_thread=2)
    (desc,) = launch_descriptions(m)
    assert desc.grid == (6, 1, 1) and desc.block == (block_size, 1, 1)
    # warp shuffles: the carry sC (4 f32), and sA / sB of 4 warp totals x 4 elements
    # beyond one warp (16-byte aligned globals)
    assert desc.shared_bytes == (16 if block_size == 4 else 64 + 64 + 16)
    kinds = {n: k for n, k, _, _ in desc.args}
    assert kinds["out"] == "out" and kinds["last_state"] == "out" and kinds["u"] == "in"
    assert desc.host_args == tuple(range(len(desc.args)))
    (kernel,) = [o for o in m.walk() if isinstance(o, gpu.FuncOp)]
    assert "gpu.kernel" in kernel.attributes
    barriers = [o for o in kernel.walk() if isinstance(o, gpu.BarrierOp)]
    # the initial carry, the overflow fallback's loop, the epilogue; per tile: the warp
    # totals and the next carry (several warps) or, in one warp, one after the tiles
    assert len(barriers) == 3 + (1 if block_size == 4 else 2)


def test_build_cuda_artifacts_on_loop_ir():
    """The whole selective scan as loop IR -> one kernel; PTX built without a GPU."""
    from scanweaver.runtime.cuda_program import build_cuda_artifacts

    text = print_ir(loops.selective_scan_loops(2, 4, 64, 4, return_last_state=True))
    art = build_cuda_artifacts(text)
    (seq,) = art.launches.values()
    (desc,) = seq
    assert desc.kernel_name.startswith("scan_recurrence") and desc.grid == (8, 1, 1)
    assert f".entry {desc.kernel_name}(" in art.ptx


# ---------------------------------------------------------------------------
# Left alone: forms the parallel kernel cannot prove safe
# ---------------------------------------------------------------------------

REJECTED = {
    "channels_overlap": """
func.func @f(%x: memref<4x8xf32>, %y: memref<8xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %c8 = arith.constant 8 : index
  scf.for %c = %c0 to %c4 step %c1 {
    %h = memref.alloca() : memref<f32>
    %z = arith.constant 0.0 : f32
    memref.store %z, %h[] : memref<f32>
    scan.recurrence %c0 to %c8 step %c1 state(%h : memref<f32>) coeffs {
    ^bb0(%t: index):
      %v = memref.load %x[%c, %t] : memref<4x8xf32>
      scan.yield %v, %v : f32, f32
    } emit {
    ^bb0(%t: index, %s: memref<f32>):
      %v = memref.load %s[] : memref<f32>
      memref.store %v, %y[%t] : memref<8xf32>
      scan.yield
    }
  }
  func.return
}""",
    "emit_reads_what_it_writes": """
func.func @f(%x: memref<4x8xf32>, %y: memref<4x8xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %c8 = arith.constant 8 : index
  scf.for %c = %c0 to %c4 step %c1 {
    %h = memref.alloca() : memref<f32>
    %z = arith.constant 0.0 : f32
    memref.store %z, %h[] : memref<f32>
    scan.recurrence %c0 to %c8 step %c1 state(%h : memref<f32>) coeffs {
    ^bb0(%t: index):
      %v = memref.load %x[%c, %t] : memref<4x8xf32>
      scan.yield %v, %v : f32, f32
    } emit {
    ^bb0(%t: index, %s: memref<f32>):
      %p = memref.load %y[%c, %c0] : memref<4x8xf32>
      %v = memref.load %s[] : memref<f32>
      %w = arith.addf %p, %v : f32
      memref.store %w, %y[%c, %t] : memref<4x8xf32>
      scan.yield
    }
  }
  func.return
}""",
    "state_shared_between_channels": """
func.func @f(%x: memref<4x8xf32>, %y: memref<4x8xf32>, %h: memref<f32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %c8 = arith.constant 8 : index
  scf.for %c = %c0 to %c4 step %c1 {
    scan.recurrence %c0 to %c8 step %c1 state(%h : memref<f32>) coeffs {
    ^bb0(%t: index):
      %v = memref.load %x[%c, %t] : memref<4x8xf32>
      scan.yield %v, %v : f32, f32
    } emit {
    ^bb0(%t: index, %s: memref<f32>):
      %v = memref.load %s[] : memref<f32>
      memref.store %v, %y[%c, %t] : memref<4x8xf32>
      scan.yield
    }
  }
  func.return
}""",
    "emit_steps_overlap": """
func.func @f(%x: memref<4x8xf32>, %y: memref<4x10xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c4 = arith.constant 4 : index
  %c8 = arith.constant 8 : index
  scf.for %c = %c0 to %c4 step %c1 {
    %h = memref.alloca() : memref<f32>
    %z = arith.constant 0.0 : f32
    memref.store %z, %h[] : memref<f32>
    scan.recurrence %c0 to %c8 step %c1 state(%h : memref<f32>) coeffs {
    ^bb0(%t: index):
      %v = memref.load %x[%c, %t] : memref<4x8xf32>
      scan.yield %v, %v : f32, f32
    } emit {
    ^bb0(%t: index, %s: memref<f32>):
      %v = memref.load %s[] : memref<f32>
      scf.for %k = %c0 to %c2 step %c1 {
        %i = arith.addi %t, %k : index
        memref.store %v, %y[%c, %i] : memref<4x10xf32>
      }
      scan.yield
    }
  }
  func.return
}""",
    "conditional_last_value": """
func.func @f(%x: memref<4x8xf32>, %y: memref<4xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %c8 = arith.constant 8 : index
  scf.for %c = %c0 to %c4 step %c1 {
    %h = memref.alloca() : memref<f32>
    %z = arith.constant 0.0 : f32
    memref.store %z, %h[] : memref<f32>
    scan.recurrence %c0 to %c8 step %c1 state(%h : memref<f32>) coeffs {
    ^bb0(%t: index):
      %v = memref.load %x[%c, %t] : memref<4x8xf32>
      scan.yield %v, %v : f32, f32
    } emit {
    ^bb0(%t: index, %s: memref<f32>):
      %v = memref.load %s[] : memref<f32>
      %p = arith.cmpf ogt, %v, %z : f32
      scf.if %p {
        memref.store %v, %y[%c] : memref<4xf32>
      }
      scan.yield
    }
  }
  func.return
}""",
}


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_rejected_forms_left_unchanged(name):
    from scanweaver.rewrites.blelloch_gpu import REFUSED_ATTR, refusals

    m = parse_ir(REJECTED[name])
    before = print_ir(m)
    ScanToGpu(block_size=4, items_per_thread=2).apply(make_context(), m)
    m2 = parse_ir(REJECTED[name])
    (why,) = lower_recurrences(m2, 4, 2).values()
    assert why
    # unchanged but for the note saying why, on the function
    (fn,) = [op for op in m.ops if op.name == "func.func"]
    assert refusals(fn) == [f"scan.recurrence: {why}"]
    del fn.attributes[REFUSED_ATTR]
    assert print_ir(m) == before


def test_general_bounds_and_step():
    """lb 3, step 2 over a dynamic ub: steps 3, 5, ..., emit guarded per step; the channel
    loop runs 1 to 5 step 2 (rows 1 and 3 only)."""
    text = """
func.func @f(%x: memref<5x?xf32>, %y: memref<5x?xf32>) {
  %c0 = arith.constant 0 : index
  %c5 = arith.constant 5 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c3 = arith.constant 3 : index
  %n = memref.dim %x, %c1 : memref<5x?xf32>
  scf.for %c = %c1 to %c5 step %c2 {
    %h = memref.alloca() : memref<f32>
    %z = arith.constant 0.5 : f32
    memref.store %z, %h[] : memref<f32>
    scan.recurrence %c3 to %n step %c2 state(%h : memref<f32>) coeffs {
    ^bb0(%t: index):
      %v = memref.load %x[%c, %t] : memref<5x?xf32>
      %a = arith.constant 0.9 : f32
      scan.yield %a, %v : f32, f32
    } emit {
    ^bb0(%t: index, %s: memref<f32>):
      %v = memref.load %s[] : memref<f32>
      memref.store %v, %y[%c, %t] : memref<5x?xf32>
      scan.yield
    }
  }
  func.return
}"""
    rng = np.random.default_rng(0)
    for L in (3, 4, 21):
        x = f32(rng, 5, L)
        ref = [x.copy(), np.zeros((5, L), np.float32)]
        got = [x.copy(), np.zeros((5, L), np.float32)]
        run_function(parse_ir(text), "f", *ref)
        m = parse_ir(text)
        assert not lower_recurrences(m, 4, 2)
        assert_host_only_launches(m)
        simulate_launch(m, "f", *got)
        np.testing.assert_allclose(got[1], ref[1], rtol=1e-5, atol=1e-6)


def test_conditional_per_step_store_and_inner_emit_loop():
    """Emit stores under a data-dependent scf.if (one element per step: fine) and a
    step-invariant store in an emit loop (last step only)."""
    text = """
func.func @f(%x: memref<3x11xf32>, %y: memref<3x11xf32>, %m: memref<3x2xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c3 = arith.constant 3 : index
  %c11 = arith.constant 11 : index
  scf.for %c = %c0 to %c3 step %c1 {
    %h = memref.alloca() : memref<f32>
    %z = arith.constant 0.0 : f32
    memref.store %z, %h[] : memref<f32>
    scan.recurrence %c0 to %c11 step %c1 state(%h : memref<f32>) coeffs {
    ^bb0(%t: index):
      %v = memref.load %x[%c, %t] : memref<3x11xf32>
      %a = arith.constant -0.8 : f32
      scan.yield %a, %v : f32, f32
    } emit {
    ^bb0(%t: index, %s: memref<f32>):
      %v = memref.load %s[] : memref<f32>
      %p = arith.cmpf ogt, %v, %z : f32
      scf.if %p {
        memref.store %v, %y[%c, %t] : memref<3x11xf32>
      }
      scf.for %k = %c0 to %c2 step %c1 {
        %kf = arith.index_cast %k : index to i32
        %kk = arith.sitofp %kf : i32 to f32
        %w = arith.mulf %v, %kk : f32
        memref.store %w, %m[%c, %k] : memref<3x2xf32>
      }
      scan.yield
    }
  }
  func.return
}"""
    rng = np.random.default_rng(5)
    args = [f32(rng, 3, 11), np.full((3, 11), 7.0, np.float32), np.zeros((3, 2), np.float32)]
    ref = [a.copy() for a in args]
    got = [a.copy() for a in args]
    run_function(parse_ir(text), "f", *ref)
    m = parse_ir(text)
    assert not lower_recurrences(m, 4, 2)
    simulate_launch(m, "f", *got)
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ["i32", "i64", "f64"])
def test_prefix_state_types(dtype):
    """Integer states wrap exactly like the oracle (bit for bit); f64 state."""
    rng = np.random.default_rng(1)
    if dtype == "f64":
        x = rng.uniform(0.5, 1.5, size=(3, 13))
        check(loops.cumprod_loops(3, 13, dtype), "cumprod", [x, np.zeros_like(x)], rtol=1e-12, atol=0)
    else:
        npdt = np.dtype(f"int{dtype[1:]}")
        info = np.iinfo(npdt)
        x = rng.integers(info.min, info.max, size=(3, 13), dtype=npdt, endpoint=True)
        check(loops.cumsum_loops(3, 13, dtype), "cumsum", [x, np.zeros_like(x)], rtol=0, atol=0)


def test_selective_scan_f16_io():
    """f16 inputs/outputs, f32 state (widened in coeffs, truncated in emit)."""
    opts = dict(dtype="f16", return_last_state=True)
    args = [a.astype(np.float16) for a in ssm_args(np.random.default_rng(2), 1, 2, 13, 3, **opts)]
    check(loops.selective_scan_loops(1, 2, 13, 3, **opts), "selective_scan", args, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("block_size,items", [(1, 1), (2, 3), (1, 4)])
def test_tiny_blocks(block_size, items):
    opts = dict(return_last_state=True)
    args = ssm_args(np.random.default_rng(block_size), 1, 2, 13, 3, **opts)
    check(loops.selective_scan_loops(1, 2, 13, 3, **opts), "selective_scan", args,
          block_size=block_size, items_per_thread=items)


RANK2_DYNAMIC = """
func.func @f(%x: memref<?x?x2x3xf32>, %a: memref<2x3xf32>, %y: memref<?x?x?xf32>, %hT: memref<?x?x2x3xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %B = memref.dim %x, %c0 : memref<?x?x2x3xf32>
  %L = memref.dim %x, %c1 : memref<?x?x2x3xf32>
  %D = memref.dim %y, %c1 : memref<?x?x?xf32>
  scf.for %b = %c0 to %B step %c1 {
    scf.for %d = %c0 to %D step %c1 {
      %h = memref.alloca() : memref<2x3xf32>
      %z = arith.constant 0.25 : f32
      %c3 = arith.constant 3 : index
      scf.for %i = %c0 to %c2 step %c1 {
        scf.for %j = %c0 to %c3 step %c1 {
          memref.store %z, %h[%i, %j] : memref<2x3xf32>
        }
      }
      scan.recurrence %c0 to %L step %c1 state(%h : memref<2x3xf32>) coeffs {
      ^bb0(%t: index, %i: index, %j: index):
        %v = memref.load %x[%b, %t, %i, %j] : memref<?x?x2x3xf32>
        %av = memref.load %a[%i, %j] : memref<2x3xf32>
        %dd = arith.index_cast %d : index to i32
        %df = arith.sitofp %dd : i32 to f32
        %w = arith.mulf %v, %df : f32
        scan.yield %av, %w : f32, f32
      } emit {
      ^bb0(%t: index, %s: memref<2x3xf32>):
        %s01 = memref.load %s[%c0, %c1] : memref<2x3xf32>
        %s12 = memref.load %s[%c1, %c2] : memref<2x3xf32>
        %r = arith.subf %s01, %s12 : f32
        memref.store %r, %y[%b, %d, %t] : memref<?x?x?xf32>
        scan.yield
      }
      scf.for %i = %c0 to %c2 step %c1 {
        scf.for %j = %c0 to %c3 step %c1 {
          %v = memref.load %h[%i, %j] : memref<2x3xf32>
          memref.store %v, %hT[%b, %d, %i, %j] : memref<?x?x2x3xf32>
        }
      }
    }
  }
  func.return
}"""


@pytest.mark.parametrize("B,L,D", [(2, 13, 3), (1, 1, 2)])
def test_rank2_state_dynamic_channel_loops(B, L, D):
    """A 2x3 state (coeffs over (t, i, j)), two dynamic channel loops -> grid term."""
    rng = np.random.default_rng(B * L)
    args = [f32(rng, B, L, 2, 3), f32(rng, 2, 3, lo=0.5, hi=1.0), np.zeros((B, D, L), np.float32),
            np.zeros((B, D, 2, 3), np.float32)]
    m = parse_ir(RANK2_DYNAMIC)
    assert not lower_recurrences(m, 4, 2)
    assert_host_only_launches(m)
    (desc,) = launch_descriptions(m)
    assert desc.grid == ("x.shape[0]*y.shape[1]", 1, 1)
    ref = [a.copy() for a in args]
    got = [a.copy() for a in args]
    run_function(parse_ir(RANK2_DYNAMIC), "f", *ref)
    simulate_launch(m, "f", *got)
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


def test_full_gpu_pipeline_two_functions():
    """scanweaver-lower{target=gpu} (raise, scan-to-gpu, canonicalize, cse) on a module
    with two recurrences: two kernels with distinct names, both still correct."""
    from xdsl.dialects.builtin import ModuleOp

    from scanweaver import compiler

    fns = [next(iter(mod.ops)).clone() for mod in (
        loops.selective_scan_loops(2, 2, 13, 3, bc="shared", return_last_state=True),
        loops.discounted_return_loops(3, 9),
    )]
    text = print_ir(ModuleOp(fns))
    low = compiler.lower(text, "gpu").module
    names = sorted(d.kernel_name for d in launch_descriptions(low))
    assert names == ["scan_recurrence_0", "scan_recurrence_1"]
    assert_host_only_launches(low)
    rng = np.random.default_rng(11)
    opts = dict(bc="shared", return_last_state=True)
    for fname, args in (
        ("selective_scan", ssm_args(rng, 2, 2, 13, 3, **opts)),
        ("discounted_return", [f32(rng, 3, 9), f32(rng, 3, lo=0.5, hi=1.0), f32(rng, 3),
                               np.zeros((3, 9), np.float32)]),
    ):
        ref = [a.copy() for a in args]
        got = [a.copy() for a in args]
        run_function(parse_ir(text), fname, *ref)
        simulate_launch(low, fname, *got)
        for r, g in zip(ref, got):
            np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


FUNCTION_LEVEL_BOUND = """
func.func @f(%x: memref<2x?xf32>, %y: memref<2x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c3 = arith.constant 3 : index
  %n = memref.dim %x, %c1 : memref<2x?xf32>
  %m = arith.subi %n, %c3 : index
  scf.for %c = %c0 to %c2 step %c1 {
    %h = memref.alloca() : memref<f32>
    %z = arith.constant 0.5 : f32
    memref.store %z, %h[] : memref<f32>
    scan.recurrence %c0 to %m step %c1 state(%h : memref<f32>) coeffs {
    ^bb0(%t: index):
      %v = memref.load %x[%c, %t] : memref<2x?xf32>
      %a = arith.constant 0.9 : f32
      scan.yield %a, %v : f32, f32
    } emit {
    ^bb0(%t: index, %s: memref<f32>):
      %v = memref.load %s[] : memref<f32>
      %t1 = arith.addi %t, %c3 : index
      memref.store %v, %y[%c, %t1] : memref<2x?xf32>
      scan.yield
    }
  }
  func.return
}"""


@pytest.mark.parametrize("L", [1, 3, 4, 20])
def test_bound_computed_in_function(L):
    """ub = dim - 3 computed on the host side (cloned into the kernel); negative -> no step."""
    rng = np.random.default_rng(L)
    x = f32(rng, 2, L)
    ref = [x.copy(), np.zeros((2, L), np.float32)]
    got = [x.copy(), np.zeros((2, L), np.float32)]
    run_function(parse_ir(FUNCTION_LEVEL_BOUND), "f", *ref)
    m = parse_ir(FUNCTION_LEVEL_BOUND)
    assert not lower_recurrences(m, 4, 2)
    assert_host_only_launches(m)
    simulate_launch(m, "f", *got)
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-5, atol=1e-6)
