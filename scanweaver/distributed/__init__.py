"""Sequence-parallel scans over `torch.distributed` (context parallelism).

Each rank holds one contiguous chunk of the time axis; ranks exchange only per-channel
chunk carries (one all-gather forward, one backward), O(channels) numbers whatever
the length.  Run under `torchrun` or any initialised process group (gloo on the CPU).
"""

from scanweaver.distributed.linear import linear_scan
from scanweaver.distributed.selective import selective_scan_fn

__all__ = ["linear_scan", "selective_scan_fn"]
