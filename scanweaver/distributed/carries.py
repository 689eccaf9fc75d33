"""Chunk carries for sequence-parallel affine scans: what each rank sends, and the fold.

Rank r holds a contiguous time chunk of every channel.  Scanning its chunk from a zero
state gives `B_r` (the chunk's final state) and the chunk multiplies an incoming state by
`A_r = prod(a)`, so the state entering rank r+1 is `A_r * carry_r + B_r`.  One
all-gather of these per-channel aggregates lets every rank fold the carries of the ranks
before it: O(channels) numbers per rank, whatever the chunk length.

Floats: `A_r` over a long chunk overflows or underflows where the sequential loop never
forms it (the time-chunked CPU variant's `inf * 0 = NaN`), so it travels as float64
`(log|A|, sign, has-zero)` and `A_r * carry` is formed as one `exp(log|A| + log|carry|)`:
a product over a zero carry is exactly zero, and no intermediate overflows.  Integers
wrap around like C, so their products are exact in int64 and the fold is bit-exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from scanweaver.distributed.collectives import run_collective

# Rows of the float aggregate (float64), one column per channel.
_LOG_ABS, _NEGATIVE, _HAS_ZERO, _B, _FIRST_A, _LAST_A, _H0, _NONEMPTY = range(8)
_ROWS = 8


@dataclass(frozen=True)
class RankCarries:
    """What one rank learns from the all-gather."""

    carry_in: np.ndarray  # the state entering this rank's chunk, per channel
    final: np.ndarray  # the state after the whole sequence, per channel
    first_a: np.ndarray  # (world, channels): first `a` of each rank's chunk
    last_a: np.ndarray  # (world, channels): last `a` of each rank's chunk
    nonempty: np.ndarray  # (world,): which ranks hold at least one step


def chunk_aggregate(a: np.ndarray, b_final: np.ndarray, h0: np.ndarray | None) -> np.ndarray:
    """This rank's row block for the all-gather; `a` is (channels, L), `b_final` the
    chunk's final state from a zero start (channels,), `h0` the initial state or None."""
    channels, length = a.shape
    out = np.zeros((_ROWS, channels), dtype=np.float64 if _is_float(a) else np.int64)
    if _is_float(a):
        with np.errstate(divide="ignore", invalid="ignore"):
            a64 = a.astype(np.float64)
            out[_LOG_ABS] = np.log(np.abs(a64)).sum(axis=1) if length else 0.0
            out[_NEGATIVE] = (np.signbit(a64).sum(axis=1) % 2) if length else 0
            out[_HAS_ZERO] = (a64 == 0).any(axis=1) if length else 0
    else:
        # Row _LOG_ABS holds the wrapped product itself for integers.
        out[_LOG_ABS] = np.prod(a.astype(np.int64), axis=1) if length else 1
    out[_B] = b_final
    if length:
        out[_FIRST_A] = a[:, 0]
        out[_LAST_A] = a[:, -1]
        out[_NONEMPTY] = 1
    if h0 is not None:
        out[_H0] = h0
    return out


def gather_aggregates(block: np.ndarray, group, what: str) -> np.ndarray:
    """All-gather every rank's block: (world, rows, channels).  Every rank must call it."""
    world = dist.get_world_size(group)
    mine = torch.from_numpy(np.ascontiguousarray(block)).to(_collective_device(group))
    parts = [torch.empty_like(mine) for _ in range(world)]
    run_collective(lambda: dist.all_gather(parts, mine, group=group), group, what,
                   world * mine.numel() * mine.element_size())
    return np.stack([p.cpu().numpy() for p in parts])


def fold_carries(blocks: np.ndarray, rank: int, reverse: bool, state_dtype) -> RankCarries:
    """Fold the gathered aggregates in time order; the scan starts on rank 0 (forward) or
    on the last rank (reverse), whose `h0` row is the initial state."""
    world = blocks.shape[0]
    order = list(range(world - 1, -1, -1)) if reverse else list(range(world))
    is_float = np.issubdtype(blocks.dtype, np.floating)
    carry = blocks[order[0], _H0].copy()
    carry_in = None
    for r in order:
        if r == rank:
            carry_in = carry.copy()
        if blocks[r, _NONEMPTY].any():
            carry = (_combine_float if is_float else _combine_int)(blocks[r], carry)
    assert carry_in is not None
    return RankCarries(
        carry_in=_to_state(carry_in, state_dtype),
        final=_to_state(carry, state_dtype),
        first_a=blocks[:, _FIRST_A],
        last_a=blocks[:, _LAST_A],
        nonempty=blocks[:, _NONEMPTY].any(axis=1),
    )


def _combine_float(block: np.ndarray, carry: np.ndarray) -> np.ndarray:
    """`A * carry + B` without forming `A` (float64)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        magnitude = np.exp(block[_LOG_ABS] + np.log(np.abs(carry)))
        negative = (block[_NEGATIVE] % 2 == 1) ^ np.signbit(carry)
        term = np.where(negative, -magnitude, magnitude)
        # Exactly zero when a factor or the carry is zero (a NaN carry stays NaN).
        zero = (block[_HAS_ZERO] != 0) | (carry == 0)
        term = np.where(zero & ~np.isnan(carry), 0.0, term)
        return term + block[_B]


def _combine_int(block: np.ndarray, carry: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return block[_LOG_ABS] * carry + block[_B]


def _to_state(x: np.ndarray, state_dtype) -> np.ndarray:
    if np.issubdtype(state_dtype, np.integer):
        return x.astype(np.int64).astype(state_dtype)  # wrap like C
    return x.astype(state_dtype)


def _is_float(a: np.ndarray) -> bool:
    return np.issubdtype(a.dtype, np.floating)


def _collective_device(group) -> torch.device:
    backend = dist.get_backend(group)
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
