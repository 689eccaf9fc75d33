"""64-bit states on the GPU: a vector state of N f64 or i64 values takes two registers
per value, and its per-item values do too, so the recurrence kernels count their
register budgets in 32-bit words (`complex_gpu.state_words`, `component_words`;
`recurrence_gpu.state_word_limit`). Swept through ptxas for sm_80 and sm_90 at the
default options: f32, f64 and i64 at N = 1 .. 64, the selective scan's three B/C forms
(constant (D, N), shared (batch, N, L), grouped (batch, G, N, L)), one block per channel
and time blocks; every kernel without spills or a stack frame. Counted by elements, the
f64 selective scan at N >= 16 spilled (N = 16: 20 to 580 spill stores). The kernels the
budgets now pick run like the loops in the simulator: f64 to rounding, i64 bit for bit."""

from __future__ import annotations

import os

import numpy as np
import pytest

from scanweaver.interp.gpu_sim import simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import make_context, parse_ir, print_ir
from scanweaver.rewrites.launch import launch_descriptions
from scanweaver.rewrites.raise_affine import RaiseRecurrences
from scanweaver.rewrites.recurrence_gpu import MAX_F64_STATE, lower_recurrences
from scanweaver.rewrites.recurrence_time_blocks import TIME_BLOCKS_MAX_F64_STATE
from scanweaver.rewrites.scan_to_gpu import ScanToGpu
from scanweaver.toolchain.gpu_export import export_gpu, ptxas_available
from scanweaver.workloads.loops import selective_scan_loops

BC_FORMS = ("constant", "shared", "grouped")
GROUPS = 2  # grouped B/C: channels per group D / GROUPS


def bc_shape(bc: str, batch: int, D: int, N: int, L: int) -> tuple[int, ...]:
    return {"constant": (D, N), "shared": (batch, N, L), "grouped": (batch, GROUPS, N, L)}[bc]


def linear_state_ir(T: str, batch: int, D: int, L: int, N: int, bc: str) -> str:
    """The selective scan's shape written by hand, without exp (so that integers take
    it): h[n] = A[d, n] h[n] + B[.., n, ..] x[b, d, t]; y[b, d, t] = sum_n C[.., n, ..] h[n]."""
    mul, add = ("arith.muli", "arith.addi") if T.startswith("i") else ("arith.mulf", "arith.addf")
    zero = "0" if T.startswith("i") else "0.0"
    bct = "memref<" + "x".join(map(str, bc_shape(bc, batch, D, N, L))) + f"x{T}>"
    xt = f"memref<{batch}x{D}x{L}x{T}>"
    idx = {"constant": "%d, %n", "shared": "%b, %n, %t", "grouped": "%b, %g, %n, %t"}[bc]
    return f"""
func.func @linear(%x: {xt}, %A: memref<{D}x{N}x{T}>, %B: {bct}, %C: {bct}, %y: {xt}) {{
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %cB = arith.constant {batch} : index
  %cD = arith.constant {D} : index
  %cL = arith.constant {L} : index
  %cN = arith.constant {N} : index
  %cP = arith.constant {D // GROUPS} : index
  %zero = arith.constant {zero} : {T}
  scf.for %b = %c0 to %cB step %c1 {{
    scf.for %d = %c0 to %cD step %c1 {{
      %h = memref.alloca() : memref<{N}x{T}>
      scf.for %n = %c0 to %cN step %c1 {{
        memref.store %zero, %h[%n] : memref<{N}x{T}>
      }}
      scf.for %t = %c0 to %cL step %c1 {{
        %xv = memref.load %x[%b, %d, %t] : {xt}
        %acc = scf.for %n = %c0 to %cN step %c1 iter_args(%s = %zero) -> ({T}) {{
          %g = arith.divui %d, %cP : index
          %hv = memref.load %h[%n] : memref<{N}x{T}>
          %a = memref.load %A[%d, %n] : memref<{D}x{N}x{T}>
          %bv = memref.load %B[{idx}] : {bct}
          %bx = {mul} %bv, %xv : {T}
          %ah = {mul} %a, %hv : {T}
          %hn = {add} %ah, %bx : {T}
          memref.store %hn, %h[%n] : memref<{N}x{T}>
          %cv = memref.load %C[{idx}] : {bct}
          %ch = {mul} %hn, %cv : {T}
          %s2 = {add} %s, %ch : {T}
          scf.yield %s2 : {T}
        }}
        memref.store %acc, %y[%b, %d, %t] : {xt}
      }}
    }}
  }}
  func.return
}}
"""


def module_for(dtype: str, N: int, bc: str, batch: int = 1, D: int = 2, L: int = 4096):
    """The f32 / f64 selective scan (softplus, exp, D skip, z gate) or the i64 linear
    form, raised."""
    if dtype == "i64":
        m = parse_ir(linear_state_ir(dtype, batch, D, L, N, bc))
    else:
        m = selective_scan_loops(batch, D, L, N, bc=bc, groups=GROUPS, dtype=dtype)
    RaiseRecurrences().apply(make_context(), m)
    return m


def lower(m, time_blocks: str, **opts):
    ScanToGpu(time_blocks=time_blocks, **opts).apply(make_context(), m)
    return m


def expected_kernels(dtype: str, N: int, time_blocks: str) -> int:
    """1 per channel-block nest, 3 for the time blocks (f64 beyond 8 values: one block
    per channel, `TIME_BLOCKS_MAX_F64_STATE`); 0 where f64 is refused (`MAX_F64_STATE`)."""
    if (dtype == "f64" and N > MAX_F64_STATE) or (dtype == "i64" and N > 32):
        return 0
    wide_f64 = dtype == "f64" and N > TIME_BLOCKS_MAX_F64_STATE
    return 3 if time_blocks == "always" and not wide_f64 else 1


def spills(dtype: str, N: int, chip: str) -> dict[str, tuple[int, int, int]]:
    """ptxas (registers, spill stores + loads, stack bytes) of every kernel of the three
    B/C forms, one block per channel and time blocks, those with spills or a stack only."""
    bad = {}
    for bc in BC_FORMS:
        for tb in ("never", "always"):
            m = lower(module_for(dtype, N, bc), tb)
            assert len(launch_descriptions(m)) == expected_kernels(dtype, N, tb), (bc, tb)
            if not launch_descriptions(m):
                continue
            out = export_gpu(m, chip)
            for kernel, info in out["ptxas"].items():
                spilled = info["spill_stores"] + info["spill_loads"]
                if spilled or info["stack_bytes"]:
                    bad[f"{bc}/{tb}/{kernel}"] = (info["registers"], spilled, info["stack_bytes"])
    return bad


#: The whole sweep takes over 20 minutes of ptxas; `make test` runs the sizes at the
#: edges of each budget (the largest f64 and i64 states built, the register-word steps at
#: 8 and 16 values) and SCANWEAVER_FULL_SWEEP=1 runs every combination.
_FULL_SWEEP = [(d, n, c) for d in ("f32", "f64", "i64") for n in (1, 4, 8, 16, 24, 32, 64) for c in ("sm_80", "sm_90")]
_EDGE_SWEEP = [("f64", 8, "sm_90"), ("f64", 16, "sm_80"), ("f64", 16, "sm_90"), ("i64", 16, "sm_90"),
               ("i64", 32, "sm_80"), ("i64", 32, "sm_90"), ("i64", 64, "sm_90"), ("f64", 24, "sm_90")]


@pytest.mark.skipif(not ptxas_available(), reason="ptxas not found on PATH: spills not checked")
@pytest.mark.parametrize("dtype, N, chip", _FULL_SWEEP if os.environ.get("SCANWEAVER_FULL_SWEEP") else _EDGE_SWEEP)
def test_no_spills_across_state_sizes_and_types(dtype, N, chip):
    assert spills(dtype, N, chip) == {}, (dtype, N, chip)


def run_both(text: str, fname: str, args, time_blocks: str):
    ref = [a.copy() for a in args]
    got = [a.copy() for a in args]
    run_function(parse_ir(text), fname, *ref)
    m = parse_ir(text)
    RaiseRecurrences().apply(make_context(), m)
    lower(m, time_blocks, block_size=32, chunk_tiles=1)
    assert launch_descriptions(m), "no kernel"
    simulate_launch(m, fname, *got)
    return ref, got, m


@pytest.mark.parametrize("tb", ["never", "always"])
@pytest.mark.parametrize("bc", BC_FORMS)
def test_i64_state_bit_exact(bc, tb):
    """N = 24 i64 (48 words: one item per thread, the sweep): wrapping products, the
    simulator's bits are the loop's."""
    batch, D, L, N = 1, 2, 100, 24
    rng = np.random.default_rng(N)
    ints = lambda *s: rng.integers(-(2**40), 2**40, s, dtype=np.int64)  # noqa: E731
    args = [ints(batch, D, L), ints(D, N), ints(*bc_shape(bc, batch, D, N, L)),
            ints(*bc_shape(bc, batch, D, N, L)), np.zeros((batch, D, L), np.int64)]
    ref, got, m = run_both(linear_state_ir("i64", batch, D, L, N, bc), "linear", args, tb)
    assert all("items_per_thread=1" in d.notes for d in launch_descriptions(m) if "tb" not in d.kernel_name)
    np.testing.assert_array_equal(got[-1], ref[-1])


@pytest.mark.parametrize("tb", ["never", "always"])
@pytest.mark.parametrize("bc", BC_FORMS)
def test_f64_selective_scan_runs_like_the_loops(bc, tb):
    """N = 16 f64: one item per thread and the sweep (`state_word_limit`), f64 to
    rounding."""
    batch, D, L, N = 1, 2, 100, 16
    module = selective_scan_loops(batch, D, L, N, bc=bc, groups=GROUPS, dtype="f64")
    rng = np.random.default_rng(7)
    bcs = bc_shape(bc, batch, D, N, L)
    args = [
        rng.uniform(-1, 1, (batch, D, L)),      # u
        rng.uniform(0, 0.5, (batch, D, L)),     # delta
        -rng.uniform(0.1, 1, (D, N)),           # A
        rng.uniform(-1, 1, bcs),                # B
        rng.uniform(-1, 1, bcs),                # C
        rng.uniform(-1, 1, D),                  # D skip
        rng.uniform(-1, 1, (batch, D, L)),      # z
        rng.uniform(-0.1, 0.1, D),              # delta bias
        np.full((batch, D, L), np.nan),         # out
    ]
    ref, got, m = run_both(print_ir(module), "selective_scan", args, tb)
    notes = " ".join(d.notes for d in launch_descriptions(m))
    assert "f64" in notes and "items_per_thread=1" in notes
    assert np.all(np.isfinite(got[-1]))
    np.testing.assert_allclose(got[-1], ref[-1], rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("N", [24, 32, 64])
def test_f64_states_beyond_16_values_are_refused(N):
    """No spilling kernel: the recurrence is left for the CPU with the reason."""
    m = module_for("f64", N, "shared", L=64)
    (why,) = lower_recurrences(m, 128, 4, time_blocks="always").values()
    assert why == f"a state of {N} f64 values: the recurrence kernel takes at most 16 (more spill registers in ptxas)"
    assert not launch_descriptions(m)


def test_f64_time_blocks_stop_at_8_values():
    notes = [d.notes for d in launch_descriptions(lower(module_for("f64", 8, "shared", L=64), "always"))]
    assert len(notes) == 3 and "time blocks" in notes[0]
    (note,) = [d.notes for d in launch_descriptions(lower(module_for("f64", 16, "shared", L=64), "always"))]
    assert "2 channel loop(s), state 16 f64" in note and "items_per_thread=1" in note


def test_items_per_thread_count_register_words():
    from xdsl.dialects.builtin import ComplexType, f32, f64, i64

    from scanweaver.rewrites.recurrence_gpu import items_for_state

    assert [items_for_state(n, 4, f32) for n in (8, 32, 33)] == [4, 4, 1]
    assert [items_for_state(n, 4, t) for t in (f64, i64) for n in (8, 9)] == [4, 1, 4, 1]
    assert [items_for_state(n, 4, ComplexType(f64)) for n in (4, 5)] == [4, 1]


def test_i64_states_beyond_128_register_words_are_refused():
    m = module_for("i64", 64, "constant", L=64)
    (why,) = lower_recurrences(m, 128, 4, time_blocks="always").values()
    assert why == ("a state of 64 i64 values (256 register words): the recurrence kernel takes at most 128 "
                   "(more spill in ptxas)")
    assert not launch_descriptions(m)
