"""`scan-to-cpu`: lower scan ops to fast CPU loops (explicit `vector` dialect code).

A sequential scan is latency-bound on one multiply-add chain (shared/DESIGN.md section 3), so
every fast path here runs many *independent* chains at once, one per vector lane, while
keeping each chain's arithmetic exactly the sequential one (separate multiply and add,
no FMA contraction, the same order).  Results are therefore bit-identical to the
interpreter and to `scan-to-loops` for `scan.affine`.

scan.affine, time axis innermost (`(..., C, L)`, the usual row-major layout)
    Channels go in groups of G lanes (G = 256 bits / element width: 8 for f32/i32,
    4 for f64/i64).  Each time loop iteration loads a tile of G rows x T = 2G columns
    (64 bytes per row: one cache line), transposes it in registers with
    `vector.shuffle` (the classic unpack/shuffle/permute network; in the unmasked loop
    the loads pair half rows across the 128-bit lanes, leaving in-lane shuffles only
    for a and b), runs T steps of
    `h = a*h + b` on vector<G> (G chains in the lanes), transposes the states back and
    stores the rows.  Long rows are *skewed*: lane g works on time block k - s*g at
    iteration k (s = SKEW_BLOCKS = 1 by default), so that the G rows of a tile do not all hit the same
    cache set when the row length is a power of two (without the skew, 4 KiB-strided
    rows thrash L1 and alias in the store buffer: measured 2x slower).  The skewed edges, the time
    remainder (L mod T) and a partial channel group run a masked variant of the same
    body (`vector.maskedload` with the identity step `a = 1, b = -0.0` in lanes that
    have nothing to do, `vector.maskedstore`), so no scalar clean-up code is needed.
    When h is large (NONTEMPORAL_MIN_BYTES) and its rows are 32-byte aligned (runtime
    tests), the steady loop stores h with streaming stores (`nontemporal`, aligned:
    vmovntps), saving the read-for-ownership of every output line.
scan.affine, time axis not innermost (`(L, C)`: channels contiguous)
    No transposes: vector<G> loads across channels, 4 independent vectors per time
    loop (4G channels), then single vectors, then one masked vector.
scan.recurrence with a rank-1 static state `memref<N x f32|f64|i32|i64>` (the Mamba shape)
    The state lives in a `vector<N>` register value for the whole time loop.  The
    `coeffs` region is vectorised over the state index (values that do not depend on it
    stay scalar and are broadcast where needed; a load whose last index is the state
    index becomes `vector.load`, any other varying load a gather of scalar loads);
    `emit` is cloned with its inner `scf.for %n = 0 to N` reduction loops vectorised
    (`vector.reduction`, reassociated by default: `reassoc_reductions=false` keeps the
    sequential order), its loops over the state that store state elements elsewhere
    become vector stores, and any other read of the state reading the memref, which then
    is kept up to date every step.  Work that depends on time only (softplus of delta,
    silu(z), D*u: loads whose last index is the step) is vectorised over TIME_BLOCK = 16
    steps at a time, in a prologue of each block of unrolled steps, when it contains
    math functions or divisions (each step takes its element by a vector.extract; a
    stack buffer read by volatile loads, `STEP_BUFFERS`, measured slower); each block's prologue
    runs in the iteration before it (software pipelining, the same bits), so its long
    dependency chains overlap the previous block's steps.  `math.exp` and `math.log1p` inside are marked
    (`scanweaver.poly_exp`) for the next stage, `math-exp-to-polynomial{marked_only}`,
    which makes them the polynomials of `exp_polynomial.py` (vector and scalar): libm
    would be called per lane.
everything else (scan.scan, f16/bf16 inputs, rank-1 affine, non-identity layouts,
recurrences the vectoriser does not understand)
    the sequential lowering of `scan_to_loops.py`.

Files, one strategy each (this one holds the patterns and the pass):
  cpu_vector_builders.py        small builders, the in-register tile transpose
  cpu_affine_tiles.py           time innermost: skewed transposed tiles
  cpu_channel_groups.py         the loop over channel groups: scf.for, or scf.parallel (OpenMP)
  cpu_affine_channels.py        channels innermost: vectors across channels
  cpu_aggregate_arith.py        chunk-aggregate arithmetic per tile (exact, wide, double-double)
  cpu_chunk_aggregates.py       the chunk-aggregate kernel of the chunked scan
  cpu_recurrence_vectorizer.py  scan.recurrence: the state vector in registers
  cpu_blocked_dot.py            its readout dot product reduced a time block at a time (marked ops)
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.builder import Builder
from xdsl.context import Context
from xdsl.dialects.builtin import MemRefType, ModuleOp
from xdsl.ir import Block
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
    op_type_rewrite_pattern,
)
from xdsl.rewriter import InsertPoint

from scanweaver.dialects import scan
from scanweaver.rewrites.cpu_recurrence_vectorizer import MAX_STATE_LANES, _RecurrenceVectorizer, _Unsupported
from scanweaver.rewrites.cpu_vector_builders import _element_bits, _identity_layout, transpose_rows
from scanweaver.rewrites.scan_to_loops import LowerAffine, LowerRecurrence, LowerScan

# ---------------------------------------------------------------------------
# The patterns: which fast path applies, and the strategy that lowers it
# ---------------------------------------------------------------------------


def affine_fast_path(op: scan.AffineOp) -> str | None:
    """Which fast lowering applies ('tiled', 'channels'), or None for the sequential one."""
    h_t = op.h.type
    if not isinstance(h_t, MemRefType):
        return None
    el = h_t.element_type
    if _element_bits(el) is None:
        return None
    operands = [op.a, op.b, op.h] + [v for v in (op.init, op.final) if v is not None]
    for v in operands:
        if not _identity_layout(v.type):
            return None
        if v.type.element_type != el:  # type: ignore[attr-defined]
            return None  # f16/bf16 inputs widening to f32: sequential
    r = h_t.get_num_dims()
    if r < 2:
        return None
    return "tiled" if op.axis_value == r - 1 else "channels"


class LowerAffineCpu(RewritePattern):
    def __init__(
        self,
        skew: int = 1,
        prefetch: int = 0,
        prefetch_h: bool = False,
        parallel_channels: bool = False,
        nontemporal: bool = True,
    ):
        self.nontemporal = nontemporal
        self.skew = skew
        self.prefetch = prefetch
        self.prefetch_h = prefetch_h
        self.parallel_channels = parallel_channels

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: scan.AffineOp, rewriter: PatternRewriter) -> None:
        path = affine_fast_path(op)
        if path is None:
            return  # left for the sequential fallback
        b = Builder(InsertPoint.before(op))
        # The affine strategies are imported where they are used: a selective
        # scan's build never gets here (its cold first call skips their modules).
        if path == "tiled":
            from scanweaver.rewrites.cpu_affine_tiles import lower_affine_tiled

            lower_affine_tiled(
                b,
                op,
                self.skew,
                prefetch=self.prefetch,
                prefetch_h=self.prefetch_h,
                parallel=self.parallel_channels,
                nontemporal=self.nontemporal,
            )
        else:
            from scanweaver.rewrites.cpu_affine_channels import lower_affine_channels

            lower_affine_channels(b, op)
        rewriter.erase(op)


def recurrence_fast_path(op: scan.RecurrenceOp) -> bool:
    st = op.state_type
    if st.get_num_dims() != 1 or not _identity_layout(st):
        return False
    n = st.get_shape()[0]
    return 0 < n <= MAX_STATE_LANES and _element_bits(st.element_type) is not None


class LowerRecurrenceCpu(RewritePattern):
    def __init__(self, reassoc: bool = True, poly_exp: bool = True):
        self.reassoc = reassoc
        self.poly_exp = poly_exp

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: scan.RecurrenceOp, rewriter: PatternRewriter) -> None:
        if not recurrence_fast_path(op):
            return
        scratch = Block()
        try:
            _RecurrenceVectorizer(op, self.reassoc).build(Builder(InsertPoint.at_end(scratch)))
        except _Unsupported:
            for o in reversed(list(scratch.ops)):
                o.detach()
                o.erase(safe_erase=False)
            return  # the sequential lowering takes it
        if self.poly_exp:  # expanded by the `math-exp-to-polynomial` stage after this pass
            from scanweaver.rewrites.exp_polynomial import mark_for_polynomial

            for o in list(scratch.ops):
                mark_for_polynomial(o)
        for o in list(scratch.ops):
            o.detach()
            rewriter.insert(o, InsertPoint.before(op))
        rewriter.erase(op)


# ---------------------------------------------------------------------------
# The pass
# ---------------------------------------------------------------------------


#: Default skew of long rows: 1 time block (64 bytes) between neighbouring lanes.
#: Measured here (one core, thread CPU time, interleaved calls, medians of 9-11 on a
#: loaded machine; time with skew 1 over time with 2): f32 1024x4096 0.86-0.93,
#: 64x65536 0.87-0.96, 16x4096 (in L2) 0.95-0.97; i32 0.83 / 0.93; f64 0.96 / 1.00;
#: two threads on row halves, f32: 0.89 / 0.97 (wall).  Skew 0 loses at 64x65536
#: (1.32: the lanes' lines fall in one cache set).  Half the masked edge iterations
#: (2 * (G-1) * skew per group) of the larger skew, too.
SKEW_BLOCKS = 1


@dataclass(frozen=True)
class ScanToCpu(ModulePass):
    """Lower scan ops to vectorised CPU loops; sequential loops where no fast path applies.

    Options: `skew` (time blocks between neighbouring lanes of a tile, >= 1: lanes read
    lines of different cache sets, whatever the rows' 4 KiB-multiple stride; see
    SKEW_BLOCKS for the default),
    `prefetch` (software prefetch distance of a and b, in time blocks; 0 = none),
    `reassoc_reductions` (tree-order vector reductions in recurrence consumers: faster,
    not bit-identical to the sequential sum), `poly_exp` (mark math.exp inside
    vectorised recurrences for the polynomial stage), `parallel_channels` (the loop over channel groups of a
    time-innermost `scan.affine` is an `scf.parallel`, for `convert-scf-to-openmp`),
    `nontemporal` (streaming stores of large, 32-byte aligned h: NONTEMPORAL_MIN_BYTES).
    """

    name = "scan-to-cpu"

    skew: int = SKEW_BLOCKS
    prefetch: int = 16
    prefetch_h: bool = False
    reassoc_reductions: bool = True
    poly_exp: bool = True
    parallel_channels: bool = False
    nontemporal: bool = True

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        PatternRewriteWalker(
            GreedyRewritePatternApplier(
                [
                    LowerAffineCpu(
                        max(1, self.skew), max(0, self.prefetch), self.prefetch_h, self.parallel_channels,
                        self.nontemporal,
                    ),
                    LowerRecurrenceCpu(self.reassoc_reductions, self.poly_exp),
                ]
            ),
            apply_recursively=False,
        ).rewrite_module(op)
        # Whatever is left takes the sequential lowering.
        PatternRewriteWalker(
            GreedyRewritePatternApplier([LowerAffine(), LowerScan(), LowerRecurrence()]),
            apply_recursively=False,
        ).rewrite_module(op)


__all__ = [
    "ScanToCpu",
    "affine_fast_path",
    "transpose_rows",
]
