"""`scan-affine-to-pairs`: the pair scan, read sequentially, equals `scan.affine` bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from scan_ir import affine_func
from xdsl.context import Context
from xdsl.dialects.builtin import f32, i32

from scanweaver.dialects import scan
from scanweaver.interp.run import run_function
from scanweaver.ir import parse_ir
from scanweaver.rewrites.affine_to_pairs import AffineToPairs, PairArith, is_pair_combine

NP = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "i32": np.int32, "i64": np.int64}


def _arrays(rng, shape, el):
    if el.startswith("i"):
        info = np.iinfo(NP[el])
        return rng.integers(info.min, info.max, size=shape, dtype=NP[el], endpoint=True)
    return rng.uniform(-1.5, 1.5, size=shape).astype(NP[el])


CASES = [
    ((3, 7), 1, "f32", "f32", {}),
    ((3, 7), 1, "f32", "f32", dict(init=True, final=True)),
    ((3, 7), 1, "f32", "f32", dict(init=True, final=True, reverse=True)),
    ((5, 2, 3), 0, "f64", "f64", dict(init=True, final=True, reverse=True)),
    ((2, 9), 1, "f16", "f32", dict(init=True, final=True)),
    ((4, 11), 1, "i32", "i32", dict(init=True, final=True, reverse=True)),
    ((4, 0), 1, "f32", "f32", dict(init=True, final=True)),
    ((4, 0), 1, "i64", "i64", dict(final=True)),
]


@pytest.mark.parametrize("shape,axis,in_el,st_el,flags", CASES)
def test_pairs_match_reference_bit_for_bit(shape, axis, in_el, st_el, flags):
    text = affine_func(shape, axis, in_el, st_el, **flags)
    module = parse_ir(text)
    AffineToPairs().apply(Context(), module)
    module.verify()
    assert not any(isinstance(op, scan.AffineOp) for op in module.walk())
    (sc,) = [op for op in module.walk() if isinstance(op, scan.ScanOp)]
    assert is_pair_combine(sc)
    assert sc.is_reverse == flags.get("reverse", False)

    rng = np.random.default_rng(3)
    ch = [d for i, d in enumerate(shape) if i != axis]
    args = [_arrays(rng, shape, in_el), _arrays(rng, shape, in_el)]
    if flags.get("init"):
        args.append(_arrays(rng, ch, st_el))
    args.append(np.full(shape, 5, NP[st_el]))
    if flags.get("final"):
        args.append(np.full(ch, 5, NP[st_el]))
    ref = [x.copy() for x in args]
    run_function(text, "f", *ref)
    run_function(module, "f", *args)
    for r, g in zip(ref, args):
        np.testing.assert_array_equal(g, r)


def test_dynamic_shape():
    text = affine_func((3, 6), 1, "f32", "f32", init=True, final=True, reverse=True).replace("3x6x", "?x?x").replace("<3xf32>", "<?xf32>")
    module = parse_ir(text)
    AffineToPairs().apply(Context(), module)
    module.verify()
    rng = np.random.default_rng(0)
    args = [_arrays(rng, (3, 6), "f32"), _arrays(rng, (3, 6), "f32"), _arrays(rng, (3,), "f32"), np.zeros((3, 6), np.float32), np.zeros(3, np.float32)]
    ref = [x.copy() for x in args]
    run_function(text, "f", *ref)
    run_function(module, "f", *args)
    for r, g in zip(ref, args):
        np.testing.assert_array_equal(g, r)


def test_combine_is_associative_for_ints():
    # (p • q) • r == p • (q • r) exactly in wrapping i32 arithmetic, via the region.
    from xdsl.dialects.builtin import ModuleOp

    from scanweaver.interp.run import make_interpreter

    region = PairArith(i32).combine_region()
    interp = make_interpreter(ModuleOp([]))

    def comb(p, q):
        return interp.run_ssacfg_region(region, (*p, *q))

    rng = np.random.default_rng(0)
    for _ in range(50):
        p, q, r = (tuple(int(x) for x in rng.integers(-(2**31), 2**31, 2)) for _ in range(3))
        assert comb(comb(p, q), r) == comb(p, comb(q, r))


def test_combine_region_shape():
    region = PairArith(f32).combine_region()
    assert [a.type for a in region.block.args] == [f32] * 4
    assert [op.name for op in region.block.ops] == ["arith.mulf", "arith.mulf", "arith.addf", "scan.yield"]
