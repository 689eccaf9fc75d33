"""The warp-shuffle tile of `linear_gpu.py` (f32/f64/i32/i64 states): blocks of one and of
several warps, lengths around tiles, integers bit for bit, the overflow guard's exact
fallback, the final state. Simulator against the sequential loops (`test_linear_gpu`)."""

from __future__ import annotations

import numpy as np
import pytest

from scanweaver.interp.gpu_sim import simulate_launch
from scanweaver.interp.run import run_function
from scanweaver.ir import parse_ir
from scanweaver.workloads import loops
from test_linear_gpu import IIR3_FINAL, SINGLE_SEQUENCE, check, iir2_args, lowered


def shuffles_in(m) -> int:
    return sum(1 for o in m.walk() if o.name == "gpu.shuffle")


@pytest.mark.parametrize("L", [0, 129])
def test_two_warps_f32(L):
    m = check(loops.iir2_loops(1, L), "iir2", iir2_args(np.random.default_rng(L), 1, L),
              block_size=64, items_per_thread=2)
    assert shuffles_in(m) > 0


@pytest.mark.parametrize("L", [1, 65])
def test_one_warp_i32_bit_for_bit(L):
    check(loops.iir2_loops(2, L, "i32"), "iir2", iir2_args(np.random.default_rng(L), 2, L, "i32"), exact=True,
          block_size=32, items_per_thread=2)


@pytest.mark.parametrize("L", [129])
def test_two_warps_i32_bit_for_bit(L):
    check(loops.iir2_loops(1, L, "i32"), "iir2", iir2_args(np.random.default_rng(L), 1, L, "i32"), exact=True,
          block_size=64, items_per_thread=2)


@pytest.mark.parametrize("bs", [32, 64])
def test_overflowing_aggregates_take_the_exact_fallback(bs):
    """M = [[2, 0], [1, 0]]: a lane's inclusive product over 128 steps is 2^128 = inf,
    while the state stays 0 until the last inputs: the flagged tile replays in the
    loop's order, so every output equals the loop's, bit for bit."""
    L = 300
    x = np.zeros((1, L), np.float32)
    x[0, -3:] = 1.0
    args = [x, np.full(1, 2.0, np.float32), np.zeros(1, np.float32), np.full((1, L), 77, np.float32)]
    text, m = lowered(loops.iir2_loops(1, L), block_size=bs, items_per_thread=4)
    ref = [a.copy() for a in args]
    got = [a.copy() for a in args]
    run_function(parse_ir(text), "iir2", *ref)
    stats: list = []
    simulate_launch(m, "iir2", *got, stats=stats)
    np.testing.assert_array_equal(got[3], ref[3])
    assert stats[0]["max_barriers"] >= bs  # the fallback ran: one barrier per thread


@pytest.mark.parametrize("L", [40])
def test_third_order_final_state_two_warps(L):
    rng = np.random.default_rng(L)
    x = rng.uniform(-1, 1, (3, L)).astype(np.float32)
    k = rng.uniform(-0.3, 0.3, (3, 3)).astype(np.float32)
    text = IIR3_FINAL
    check(text, "iir3", [x, k, np.full((3, L), 77, np.float32), np.full((3, 3), 77, np.float32)],
          block_size=64, items_per_thread=1)


@pytest.mark.parametrize("bs,L", [(32, 129), (64, 0), (64, 129)])
def test_initial_and_final_state_of_one_sequence(bs, L):
    """Depth 0 (one block): the entering state from an argument, the final one to one,
    bit for bit on wrapping i32."""
    rng = np.random.default_rng(L)
    info = np.iinfo(np.int32)

    def ints(*shape):
        return rng.integers(info.min, info.max, size=shape, dtype=np.int32, endpoint=True)

    args = [ints(L), ints(2), ints(2), np.zeros(L, np.int32), np.zeros(2, np.int32)]
    check(SINGLE_SEQUENCE, "iir1", args, exact=True, block_size=bs, items_per_thread=2)
