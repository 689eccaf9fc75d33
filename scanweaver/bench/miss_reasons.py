"""Why a benchmark goal is missed: the causes found so far, in words (no figures: the
harness writes every number).  The README prints a reason next to each goal a run
misses, and "not analysed" where nobody has found the cause yet.

Each rule is (goal kind, test on the case label, reason); the first match wins.
"""

from __future__ import annotations

from typing import Any

#: What the CPU selective kernel spends its time on (the selective goals' reasons).
_SELECTIVE_KERNEL = (
    "The selective scan is compute-bound on this CPU (see the state-updates/s table against the compute "
    "roofline, the state update alone compiled with the kernel's exp). Per state element and step the kernel "
    "computes exp(delta*A) (the fused polynomial, with AVX-512 scaling where the CPU has it), the update as "
    "a separate multiply and add (bit-identical to the loop, so one dependent chain per channel), "
    "B*(delta*u) and C*h; per step, the softplus of delta and the silu of z (computed a time block ahead, "
    "beside the previous block's steps) and the C.h reduction tree.")

_RULES: list[tuple[str, str, str]] = [
    # (measure, substring of the case label ("" matches every case), reason)
    ("best_peer", "f64",
     "f64 outputs at these shapes are 32 MiB and more, over glibc's mmap threshold, so a fresh output "
     "page-faults on every call (numba's too); the large-output cache removes that for ScanWeaver. Where "
     "the ratio is still under the target, f64 rows stay bit-identical to the sequential loop (a separate "
     "multiply and add) while numba prange with fastmath contracts them into one FMA and scans one row per "
     "thread (three streams per core against the tiled kernel's twelve)."),
    ("best_peer", "i32",
     "Few rows (fewer than the vector lanes) take the i32 time-lanes kernel and the other shapes the tiled "
     "kernel; at these shapes both ScanWeaver and numba prange are memory-bound on this shared 2-core VM, and "
     "their ratio moves across the target between quiet runs by more than its margin. A kernel with fewer "
     "row streams per core is the open work."),
    ("best_peer", "f32 4x1048576",
     "Few long rows take the cache-blocked chunked form (each block's sub-chunk aggregates read from memory, "
     "then the block scanned again from L2 once its carries are known, h written by streaming stores): the "
     "memory traffic of one pass, but about twice the per-step work of a sequential scan (both passes at the "
     "tiled kernel's rate per element), while numba's one row per thread does the work once and has enough "
     "rows for both cores."),
    ("best_peer", "",
     "The margin over numba prange (fastmath) is real but under the target: the tiled kernel is limited by "
     "its access pattern (eight or more row streams per array per core), not by the multiply-add chain or "
     "the register transposes, which experiments ruled out."),
    ("roofline_fraction", "",
     "With its rows in L2, one core runs the f32 tiled kernel at the latency of its chain: each tile of 8 "
     "rows x 16 steps is 16 dependent steps of a multiply, then an add (kept bit-identical to the loop, no "
     "FMA), and that rate is no faster than one core's share of the roofline; streaming from memory, each "
     "core is slower still (its row streams' misses add to the chain), so two cores stay under 85% of it. "
     "A second independent chain per f32 tile needs more vector registers than the CPU has (spills, and "
     "slower from memory). The few-long-rows shapes take the cache-blocked chunked form and the single row "
     "the two-pass chunked form, which scan each step twice (the first pass's aggregates one sub-chunk per "
     "vector lane, cheaper than a tiled pass, then the tiled rescan)."),
    ("backward_over_forward", "",
     "The VJP makes about three passes over each channel's steps where the forward makes one: the "
     "forward scan that keeps every state (and stores exp(delta*A) of every state element for the "
     "reverse), the reverse of the emit (with the readout sum_n C[n] h[n] again) and the fused "
     "adjoint scan; the two scans, the largest parts of a profile, run at their step-to-step latency "
     "(a multiply, then an add, kept bit-identical; one channel at a time, so nothing hides it: reducing "
     "the adjoint's two sums over the state a block of steps at a time, as the forward's readout, cut its "
     "instructions by a third and not its time); and it writes three fresh (batch, D, L) gradients where "
     "the forward writes one; see `python -m scanweaver.bench.vjp_stages`."),
    ("jax-lax-scan", "",
     _SELECTIVE_KERNEL),
    ("torch-ref", "",
     "ScanWeaver's time is about proportional to batch x D x L x N at these shapes and the PyTorch reference's "
     "is not (its per-case tables at equal batch x D x L differ), so the ratio is lowest where the "
     "reference is relatively fastest. " + _SELECTIVE_KERNEL),
    ("tiny_call", "",
     "What is left is the Python call itself: argument checks, the cache lookup and the ctypes call."),
    ("neighbours", "",
     "A neighbour's OpenMP workers (GNU libgomp: PyTorch's, and numba's when its prange code ran before "
     "ScanWeaver loaded libomp) spin for milliseconds after each region and share the two cores with "
     "ScanWeaver's next call. ScanWeaver runs on numba's spinning libgomp threads instead, except on an "
     "oversubscribed machine (load above twice the CPUs: libgomp's spinning barriers then cost more), and "
     "its libomp workers sleep as soon as a region ends; see each row's policy above."),
    ("first_call_cold", "",
     "A cold linear_scan runs its first call on the sequential loop built directly as LLVM IR and JIT-compiled "
     "(runtime/cpu_loop_tier.py: no xDSL, no MLIR tool; the tile kernel compiles in a child process once that "
     "call has returned); a cold selective_scan has no first tier: its first call builds the full kernel "
     "(xDSL, mlir-opt, mlir-translate, LLVM O3). A cold process also compiles every module it imports to "
     "bytecode."),
]


def reason_for(measure: str, label: str = "") -> str:
    """The known cause of a missed goal, or 'not analysed yet'."""
    for kind, part, why in _RULES:
        if kind == measure and part in label:
            return why
    return "Not analysed yet."


def first_call_cold_reason(breakdown: dict[str, Any], top: int = 3) -> str:
    """The cold first-call reason (`first_call_cold`) followed by what the harness's
    breakdown measured (cpu_goals.first_call's "breakdown": per function, profiled
    seconds by stage): the largest stages' shares, and the heavy packages loaded."""
    parts = []
    for what, row in breakdown.items():
        stages, total = row.get("stages_s") or {}, row.get("profiled_s") or 0.0
        if "error" in row or total <= 0:
            continue
        largest = sorted(stages.items(), key=lambda kv: -kv[1])[:top]
        shares = ", ".join(f"{name} {100 * sec / total:.0f}%" for name, sec in largest)
        loaded = ", ".join(row.get("packages") or []) or "none of xdsl, llvmlite, numba, torch, jax"
        parts.append(f"{what}: {shares} (packages loaded: {loaded})")
    measured = (" Measured (the breakdown below, cProfile of a cold process): " + "; ".join(parts) + ".") if parts else ""
    return reason_for("first_call_cold") + measured


def shortfall(measured: float, target: float, at_most: bool) -> str:
    """How far a measured value is from its target, as a percentage of the target."""
    gap = (measured - target) if at_most else (target - measured)
    pct = 100 * gap / target
    return f"{pct:.0f}%" if pct >= 1 else f"{pct:.1f}%"
