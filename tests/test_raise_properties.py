"""Property tests: random loop bodies, affine or not, through scanweaver-raise.

Bodies are random expression trees over the state `h`, loads `x[i]`, `c[i]`, constants
and the loop index, combined with addi/subi/muli/negation/select/divsi, in i32 or i64
(wrap-around: the comparison is exact).  A tree is affine iff no product multiplies two
state-dependent operands, no select condition depends on the state and no division
touches the state.  The pass must raise exactly the affine ones, and the raised IR must
compute bit for bit what the loop computes.

Forms (issue 14 added the last seven): the state as an iter_arg, at a memref location,
as a channel vector over an inner loop, the vector over a dynamic channel count
(`memref.dim`), a 2x2 matrix over two nested channel loops, a masked update (the
body under `scf.if` on a state-independent condition), and a two-lag recurrence read
from memory (`y[t] = f(y[t-1], y[t-2])`, each `h` leaf reading one of the lags), the
same over a dynamic channel count with the channel loop inside the time loop, and a
state at two memory locations with a previous-state value escaping (lfilter's zi),
alone or per channel; the last three are raised after a reshape (raise_reshape.py).
A second property checks running associative reductions (max/min/and/or/xor) against
the generic scan.scan they are raised to.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_raise import run_both
from xdsl.dialects import scf

from scanweaver.ir import parse_ir, print_ir
from scanweaver.rewrites.raise_affine import analyze_loop, raise_recurrences

L = 5

leaf = st.sampled_from(["h", "x", "c", "k", "i"])


def _extend(children):
    return st.one_of(
        st.tuples(st.sampled_from(["add", "sub", "mul"]), children, children),
        st.tuples(st.just("neg"), children),
        st.tuples(st.just("div"), children),
        st.tuples(st.just("sel"), children, children, children, children),
    )


trees = st.recursive(leaf, _extend, max_leaves=8)


def depends(t) -> bool:
    return t == "h" if isinstance(t, str) else any(depends(c) for c in t[1:])


def affine(t) -> bool:
    if isinstance(t, str):
        return True
    kind, *kids = t
    if not all(affine(c) for c in kids):
        return False
    if kind == "mul":
        return not (depends(kids[0]) and depends(kids[1]))
    if kind == "div":
        return not depends(kids[0])
    if kind == "sel":
        return not (depends(kids[0]) or depends(kids[1]))
    return True


class Emitter:
    def __init__(self, el: str, state_names=("%h",)):
        self.el, self.lines, self.n = el, [], 0
        self.state_names, self.uses = state_names, 0

    def fresh(self) -> str:
        self.n += 1
        return f"%v{self.n}"

    def emit(self, t) -> str:
        el = self.el
        if isinstance(t, str):
            if t == "h":  # alternate between the state variables (the lags)
                self.uses += 1
                return self.state_names[(self.uses - 1) % len(self.state_names)]
            return {"x": "%x", "c": "%c", "k": "%k", "i": "%iv"}[t]
        kind, *kids = t
        args = [self.emit(c) for c in kids]
        r = self.fresh()
        if kind in ("add", "sub", "mul"):
            self.lines.append(f"{r} = arith.{kind}i {args[0]}, {args[1]} : {el}")
        elif kind == "neg":
            self.lines.append(f"{r} = arith.subi %zero, {args[0]} : {el}")
        elif kind == "div":
            self.lines.append(f"{r} = arith.divsi {args[0]}, %seven : {el}")
        else:
            p = self.fresh()
            self.lines.append(f"{p} = arith.cmpi slt, {args[0]}, {args[1]} : {el}")
            self.lines.append(f"{r} = arith.select {p}, {args[2]}, {args[3]} : {el}")
        return r


def program(tree, el: str, form: str) -> str:
    e = Emitter(el, ("%h1", "%h2") if form in ("multilag", "multilag_chan", "zi", "zi_chan") else ("%h",))
    hn = e.emit(tree)
    body = "\n    ".join(e.lines)
    m = f"memref<{L}x{el}>"
    pre = f"""
  %c0 = arith.constant 0 : index
  %cl = arith.constant {L} : index
  %c1 = arith.constant 1 : index
  %k = arith.constant -3 : {el}
  %zero = arith.constant 0 : {el}
  %seven = arith.constant 7 : {el}"""
    loads = f"""%x = memref.load %xs[%i] : {m}
    %c = memref.load %cs[%i] : {m}
    %ii = arith.index_cast %i : index to {el}
    %iv = arith.addi %ii, %k : {el}"""
    consumers = f"""memref.store {hn}, %y[%i] : {m}
    %sq = arith.muli {hn}, {hn} : {el}
    memref.store %sq, %z[%i] : {m}"""
    if form == "masked":
        # The update runs only where x < c; the loop carries h unchanged elsewhere.
        return f"""
func.func @f(%xs: {m}, %cs: {m}, %y: {m}, %z: {m}, %st: memref<1x{el}>, %h0: {el}) -> {el} {{{pre}
  %r = scf.for %i = %c0 to %cl step %c1 iter_args(%h = %h0) -> ({el}) {{
    {loads}
    %mk = arith.cmpi slt, %x, %c : {el}
    %hm = scf.if %mk -> ({el}) {{
      {body}
      scf.yield {hn} : {el}
    }} else {{
      scf.yield %h : {el}
    }}
    {consumers.replace(hn, "%hm")}
    scf.yield %hm : {el}
  }}
  func.return %r : {el}
}}
"""
    if form == "multilag":
        # y[t] = f(y[t-1], y[t-2]) for t = 2 .. L+1 (y has L + 2 elements).
        ym = f"memref<{L + 2}x{el}>"
        return f"""
func.func @f(%xs: {m}, %cs: {m}, %y: {m}, %z: {m}, %st: {ym}, %h0: {el}) -> {el} {{{pre}
  %c2 = arith.constant 2 : index
  scf.for %i = %c0 to %cl step %c1 {{
    {loads}
    %t = arith.addi %i, %c2 : index
    %t1 = arith.subi %t, %c1 : index
    %t2 = arith.subi %t, %c2 : index
    %h1 = memref.load %st[%t1] : {ym}
    %h2 = memref.load %st[%t2] : {ym}
    {body}
    memref.store {hn}, %st[%t] : {ym}
    {consumers}
  }}
  func.return %h0 : {el}
}}
"""
    if form == "multilag_chan":
        # y[t, c] = f(y[t-1, c], y[t-2, c]) with the channel loop inside the time loop
        # over a dynamic channel count (raised after the loops are interchanged); a
        # consumer overwrites z[c] every step (the last step wins, per channel).
        ym = f"memref<{L + 2}x?x{el}>"
        return f"""
func.func @f(%xs: {m}, %cs: {m}, %y: {m}, %z: {m}, %st: {ym}, %h0: {el}) -> {el} {{{pre}
  %c2 = arith.constant 2 : index
  %nd = memref.dim %st, %c1 : {ym}
  scf.for %i = %c0 to %cl step %c1 {{
    %t = arith.addi %i, %c2 : index
    %t1 = arith.subi %t, %c1 : index
    %t2 = arith.subi %t, %c2 : index
    scf.for %ch = %c0 to %nd step %c1 {{
      %x0 = memref.load %xs[%i] : {m}
      %xc = arith.index_cast %ch : index to {el}
      %x = arith.addi %x0, %xc : {el}
      %c = memref.load %cs[%i] : {m}
      %ii = arith.index_cast %i : index to {el}
      %iv = arith.addi %ii, %k : {el}
      %h1 = memref.load %st[%t1, %ch] : {ym}
      %h2 = memref.load %st[%t2, %ch] : {ym}
      {body}
      memref.store {hn}, %st[%t, %ch] : {ym}
      %sq = arith.muli {hn}, {hn} : {el}
      memref.store %sq, %z[%ch] : {m}
    }}
  }}
  func.return %h0 : {el}
}}
"""
    if form == "zi":
        # State at two memory locations st[0], st[1] (an lfilter's zi): h leaves read
        # both, and a value of the previous state escapes to y (raised after the
        # state is carried as iter_args).
        return f"""
func.func @f(%xs: {m}, %cs: {m}, %y: {m}, %z: {m}, %st: memref<2x{el}>, %h0: {el}) -> {el} {{{pre}
  scf.for %i = %c0 to %cl step %c1 {{
    {loads}
    %h1 = memref.load %st[%c0] : memref<2x{el}>
    %h2 = memref.load %st[%c1] : memref<2x{el}>
    {body}
    %e = arith.addi %h1, %x : {el}
    memref.store %e, %y[%i] : {m}
    memref.store {hn}, %st[%c0] : memref<2x{el}>
    memref.store %e, %st[%c1] : memref<2x{el}>
    %sq = arith.muli {hn}, {hn} : {el}
    memref.store %sq, %z[%i] : {m}
  }}
  func.return %h0 : {el}
}}
"""
    if form == "zi_chan":
        # The zi form per channel, time-outer over a dynamic channel count: st[0, c],
        # st[1, c] (both reshapes: interchange, then iter_args with guarded loads).
        zm = f"memref<2x?x{el}>"
        return f"""
func.func @f(%xs: {m}, %cs: {m}, %y: {m}, %z: {m}, %st: {zm}, %h0: {el}) -> {el} {{{pre}
  %nd = memref.dim %st, %c1 : {zm}
  scf.for %i = %c0 to %cl step %c1 {{
    scf.for %ch = %c0 to %nd step %c1 {{
      %x0 = memref.load %xs[%i] : {m}
      %xc = arith.index_cast %ch : index to {el}
      %x = arith.muli %x0, %xc : {el}
      %c = memref.load %cs[%i] : {m}
      %ii = arith.index_cast %i : index to {el}
      %iv = arith.addi %ii, %k : {el}
      %h1 = memref.load %st[%c0, %ch] : {zm}
      %h2 = memref.load %st[%c1, %ch] : {zm}
      {body}
      %e = arith.addi %h1, %x : {el}
      memref.store %e, %y[%ch] : {m}
      memref.store {hn}, %st[%c0, %ch] : {zm}
      memref.store %e, %st[%c1, %ch] : {zm}
      %sq = arith.muli {hn}, {hn} : {el}
      memref.store %sq, %z[%ch] : {m}
    }}
  }}
  func.return %h0 : {el}
}}
"""
    if form == "matrix":
        # A 2x2 state st[a, b] over two nested channel loops; x read at [t + a + b].
        return f"""
func.func @f(%xs: memref<{L + 2}x{el}>, %cs: {m}, %y: {m}, %z: {m}, %st: memref<2x2x{el}>, %h0: {el}) -> {el} {{{pre}
  %c2 = arith.constant 2 : index
  scf.for %t = %c0 to %cl step %c1 {{
    scf.for %a = %c0 to %c2 step %c1 {{
      scf.for %b = %c0 to %c2 step %c1 {{
        %ab = arith.addi %a, %b : index
        %ti = arith.addi %t, %ab : index
        %x = memref.load %xs[%ti] : memref<{L + 2}x{el}>
        %c = memref.load %cs[%t] : {m}
        %ii = arith.index_cast %ti : index to {el}
        %iv = arith.addi %ii, %k : {el}
        %h = memref.load %st[%a, %b] : memref<2x2x{el}>
        {body}
        memref.store {hn}, %st[%a, %b] : memref<2x2x{el}>
        %sq = arith.muli {hn}, {hn} : {el}
        memref.store %sq, %z[%t] : {m}
      }}
    }}
  }}
  func.return %h0 : {el}
}}
"""
    if form == "iter_args":
        return f"""
func.func @f(%xs: {m}, %cs: {m}, %y: {m}, %z: {m}, %st: memref<1x{el}>, %h0: {el}) -> {el} {{{pre}
  %r = scf.for %i = %c0 to %cl step %c1 iter_args(%h = %h0) -> ({el}) {{
    {loads}
    {body}
    {consumers}
    scf.yield {hn} : {el}
  }}
  func.return %r : {el}
}}
"""
    if form == "vector_dyn":
        text = program(tree, el, "vector")
        return text.replace(f"%st: memref<2x{el}>", f"%st: memref<?x{el}>").replace(
            f"memref<2x{el}>", f"memref<?x{el}>").replace(
            "scf.for %i = %c0 to %c2", "scf.for %i = %c0 to %nd", 1).replace(
            "%c2 = arith.constant 2 : index",
            f"%c2 = arith.constant 2 : index\n  %nd = memref.dim %st, %c0 : memref<?x{el}>", 1)
    if form == "vector":
        # State vector st[n] over an inner channel loop; consumers reduce over n.
        return f"""
func.func @f(%xs: {m}, %cs: {m}, %y: {m}, %z: {m}, %st: memref<2x{el}>, %h0: {el}) -> {el} {{{pre}
  %c2 = arith.constant 2 : index
  scf.for %t = %c0 to %cl step %c1 {{
    %tot = scf.for %i = %c0 to %c2 step %c1 iter_args(%acc = %zero) -> ({el}) {{
      %ti = arith.addi %t, %i : index
      %x = memref.load %xs[%ti] : {m}
      %c = memref.load %cs[%t] : {m}
      %ii = arith.index_cast %ti : index to {el}
      %iv = arith.addi %ii, %k : {el}
      %h = memref.load %st[%i] : memref<2x{el}>
      {body}
      memref.store {hn}, %st[%i] : memref<2x{el}>
      %sq = arith.muli {hn}, {hn} : {el}
      %acc2 = arith.addi %acc, %sq : {el}
      scf.yield %acc2 : {el}
    }}
    memref.store %tot, %y[%t] : {m}
  }}
  func.return %h0 : {el}
}}
""".replace("memref<{L}x{el}>".format(L=L, el=el), f"memref<{L + 1}x{el}>", 1).replace(
            f"%xs: {m}", f"%xs: memref<{L + 1}x{el}>"
        ).replace(f"memref.load %xs[%ti] : {m}", f"memref.load %xs[%ti] : memref<{L + 1}x{el}>")
    return f"""
func.func @f(%xs: {m}, %cs: {m}, %y: {m}, %z: {m}, %st: memref<1x{el}>, %h0: {el}) -> {el} {{{pre}
  scf.for %i = %c0 to %cl step %c1 {{
    {loads}
    %h = memref.load %st[%c0] : memref<1x{el}>
    {body}
    memref.store {hn}, %st[%c0] : memref<1x{el}>
    {consumers}
  }}
  func.return %h0 : {el}
}}
"""


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tree=trees,
    el=st.sampled_from(["i32", "i64"]),
    form=st.sampled_from(
        ["iter_args", "memref", "vector", "vector_dyn", "matrix", "masked", "multilag",
         "multilag_chan", "zi", "zi_chan"]
    ),
    seed=st.integers(0, 2**32 - 1),
)
def test_random_bodies_raise_iff_affine_and_agree(tree, el, form, seed):
    src = program(tree, el, form)
    module = parse_ir(src)
    loop = next(op for op in module.walk() if isinstance(op, scf.ForOp))
    decision = analyze_loop(loop)
    expected = affine(tree)
    reshaped = form in ("multilag_chan", "zi", "zi_chan")  # refused as written, raised reshaped
    assert decision.affine == (expected and not reshaped), (decision.reason, src)
    original = parse_ir(src)
    ops, diags = raise_recurrences(module)
    module.verify()
    assert len(ops) == (1 if expected else 0)
    # Rejected vector loops also report their inner channel loop (its reduction reads
    # the state memref the loop writes).
    vector = form in ("vector", "vector_dyn")
    assert [d.split(":")[1] for d in diags] == (
        [] if expected else ["scf.for#0"] + (["scf.for#1"] if vector else [])
    )
    if not expected:
        assert print_ir(module) == print_ir(original)
        return
    dtype = np.int32 if el == "i32" else np.int64
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    nx, ns = {"vector": (L + 1, 2), "vector_dyn": (L + 1, 2), "matrix": (L + 2, (2, 2)),
              "multilag": (L, L + 2), "multilag_chan": (L, (L + 2, 3)), "zi": (L, 2), "zi_chan": (L, (2, 3))}.get(form, (L, 1))
    args = [rng.integers(info.min, info.max, size=nx, dtype=dtype)]
    args += [rng.integers(info.min, info.max, size=L, dtype=dtype)]
    args += [np.zeros(L, dtype), np.zeros(L, dtype)]
    args += [rng.integers(info.min, info.max, size=ns, dtype=dtype), int(rng.integers(-99, 99))]
    (a1, r1), (a2, r2) = run_both(original, module, "f", args)
    for x, y in zip(a1, a2):
        if isinstance(x, np.ndarray):
            np.testing.assert_array_equal(x, y)
    assert r1 == r2


# ---------------------------------------------------------------------------
# Associative, not affine: running op(h, e(x, c, i)) -> scan.scan
# ---------------------------------------------------------------------------

free_trees = st.recursive(
    st.sampled_from(["x", "c", "k", "i"]), _extend, max_leaves=5
)
ASSOC = ["maxsi", "minsi", "maxui", "minui", "andi", "ori", "xori"]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    op=st.sampled_from(ASSOC + ["bad_square", "bad_divsi"]),
    tree=free_trees,
    swap=st.booleans(),
    el=st.sampled_from(["i32", "i64"]),
    in_memory=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_random_running_reductions_raise_iff_associative_and_agree(op, tree, swap, el, in_memory, seed):
    """`in_memory`: the state kept at `%hm[0]` (loaded and stored each step) instead of
    an iter_arg: raised after the promote reshape, the final value stored back."""
    e = Emitter(el)
    elem = e.emit(tree)
    a, b = (elem, "%h") if swap else ("%h", elem)
    if op == "bad_square":  # h*h + e: not associative
        e.lines += [f"%sq = arith.muli %h, %h : {el}", f"%hn = arith.addi %sq, {elem} : {el}"]
    elif op == "bad_divsi":  # h / e: not associative
        e.lines += [f"%hn = arith.divsi %h, %seven : {el}"]
    else:
        e.lines.append(f"%hn = arith.{op} {a}, {b} : {el}")
    body = "\n    ".join(e.lines)
    m = f"memref<{L}x{el}>"
    if in_memory:
        head = f"func.func @f(%xs: {m}, %cs: {m}, %y: {m}, %hm: memref<1x{el}>) {{"
        loop = "scf.for %i = %c0 to %cl step %c1 {"
        load = f"%h = memref.load %hm[%c0] : memref<1x{el}>"
        store = f"memref.store %hn, %hm[%c0] : memref<1x{el}>"
        end = "scf.yield\n  }\n  func.return"
    else:
        head = f"func.func @f(%xs: {m}, %cs: {m}, %y: {m}, %h0: {el}) -> {el} {{"
        loop = f"%r = scf.for %i = %c0 to %cl step %c1 iter_args(%h = %h0) -> ({el}) {{"
        load = store = ""
        end = f"scf.yield %hn : {el}\n  }}\n  func.return %r : {el}"
    src = f"""
{head}
  %c0 = arith.constant 0 : index
  %cl = arith.constant {L} : index
  %c1 = arith.constant 1 : index
  %k = arith.constant -3 : {el}
  %zero = arith.constant 0 : {el}
  %seven = arith.constant 7 : {el}
  {loop}
    {load}
    %x = memref.load %xs[%i] : {m}
    %c = memref.load %cs[%i] : {m}
    %ii = arith.index_cast %i : index to {el}
    %iv = arith.addi %ii, %k : {el}
    {body}
    memref.store %hn, %y[%i] : {m}
    {store}
    {end}
}}
"""
    module = parse_ir(src)
    original = parse_ir(src)
    ops, diags = raise_recurrences(module)
    module.verify()
    if op.startswith("bad"):
        assert ops == [] and len(diags) == 1
        return
    assert [o.name for o in ops] == ["scan.scan"] and diags == []
    dtype = np.int32 if el == "i32" else np.int64
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    args = [rng.integers(info.min, info.max, size=L, dtype=dtype) for _ in range(2)]
    h0 = rng.integers(info.min, info.max, size=1, dtype=dtype)
    args += [np.zeros(L, dtype), h0 if in_memory else int(h0[0])]
    (a1, r1), (a2, r2) = run_both(original, module, "f", args)
    np.testing.assert_array_equal(a1[2], a2[2])
    if in_memory:
        np.testing.assert_array_equal(a1[3], a2[3])  # the final state, stored back
    assert r1 == r2
