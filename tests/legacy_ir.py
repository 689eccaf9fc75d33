"""The IR text generators the drivers used before the xDSL builders (issue 9), kept
as the oracle of tests/test_workload_builders.py: the builders must print exactly what
these texts parse and print to; and the LLVM IR text of the CPU first tier before
llvmlite's IR builder (tests/test_cpu_loop_tier.py).  Only tests use them."""

from __future__ import annotations

from collections.abc import Sequence


def memref_type(shape: Sequence[int | str], element: str) -> str:
    return "memref<" + "".join(f"{d}x" for d in shape) + element + ">"


def affine_scan_ir(
    shape: Sequence[int | str],
    axis: int,
    in_el: str,
    state_el: str,
    *,
    init: bool = False,
    final: bool = False,
    reverse: bool = False,
    name: str = "f",
) -> str:
    """`func.func @name(a, b, [init], h, [final])` holding one scan.affine."""
    channels = [d for i, d in enumerate(shape) if i != axis]
    t_in, t_h, t_c = (
        memref_type(shape, in_el),
        memref_type(shape, state_el),
        memref_type(channels, state_el),
    )
    args, ins, outs = [f"%a: {t_in}", f"%b: {t_in}"], [t_in, t_in], [t_h]
    op = "scan.affine %a, %b"
    if init:
        args.append(f"%h0: {t_c}")
        ins.append(t_c)
        op += " init %h0"
    args.append(f"%h: {t_h}")
    op += " into %h"
    if final:
        args.append(f"%hT: {t_c}")
        outs.append(t_c)
        op += " final %hT"
    op += f" axis {axis}" + (" reverse" if reverse else "")
    return (
        f"func.func @{name}({', '.join(args)}) {{\n"
        f"  {op} : {', '.join(ins)} -> {', '.join(outs)}\n"
        "  func.return\n}\n"
    )


def _bc_type(kind: str, n: int) -> str:
    return {"const": f"memref<?x{n}xf32>", "shared": f"memref<?x?x{n}xf32>", "grouped": f"memref<?x?x?x{n}xf32>"}[kind]


def _bc_index(kind: str, name: str, i: str, n: str) -> str:
    return {"const": f"{name}[%d, {n}]", "shared": f"{name}[%b, {i}, {n}]", "grouped": f"{name}[%b, %g{name[1:]}, {i}, {n}]"}[kind]


def selective_scan_ir(spec) -> str:
    """IR text of `func.func @selective_scan`: one scan.recurrence per (batch, channel).

    Arguments (in order): u, delta (batch, D, L); A (D, N); B, C in the layout of their
    kind with time before the state index ((batch, L, N), (batch, G, L, N)) or (D, N);
    [D_skip (D,)]; [z (batch, D, L)]; [delta_bias (D,)]; [h0 (batch, D, N)]; out
    (batch, D, L); [last (batch, D, N)]; d_begin, d_end (index): the channels to run.
    """
    N = spec.n
    f = "f32"
    m3 = "memref<?x?x?xf32>"
    args = [f"%u: {m3}", f"%delta: {m3}", f"%A: memref<?x{N}xf32>", f"%B: {_bc_type(spec.b_kind, N)}",
            f"%C: {_bc_type(spec.c_kind, N)}"]
    args += ["%Dskip: memref<?xf32>"] if spec.has_d else []
    args += [f"%z: {m3}"] if spec.has_z else []
    args += ["%bias: memref<?xf32>"] if spec.has_bias else []
    args += [f"%h0: memref<?x?x{N}xf32>"] if spec.has_h0 else []
    args += [f"%out: {m3}"]
    args += [f"%last: memref<?x?x{N}xf32>"] if spec.has_last else []
    args += ["%d_begin: index", "%d_end: index"]
    st = f"memref<{N}xf32>"
    L: list[str] = []
    e = L.append
    e(f"func.func @selective_scan({', '.join(args)}) {{")
    e("  %c0 = arith.constant 0 : index")
    e("  %c1 = arith.constant 1 : index")
    e("  %c2 = arith.constant 2 : index")
    e(f"  %cN = arith.constant {N} : index")
    e(f"  %zero = arith.constant 0.0 : {f}")
    e(f"  %one = arith.constant 1.0 : {f}")
    e(f"  %twenty = arith.constant 20.0 : {f}")
    e(f"  %batch = memref.dim %u, %c0 : {m3}")
    e(f"  %Dn = memref.dim %u, %c1 : {m3}")
    e(f"  %len = memref.dim %u, %c2 : {m3}")
    for name, kind in (("%B", spec.b_kind), ("%C", spec.c_kind)):
        if kind == "grouped":
            e(f"  %ng{name[1:]} = memref.dim {name}, %c1 : {_bc_type(kind, N)}")
            e(f"  %per{name[1:]} = arith.divui %Dn, %ng{name[1:]} : index")
    e(f"  %S = memref.alloca() : {st}")
    e("  scf.for %b = %c0 to %batch step %c1 {")
    e("    scf.for %d = %d_begin to %d_end step %c1 {")
    for name, kind in (("%B", spec.b_kind), ("%C", spec.c_kind)):
        if kind == "grouped":
            e(f"      %g{name[1:]} = arith.divui %d, %per{name[1:]} : index")
    e("      scf.for %n = %c0 to %cN step %c1 {")
    if spec.has_h0:
        e(f"        %v = memref.load %h0[%b, %d, %n] : memref<?x?x{N}xf32>")
        e(f"        memref.store %v, %S[%n] : {st}")
    else:
        e(f"        memref.store %zero, %S[%n] : {st}")
    e("      }")
    if spec.has_bias:
        e("      %bd = memref.load %bias[%d] : memref<?xf32>")
    if spec.has_d:
        e("      %dd = memref.load %Dskip[%d] : memref<?xf32>")
    e(f"      scan.recurrence %c0 to %len step %c1 state(%S : {st}) coeffs {{")
    e("      ^bb0(%i: index, %k: index):")
    e(f"        %dl = memref.load %delta[%b, %d, %i] : {m3}")
    dt = "%dl"
    if spec.has_bias:
        e(f"        %dlb = arith.addf %dl, %bd : {f}")
        dt = "%dlb"
    if spec.softplus:
        # softplus(x) = log1p(exp(x)), = x for x > 20 (as torch and Mamba do)
        e(f"        %ex = math.exp {dt} : {f}")
        e(f"        %lp = math.log1p %ex : {f}")
        e(f"        %big = arith.cmpf ogt, {dt}, %twenty : {f}")
        e(f"        %sp = arith.select %big, {dt}, %lp : {f}")
        dt = "%sp"
    e(f"        %ak = memref.load %A[%d, %k] : memref<?x{N}xf32>")
    e(f"        %da = arith.mulf {dt}, %ak : {f}")
    e(f"        %a = math.exp %da : {f}")
    e(f"        %bk = memref.load {_bc_index(spec.b_kind, '%B', '%i', '%k')} : {_bc_type(spec.b_kind, N)}")
    e(f"        %uu = memref.load %u[%b, %d, %i] : {m3}")
    e(f"        %dtu = arith.mulf {dt}, %uu : {f}")
    e(f"        %x = arith.mulf %bk, %dtu : {f}")
    e(f"        scan.yield %a, %x : {f}, {f}")
    e("      } emit {")
    e(f"      ^bb0(%i: index, %s: {st}):")
    e(f"        %y = scf.for %n = %c0 to %cN step %c1 iter_args(%acc = %zero) -> ({f}) {{")
    e(f"          %hv = memref.load %s[%n] : {st}")
    e(f"          %cv = memref.load {_bc_index(spec.c_kind, '%C', '%i', '%n')} : {_bc_type(spec.c_kind, N)}")
    e(f"          %pr = arith.mulf %hv, %cv : {f}")
    e(f"          %acc2 = arith.addf %acc, %pr : {f}")
    e(f"          scf.yield %acc2 : {f}")
    e("        }")
    y = "%y"
    if spec.has_d:
        e(f"        %uu = memref.load %u[%b, %d, %i] : {m3}")
        e(f"        %du = arith.mulf %dd, %uu : {f}")
        e(f"        %yd = arith.addf %y, %du : {f}")
        y = "%yd"
    if spec.has_z:
        e(f"        %zz = memref.load %z[%b, %d, %i] : {m3}")
        e(f"        %nz = arith.negf %zz : {f}")
        e(f"        %ez = math.exp %nz : {f}")
        e(f"        %den = arith.addf %one, %ez : {f}")
        e(f"        %sz = arith.divf %zz, %den : {f}")
        e(f"        %yz = arith.mulf {y}, %sz : {f}")
        y = "%yz"
    e(f"        memref.store {y}, %out[%b, %d, %i] : {m3}")
    e("        scan.yield")
    e("      }")
    if spec.has_last:
        e("      scf.for %n = %c0 to %cN step %c1 {")
        e(f"        %v = memref.load %S[%n] : {st}")
        e(f"        memref.store %v, %last[%b, %d, %n] : memref<?x?x{N}xf32>")
        e("      }")
    e("    }")
    e("  }")
    e("  func.return")
    e("}")
    return "\n".join(L) + "\n"


def _complex_bc_type(kind: str, n: int, c: str) -> str:
    return {"const": f"memref<?x{n}x{c}>", "shared": f"memref<?x?x{n}x{c}>", "grouped": f"memref<?x?x?x{n}x{c}>"}[kind]


def complex_selective_ir(spec: "ComplexSelectiveSpec") -> str:  # noqa: F821 (the old spec type)
    """(runtime/cpu_selective_complex.py before issue 9) IR text of `func.func @selective_scan_complex` (argument order as in
    `selective_scan_ir`: u, delta, A, B, C, [D], [z], [bias], [h0], out, [last],
    d_begin, d_end); A, B, C, h0 and last are complex memrefs."""
    N, f = spec.n, spec.real
    c = f"complex<{f}>"
    m3 = f"memref<?x?x?x{f}>"
    args = [f"%u: {m3}", f"%delta: {m3}", f"%A: memref<?x{N}x{c}>", f"%B: {_complex_bc_type(spec.b_kind, N, c)}",
            f"%C: {_complex_bc_type(spec.c_kind, N, c)}"]
    args += [f"%Dskip: memref<?x{f}>"] if spec.has_d else []
    args += [f"%z: {m3}"] if spec.has_z else []
    args += [f"%bias: memref<?x{f}>"] if spec.has_bias else []
    args += [f"%h0: memref<?x?x{N}x{c}>"] if spec.has_h0 else []
    args += [f"%out: {m3}"]
    args += [f"%last: memref<?x?x{N}x{c}>"] if spec.has_last else []
    args += ["%d_begin: index", "%d_end: index"]
    st = f"memref<{N}x{c}>"
    L: list[str] = []
    e = L.append
    e(f"func.func @selective_scan_complex({', '.join(args)}) {{")
    e("  %c0 = arith.constant 0 : index")
    e("  %c1 = arith.constant 1 : index")
    e("  %c2 = arith.constant 2 : index")
    e(f"  %cN = arith.constant {N} : index")
    e(f"  %zero = arith.constant 0.0 : {f}")
    e(f"  %one = arith.constant 1.0 : {f}")
    e(f"  %two = arith.constant 2.0 : {f}")
    e(f"  %twenty = arith.constant 20.0 : {f}")
    e(f"  %czero = complex.constant [0.0 : {f}, 0.0 : {f}] : {c}")
    e(f"  %batch = memref.dim %u, %c0 : {m3}")
    e(f"  %Dn = memref.dim %u, %c1 : {m3}")
    e(f"  %len = memref.dim %u, %c2 : {m3}")
    for name, kind in (("%B", spec.b_kind), ("%C", spec.c_kind)):
        if kind == "grouped":
            e(f"  %ng{name[1:]} = memref.dim {name}, %c1 : {_complex_bc_type(kind, N, c)}")
            e(f"  %per{name[1:]} = arith.divui %Dn, %ng{name[1:]} : index")
    e(f"  %S = memref.alloca() : {st}")
    e("  scf.for %b = %c0 to %batch step %c1 {")
    e("    scf.for %d = %d_begin to %d_end step %c1 {")
    for name, kind in (("%B", spec.b_kind), ("%C", spec.c_kind)):
        if kind == "grouped":
            e(f"      %g{name[1:]} = arith.divui %d, %per{name[1:]} : index")
    e("      scf.for %n = %c0 to %cN step %c1 {")
    if spec.has_h0:
        e(f"        %v = memref.load %h0[%b, %d, %n] : memref<?x?x{N}x{c}>")
        e(f"        memref.store %v, %S[%n] : {st}")
    else:
        e(f"        memref.store %czero, %S[%n] : {st}")
    e("      }")
    if spec.has_bias:
        e(f"      %bd = memref.load %bias[%d] : memref<?x{f}>")
    if spec.has_d:
        e(f"      %dd = memref.load %Dskip[%d] : memref<?x{f}>")
    e(f"      scan.recurrence %c0 to %len step %c1 state(%S : {st}) coeffs {{")
    e("      ^bb0(%i: index, %k: index):")
    e(f"        %dl = memref.load %delta[%b, %d, %i] : {m3}")
    dt = "%dl"
    if spec.has_bias:
        e(f"        %dlb = arith.addf %dl, %bd : {f}")
        dt = "%dlb"
    if spec.softplus:  # softplus(x) = log1p(exp(x)), = x for x > 20
        e(f"        %ex = math.exp {dt} : {f}")
        e(f"        %lp = math.log1p %ex : {f}")
        e(f"        %big = arith.cmpf ogt, {dt}, %twenty : {f}")
        e(f"        %sp = arith.select %big, {dt}, %lp : {f}")
        dt = "%sp"
    # exp(dt * A): a real times a complex scales both parts
    e(f"        %ak = memref.load %A[%d, %k] : memref<?x{N}x{c}>")
    e(f"        %akr = complex.re %ak : {c}")
    e(f"        %aki = complex.im %ak : {c}")
    e(f"        %dar = arith.mulf {dt}, %akr : {f}")
    e(f"        %dai = arith.mulf {dt}, %aki : {f}")
    e(f"        %da = complex.create %dar, %dai : {c}")
    e(f"        %a = complex.exp %da : {c}")
    # dt * u * B
    e(f"        %bk = memref.load {_bc_index(spec.b_kind, '%B', '%i', '%k')} : {_complex_bc_type(spec.b_kind, N, c)}")
    e(f"        %uu = memref.load %u[%b, %d, %i] : {m3}")
    e(f"        %dtu = arith.mulf {dt}, %uu : {f}")
    e(f"        %bkr = complex.re %bk : {c}")
    e(f"        %bki = complex.im %bk : {c}")
    e(f"        %xr = arith.mulf %bkr, %dtu : {f}")
    e(f"        %xi = arith.mulf %bki, %dtu : {f}")
    e(f"        %x = complex.create %xr, %xi : {c}")
    e(f"        scan.yield %a, %x : {c}, {c}")
    e("      } emit {")
    e(f"      ^bb0(%i: index, %s: {st}):")
    # y = 2 Re(sum_n h_n C_n) = 2 sum_n (h.re C.re - h.im C.im)
    e(f"        %y1 = scf.for %n = %c0 to %cN step %c1 iter_args(%acc = %zero) -> ({f}) {{")
    e(f"          %hv = memref.load %s[%n] : {st}")
    e(f"          %cv = memref.load {_bc_index(spec.c_kind, '%C', '%i', '%n')} : {_complex_bc_type(spec.c_kind, N, c)}")
    e(f"          %hr = complex.re %hv : {c}")
    e(f"          %hi = complex.im %hv : {c}")
    e(f"          %cr = complex.re %cv : {c}")
    e(f"          %ci = complex.im %cv : {c}")
    e(f"          %p1 = arith.mulf %hr, %cr : {f}")
    e(f"          %p2 = arith.mulf %hi, %ci : {f}")
    e(f"          %pr = arith.subf %p1, %p2 : {f}")
    e(f"          %acc2 = arith.addf %acc, %pr : {f}")
    e(f"          scf.yield %acc2 : {f}")
    e("        }")
    e(f"        %y = arith.mulf %y1, %two : {f}")
    y = "%y"
    if spec.has_d:
        e(f"        %uu = memref.load %u[%b, %d, %i] : {m3}")
        e(f"        %du = arith.mulf %dd, %uu : {f}")
        e(f"        %yd = arith.addf %y, %du : {f}")
        y = "%yd"
    if spec.has_z:
        e(f"        %zz = memref.load %z[%b, %d, %i] : {m3}")
        e(f"        %nz = arith.negf %zz : {f}")
        e(f"        %ez = math.exp %nz : {f}")
        e(f"        %den = arith.addf %one, %ez : {f}")
        e(f"        %sz = arith.divf %zz, %den : {f}")
        e(f"        %yz = arith.mulf {y}, %sz : {f}")
        y = "%yz"
    e(f"        memref.store {y}, %out[%b, %d, %i] : {m3}")
    e("        scan.yield")
    e("      }")
    if spec.has_last:
        e("      scf.for %n = %c0 to %cN step %c1 {")
        e(f"        %v = memref.load %S[%n] : {st}")
        e(f"        memref.store %v, %last[%b, %d, %n] : memref<?x?x{N}x{c}>")
        e("      }")
    e("    }")
    e("  }")
    e("  func.return")
    e("}")
    return "\n".join(L) + "\n"


def generic_cumsum_ir(shape) -> str:
    """(bench/gpu_kernels.py before issue 9) an i32 scan.scan adding along the last axis."""
    mt = f"memref<{'x'.join(str(d) for d in shape)}xi32>"
    return (
        f"func.func @f(%x0: {mt}, %y0: {mt}) {{\n"
        f"  scan.scan ins(%x0 : {mt}) outs(%y0 : {mt}) axis {len(shape) - 1} {{\n"
        "  ^bb0(%a0: i32, %b0: i32):\n    %r = arith.addi %a0, %b0 : i32\n    scan.yield %r : i32\n  }\n"
        "  func.return\n}\n"
    )


# ------------------------------------------------ the CPU first tier's LLVM IR text
# (runtime/cpu_loop_tier.py and cpu_tiers.py wrote these before llvmlite's IR builder:
# tests/test_cpu_loop_tier.py checks the built modules optimise to the same code)

from scanweaver.runtime.cpu_loop_tier import affine_spec  # noqa: E402 (unchanged)

_LOOP = "sw_loop_"  # prefix of the loop function's symbol (the dispatch takes the name)
_TYPES = {"f32": "float", "f64": "double", "i32": "i32", "i64": "i64"}


def affine_loop_ir(el: str, rank: int, init: bool, final: bool, reverse: bool, name: str) -> str:
    """LLVM IR text of `void @sw_loop_<name>(a, b, [h0], h, [hT])` (expanded memrefs:
    allocated and aligned pointer, offset, sizes, strides), the scan along the last axis
    of the rank-`rank` arrays (the loop bounds are a's sizes)."""
    t = _TYPES[el]
    floats = el in ("f32", "f64")
    keys = ["a", "b"] + (["h0"] if init else []) + ["h"] + (["hT"] if final else [])
    params = []
    for key, r in zip(keys, affine_spec(rank, init, final)):
        params += [f"ptr %{key}.allocated", f"ptr %{key}", f"i64 %{key}.offset"]
        params += [f"i64 %{key}.n{d}" for d in range(r)] + [f"i64 %{key}.s{d}" for d in range(r)]
    out = [f"define void @{_LOOP}{name}({', '.join(params)}) {{", "entry:"]
    block = "entry"
    for d in range(rank - 1):  # the rows: one loop per leading dimension
        out += [f"  br label %row{d}", f"row{d}:",
                f"  %i{d} = phi i64 [0, %{block}], [%i{d}.next, %row{d}.latch]",
                f"  %i{d}.more = icmp slt i64 %i{d}, %a.n{d}",
                f"  br i1 %i{d}.more, label %row{d}.body, label %row{d}.exit", f"row{d}.body:"]
        block = f"row{d}.body"
    for key in keys:  # each array's row start: offset + sum(i_d * stride_d)
        base = f"%{key}.offset"
        for d in range(rank - 1):
            out += [f"  %{key}.i{d} = mul i64 %i{d}, %{key}.s{d}", f"  %{key}.b{d} = add i64 {base}, %{key}.i{d}"]
            base = f"%{key}.b{d}"
        out.append(f"  %{key}.row = add i64 {base}, 0")
    if init:
        out += ["  %h0.p = getelementptr " + t + ", ptr %h0, i64 %h0.row", f"  %start = load {t}, ptr %h0.p"]
    start = "%start" if init else ("0.0" if floats else "0")
    last = rank - 1
    out += [f"  %last = sub i64 %a.n{last}, 1", "  br label %time", "time:",
            f"  %k = phi i64 [0, %{block}], [%k.next, %step]",
            f"  %state = phi {t} [{start}, %{block}], [%state.next, %step]",
            f"  %k.more = icmp slt i64 %k, %a.n{last}",
            "  br i1 %k.more, label %step, label %row.end", "step:",
            "  %t = sub i64 %last, %k" if reverse else "  %t = add i64 %k, 0"]
    for key in ("a", "b", "h"):
        out += [f"  %{key}.tk = mul i64 %t, %{key}.s{last}", f"  %{key}.at = add i64 %{key}.row, %{key}.tk",
                f"  %{key}.p = getelementptr {t}, ptr %{key}, i64 %{key}.at"]
    mul, add = ("fmul", "fadd") if floats else ("mul", "add")
    out += [f"  %av = load {t}, ptr %a.p", f"  %bv = load {t}, ptr %b.p",
            f"  %product = {mul} {t} %av, %state", f"  %state.next = {add} {t} %product, %bv",
            f"  store {t} %state.next, ptr %h.p", "  %k.next = add i64 %k, 1", "  br label %time", "row.end:"]
    if final:
        out += [f"  %hT.p = getelementptr {t}, ptr %hT, i64 %hT.row", f"  store {t} %state, ptr %hT.p"]
    for d in reversed(range(rank - 1)):
        out += [f"  br label %row{d}.latch", f"row{d}.latch:", f"  %i{d}.next = add i64 %i{d}, 1",
                f"  br label %row{d}", f"row{d}.exit:"]
    out += ["  ret void", "}", ""]
    return "\n".join(out)


_LLVM_SCALARS = {"index": "i64", "i64": "i64", "i32": "i32", "f32": "float", "f64": "double"}
_SLOT, _RETURNED = "sw_tier_target", "sw_tier_returned"


def dispatch_ir(name: str, spec: Sequence[int | str]) -> str:
    """LLVM IR of `void @name(...)` with the expanded memref convention of `spec` (as
    `cpu_jit.Kernel`), forwarding its arguments to the function whose address is in
    the global `@sw_tier_target`; after the call, the function in `@sw_tier_returned`
    (when set) is taken out of it and called, so exactly once."""
    params: list[str] = []
    for i, s in enumerate(spec):
        if isinstance(s, int):
            params += [f"ptr %m{i}a", f"ptr %m{i}b", f"i64 %m{i}o"]
            params += [f"i64 %m{i}n{d}" for d in range(s)] + [f"i64 %m{i}s{d}" for d in range(s)]
        else:
            params.append(f"{_LLVM_SCALARS[s]} %x{i}")
    args = ", ".join(params)
    return (
        f"@{_SLOT} = global ptr null, align 8\n"
        f"@{_RETURNED} = global ptr null, align 8\n"
        f"define void @{name}({args}) {{\n"
        f"  %f = load atomic ptr, ptr @{_SLOT} acquire, align 8\n"
        f"  call void %f({args})\n"
        f"  %n = load atomic ptr, ptr @{_RETURNED} monotonic, align 8\n"
        "  %none = icmp eq ptr %n, null\n"
        "  br i1 %none, label %done, label %first\n"
        "first:\n"
        f"  %g = atomicrmw xchg ptr @{_RETURNED}, ptr null acq_rel, align 8\n"
        "  %taken = icmp eq ptr %g, null\n"
        "  br i1 %taken, label %done, label %notify\n"
        "notify:\n"
        "  call void %g()\n"
        "  br label %done\n"
        "done:\n"
        "  ret void\n}\n"
    )


# ------------------------------------------------ runtime/cpu.py's denormal helpers

_DENORMAL_HELPERS = {
    "x86_64": (
        0x8040,
        """
declare void @llvm.x86.sse.stmxcsr(ptr)
declare void @llvm.x86.sse.ldmxcsr(ptr)
define i64 @sw_get_fp_control() {
  %p = alloca i32
  call void @llvm.x86.sse.stmxcsr(ptr %p)
  %v = load i32, ptr %p
  %w = zext i32 %v to i64
  ret i64 %w
}
define void @sw_set_fp_control(i64 %w) {
  %p = alloca i32
  %v = trunc i64 %w to i32
  store i32 %v, ptr %p
  call void @llvm.x86.sse.ldmxcsr(ptr %p)
  ret void
}
""",
    ),
    "aarch64": (
        1 << 24,
        """
declare i64 @llvm.aarch64.get.fpcr()
declare void @llvm.aarch64.set.fpcr(i64)
define i64 @sw_get_fp_control() {
  %v = call i64 @llvm.aarch64.get.fpcr()
  ret i64 %v
}
define void @sw_set_fp_control(i64 %v) {
  call void @llvm.aarch64.set.fpcr(i64 %v)
  ret void
}
""",
    ),
}


def canonical_llvm_ir(llvm_ir: str, opt_level: int) -> dict[str, str]:
    """Each global and function of the module after the O`opt_level` pipeline (O0: parsed
    and verified), by name, with its local value names renamed in order of appearance
    (a builder names arguments and blocks its own way; an unnamed first block prints
    no label, a named one `entry:`), and without the comments LLVM prints."""
    import re

    from scanweaver.runtime.cpu import host_target_machine, optimized_module

    module = optimized_module(llvm_ir, host_target_machine(opt_level), opt_level)
    out = {}
    for value in [*module.global_variables, *module.functions]:
        lines = [line.split(";")[0].rstrip() for line in str(value).splitlines() if line != "entry:"]
        names: dict[str, str] = {}
        out[value.name] = re.sub(r"%[\w.\"]+", lambda m: names.setdefault(m.group(), f"%v{len(names)}"), "\n".join(lines))
    return out
