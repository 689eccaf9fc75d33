"""The `scan-to-gpu` pass: every scan op to GPU kernels, one lowering per op kind.

`scan.affine` (`blelloch_gpu.py`: one block per channel, chained tiles; or in time
across blocks, `affine_time_blocks.py`), `scan.recurrence` loop nests
(`recurrence_gpu.py`; those it refuses with a 2-D state too large for registers that
emit sums over: `gpu_state_matrix.py`), `scan.linear_recurrence` nests (`linear_gpu.py`) and generic
`scan.scan` ops (`scan_gpu.py`, or `scan_time_blocks.py` for few long channels);
first, channel nests whose body is a sequential program (VJPs) become one-thread-per-
channel kernels (`gpu_channel_program.py`), then channel loops holding several scan ops
are split into one nest per scan op where that keeps the result (`gpu_fission.py`).
Ops a lowering cannot take stay for the sequential lowering; why is noted on their
function (`blelloch_gpu.record_refusals`).  Last, every kernel's 16-byte vector
branches also test that the bases are 16-byte aligned (`gpu_aligned_bases.py`), so
device views that start anywhere run, on the scalar path.  Options: see `blelloch_gpu.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation
from xdsl.passes import ModulePass

from scanweaver.dialects import scan
from scanweaver.errors import ScanWeaverError
from scanweaver.rewrites.affine_time_blocks import lower_affine_time_blocks, wants_time_blocks
from scanweaver.rewrites.blelloch_gpu import get_kernel_module, lower_affine, record_refusals
from scanweaver.rewrites.gpu_channel_program import buffers_to_scratch, lower_channel_programs, lower_loop_stages
from scanweaver.rewrites.gpu_aligned_bases import guard_vector_paths
from scanweaver.rewrites.gpu_fission import split_recurrence_nests
from scanweaver.rewrites.gpu_kernel import Unsupported
from scanweaver.rewrites.gpu_state_matrix import lower_state_matrices
from scanweaver.rewrites.linear_gpu import lower_linear_recurrences
from scanweaver.rewrites.recurrence_gpu import lower_recurrences
from scanweaver.rewrites.scan_gpu import lower_scans
from scanweaver.rewrites.scan_time_blocks import fix_scratch_launches, lower_scan_time_blocks
from scanweaver.rewrites.scan_time_blocks import wants_time_blocks as scan_wants_time_blocks


@dataclass(frozen=True)
class ScanToGpu(ModulePass):
    """Lower `scan.affine`, `scan.recurrence` / `scan.linear_recurrence` nests and generic
    `scan.scan` ops to tiled Blelloch scan kernels."""

    name = "scan-to-gpu"

    block_size: int = 128
    items_per_thread: int = 4
    diagnose: bool = False
    # scan.affine in time across blocks (affine_time_blocks.py): "auto" (few static
    # channels and long rows, or the op's scanweaver.gpu_strategy attribute), "always", "never"
    time_blocks: str = "auto"
    chunk_tiles: int = 16  # tiles per time chunk of a multi-block scan

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        bs, ipt = self.block_size, self.items_per_thread
        if bs < 1 or bs > 1024 or bs & (bs - 1):
            raise ScanWeaverError(f"scan-to-gpu: block-size must be a power of two in [1, 1024], got {bs}")
        if ipt < 1 or ipt > 64:
            raise ScanWeaverError(f"scan-to-gpu: items-per-thread must be in [1, 64], got {ipt}")
        if self.time_blocks not in ("auto", "always", "never"):
            raise ScanWeaverError(f"scan-to-gpu: time-blocks must be auto, always or never, got {self.time_blocks!r}")
        if self.chunk_tiles < 1:
            raise ScanWeaverError(f"scan-to-gpu: chunk-tiles must be at least 1, got {self.chunk_tiles}")
        # per-channel sequential programs (VJPs): one thread per channel, whole body
        channel_refused = {**lower_channel_programs(op), **lower_loop_stages(op)}
        split_recurrence_nests(op)  # one scan op per channel nest (gpu_fission.py)
        affines = [o for o in op.walk() if isinstance(o, scan.AffineOp)]
        if affines:
            kmod = get_kernel_module(op)
            chunk = bs * ipt * self.chunk_tiles
            for aff in affines:
                if self.time_blocks == "always" or (self.time_blocks == "auto" and wants_time_blocks(aff, chunk)):
                    lower_affine_time_blocks(aff, kmod, bs, ipt, self.chunk_tiles)
                else:
                    lower_affine(aff, kmod, bs, ipt)
        # Fused producer/consumer recurrences (loop nests around scan.recurrence); a 2-D
        # state too large for registers whose emit sums over it: gpu_state_matrix.py.
        refused: dict[Operation, str] = lower_state_matrices(
            op,
            dict(lower_recurrences(op, bs, ipt, time_blocks=self.time_blocks, chunk_tiles=self.chunk_tiles)),
            bs,
        )
        # Coupled (matrix-valued) recurrences, then generic combines.
        refused.update(lower_linear_recurrences(op, bs, ipt))
        # generic scans with few long channels: in time across blocks (scan_time_blocks.py)
        scratch: dict = {}
        for s in [o for o in op.walk() if isinstance(o, scan.ScanOp)]:
            if scan_wants_time_blocks(s, bs * ipt * self.chunk_tiles, self.time_blocks):
                try:
                    lower_scan_time_blocks(s, op, bs, ipt, self.chunk_tiles, scratch)
                except Unsupported:
                    pass  # lower_scans says why
        refused.update(lower_scans(op, bs, ipt, scratch))
        if scratch:
            fix_scratch_launches(op, scratch)
        buffers_to_scratch(op)  # temporaries between kernel stages (gpu_channel_program.py)
        guard_vector_paths(op)  # a misaligned base (a device view) takes the scalar path
        record_refusals({**refused, **channel_refused}, diagnose=self.diagnose)


__all__ = ["ScanToGpu"]
