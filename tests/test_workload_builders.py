"""One builder per workload (issue 9): the drivers' kernels are built with xDSL in
`scanweaver/workloads/`, their argument lists read from the built signature, and no
module of the package writes IR as text: MLIR from format strings, LLVM IR from format
strings or string constants (it is built with llvmlite's IR builder, `llvmlite.ir`).

The builders replaced f-string generators; `legacy_ir.py` keeps those as the oracle:
for every option, the built module prints exactly what the old text parses and prints
to (same ops, same order, same types, same value names).
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import re
from pathlib import Path

import numpy as np
import pytest

import legacy_ir
import scanweaver
from scanweaver.interp.run import run_function
from scanweaver.ir import parse_ir, print_ir
from scanweaver.runtime import kernel_ir as kir
from scanweaver.workloads.affine import affine_scan
from scanweaver.workloads.scans import sum_scan
from scanweaver.workloads.selective import kernel_arguments, selective_scan_recurrence
from scanweaver.workloads.selective_complex import selective_scan_complex_recurrence
from scanweaver.workloads.specs import ComplexSelectiveSpec, SelectiveScanSpec

AFFINE_CASES = [
    (shape, axis, ie, se, init, final, reverse)
    for shape, axis in ((("?", "?"), 1), ((3, 6), 1), ((5, 2), 0), (("?", "?", "?"), 0), ((4, "?"), 1))
    for ie, se in (("f32", "f32"), ("f16", "f32"), ("f64", "f64"), ("i32", "i32"), ("i64", "i64"))
    for init, final, reverse in itertools.product((False, True), repeat=3)
]


@pytest.mark.parametrize("shape,axis,ie,se,init,final,reverse", AFFINE_CASES[::5])
def test_affine_builder_prints_the_old_text(shape, axis, ie, se, init, final, reverse):
    old = legacy_ir.affine_scan_ir(shape, axis, ie, se, init=init, final=final, reverse=reverse, name="affine")
    new = affine_scan(shape, axis, ie, se, init=init, final=final, reverse=reverse, name="affine")
    new.verify()
    assert print_ir(new) == print_ir(parse_ir(old))


def _specs():
    for n in (1, 16):
        for b_kind, c_kind in itertools.product(("const", "shared", "grouped"), repeat=2):
            for flags in itertools.product((False, True), repeat=6):
                yield SelectiveScanSpec(n, b_kind, c_kind, *flags)


SPECS = list(_specs())


def _old_arguments(spec: SelectiveScanSpec) -> list[int | str]:
    """The hand-kept argument list the CPU driver had before (ranks, then indices)."""
    rank = {"const": 2, "shared": 3, "grouped": 4}
    args = [3, 3, 2, rank[spec.b_kind], rank[spec.c_kind]] + [1] * spec.has_d + [3] * spec.has_z
    return args + [1] * spec.has_bias + [3] * spec.has_h0 + [3] + [3] * spec.has_last + ["index", "index"]


@pytest.mark.parametrize("element", ["f32", "f64"])
def test_selective_builder_prints_the_old_text(element):
    # every 11th of the 1152 combinations (11 is prime to the 64 flag sets and 9 layout
    # pairs, so each layout and flag shows up): the old module, the old argument list
    for spec in SPECS[::11]:
        old = legacy_ir.selective_scan_ir(spec)
        if element == "f64":
            old = old.replace("f32", "f64")  # what the torch f64 kernels did with the text
        module = selective_scan_recurrence(spec, element)
        module.verify()
        assert print_ir(module) == print_ir(parse_ir(old)), spec
        (fn,) = module.body.block.ops
        assert list(kernel_arguments(fn)) == _old_arguments(spec), spec


def test_kernel_ir_comes_back_from_the_disk_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(kir, "_MEMO", {})
    spec = SelectiveScanSpec(4, "shared", "grouped", True, False, True, True, False, True)
    built = kir.kernel_ir("selective", spec=spec)
    assert built.name == "selective_scan" and built.args == tuple(_old_arguments(spec))
    assert built.text == print_ir(selective_scan_recurrence(spec))

    def no_build(*args, **kwargs):
        raise AssertionError("rebuilt although cached")

    monkeypatch.setattr(kir, "_MEMO", {})
    monkeypatch.setattr(kir, "_build_entry", no_build)
    assert kir.kernel_ir("selective", spec=spec) == built
    with pytest.raises(AssertionError, match="rebuilt"):  # other options: a miss
        kir.kernel_ir("selective", spec=SelectiveScanSpec(5, "const", "const", *[False] * 6))


def test_affine_kernel_arguments_follow_the_signature(tmp_path, monkeypatch):
    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path))
    for init, final in itertools.product((False, True), repeat=2):
        ir = kir.kernel_ir("affine", shape=("?", "?", "?"), axis=2, in_el="f32", state_el="f32",
                           init=init, final=final, reverse=False, name="affine")
        assert ir.args == (3, 3) + (2,) * init + (3,) + (2,) * final


COMPLEX_SPECS = [ComplexSelectiveSpec(spec.n, real, *dataclasses.astuple(spec)[1:])
                 for spec in SPECS for real in ("f32", "f64")]


def test_complex_selective_builder_prints_the_old_text():
    # every 23rd of the 2304 (prime to the 128 flag-and-real sets and 9 layout pairs)
    for spec in COMPLEX_SPECS[::23]:
        module = selective_scan_complex_recurrence(spec)
        module.verify()
        assert print_ir(module) == print_ir(parse_ir(legacy_ir.complex_selective_ir(spec))), spec
        (fn,) = module.body.block.ops
        assert list(kernel_arguments(fn)) == _old_arguments(spec), spec  # same ranks as the real kernel


def _complex_inputs(spec: ComplexSelectiveSpec, rng, batch=2, D=4, L=5, G=2):
    rdt, cdt = (np.float32, np.complex64) if spec.real == "f32" else (np.float64, np.complex128)
    r = lambda *s: rng.standard_normal(s).astype(rdt)  # noqa: E731
    c = lambda *s: (rng.standard_normal(s) + 1j * rng.standard_normal(s)).astype(cdt)  # noqa: E731
    bc = {"const": lambda: c(D, spec.n), "shared": lambda: c(batch, L, spec.n),
          "grouped": lambda: c(batch, G, L, spec.n)}
    A = (-np.abs(r(D, spec.n)) + 1j * r(D, spec.n)).astype(cdt)
    ins = [r(batch, D, L), 0.3 * r(batch, D, L), A, bc[spec.b_kind](), bc[spec.c_kind]()]
    ins += [r(D)] * spec.has_d + [r(batch, D, L)] * spec.has_z + [r(D)] * spec.has_bias
    ins += [c(batch, D, spec.n)] * spec.has_h0
    outs = [np.full((batch, D, L), np.nan, rdt)] + [np.full((batch, D, spec.n), np.nan, cdt)] * spec.has_last
    return ins, outs


@pytest.mark.parametrize("spec", COMPLEX_SPECS[5::97], ids=str)
def test_complex_selective_builder_interprets_like_the_old_text(spec):
    # the interpreter on the old text and on the built module, channels 1..D-1: same bits
    ins, outs = _complex_inputs(spec, np.random.default_rng(sum(map(ord, str(spec)))))
    results = []
    for module in (parse_ir(legacy_ir.complex_selective_ir(spec)), selective_scan_complex_recurrence(spec)):
        mine = [o.copy() for o in outs]
        run_function(module, "selective_scan_complex", *[x.copy() for x in ins], *mine, 1, ins[0].shape[1])
        results.append(mine)
    for old, new in zip(*results):
        assert np.isfinite(old[:, 1:]).all() and np.isnan(old[:, 0]).all()  # d_begin = 1 is honoured
        assert old.tobytes() == new.tobytes()


def test_complex_selective_kernel_ir_lists_the_built_signature(tmp_path, monkeypatch):
    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path))
    spec = ComplexSelectiveSpec(3, "f64", "grouped", "const", True, True, False, True, True, False)
    built = kir.kernel_ir("selective_complex", spec=spec)
    assert built.name == "selective_scan_complex" and built.args == tuple(_old_arguments(spec))
    assert built.text == print_ir(selective_scan_complex_recurrence(spec))


@pytest.mark.parametrize("shape", [(1, 1 << 26), (1, 256), (3, 7), (2, 3, 5)])
def test_sum_scan_prints_the_old_gpu_kernels_text(shape):
    module = sum_scan(shape, len(shape) - 1, "i32")
    module.verify()
    assert print_ir(module) == print_ir(parse_ir(legacy_ir.generic_cumsum_ir(shape)))


# ------------------------------------------------------------ no IR from format strings

PACKAGE = Path(scanweaver.__file__).parent
# IR syntax: an op applied to SSA values, a func/module header, a memref type, a block label
IR_TEXT = re.compile(
    r"func\.func\s*@|\b(arith|memref|scf|scan|math|vector|llvm|gpu|func)\.[a-z_]+\b[^'\n]*%"
    r"|memref<|\^bb\d|\bbuiltin\.module\b|= (arith|memref|scf|scan|math)\."
)
# LLVM IR syntax: a definition or declaration, an instruction on typed operands, a
# branch, a global.  (Written as text, LLVM IR escapes the builder's checks until
# LLVM parses it; llvmlite.ir costs nothing where llvmlite.binding compiles it.)
LLVM_TEXT = re.compile(
    r"\b(define|declare)\s+(void|i\d+|float|double|ptr)\b|\bgetelementptr\b[^\n]*\bptr %|\bstore\b[^\n]*\bptr %"
    r"|= (load|phi|call|alloca|atomicrmw|icmp|fcmp|f?add|f?sub|f?mul|[su]div|fdiv|zext|sext|trunc|bitcast)\b[^\n]*%"
    r"|\bbr (label|i1) %|\bret void\b|= (global|constant) (i\d+|float|double|ptr)\b"
)
# Formatted strings that quote IR inside a message are not IR being built.
MESSAGE_CALLS = ("Error", "Exception", "Warning", "warn", "print", "append", "CannotLower", "Unsupported",
                 "NotAssociative", "_Reject")
# The calling layer's readable name of a parsed argument type (messages, not code to compile).
ALLOWED = {
    ("runtime/cpu.py", "MemRef.__str__"),
    ("toolchain/mlir.py", "GPU_PIPELINE_STAGES"),  # an mlir-opt pass pipeline, not IR
    # The small-call trampolines' LLVM IR is their disk cache key (`native_program`),
    # so a warm process makes the text on its first small call: built with llvmlite.ir,
    # that call would import it (about 4 ms, `python -X importtime`, against a warm
    # first call of about 24 ms) where today it imports no llvmlite module.
    ("runtime/cpu_object_call.py", "_memref_words"),
    ("runtime/cpu_object_call.py", "trampoline_ir"),
    ("runtime/cpu_object_call.py", "_PROBE_IR"),
    # Looks for MLIR's LLVM IR of the VJP to add `noalias` and a function attribute (no
    # llvmlite API sets them on a parsed module): edits text it did not write.
    ("torch/_kernels.py", "_compile_noalias"),
}


def _formatted_ir(path: Path, package: Path = PACKAGE) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def context(node) -> tuple[bool, str]:
        where, p = [], parents.get(node)
        message = False
        while p is not None:
            if isinstance(p, ast.Raise):
                message = True
            if isinstance(p, ast.Call):
                f = p.func
                name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", "")
                message |= name.endswith(MESSAGE_CALLS)
            if isinstance(p, (ast.FunctionDef, ast.ClassDef)):
                where.append(p.name)
            p = parents.get(p)
        return message, ".".join(reversed(where))

    def docstring(node) -> bool:
        return isinstance(parents.get(node), ast.Expr)

    def named(node) -> str:  # a module-level constant: the name it is assigned to
        p = parents.get(node)
        while p is not None and not isinstance(p, ast.Assign):
            p = parents.get(p)
        targets = p.targets if p is not None else []
        return targets[0].id if targets and isinstance(targets[0], ast.Name) else ""

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            literal = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
            if not (IR_TEXT.search(literal) or LLVM_TEXT.search(literal)):
                continue
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and not docstring(node)
              and not isinstance(parents.get(node), ast.JoinedStr)):
            literal = node.value
            if not LLVM_TEXT.search(literal):
                continue
        else:
            continue
        message, where = context(node)
        where = where or named(node)
        if not message and (str(path.relative_to(package)), where) not in ALLOWED:
            found.append(f"{path.relative_to(package.parent)}:{node.lineno} ({where}): {literal[:60]!r}")
    return found


def test_the_checker_finds_formatted_ir(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        'def ir(el):\n    return f"func.func @f(%a: memref<?x{el}>) {{}}"\n'
        'def msg(x):\n    raise ValueError(f"scan.yield %a : {x} is wrong")\n'
    )
    found = _formatted_ir(probe, tmp_path)
    assert len(found) == 1 and "(ir)" in found[0]


def test_the_checker_finds_llvm_ir_text(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        'def loop(t):\n    return [f"  %p = getelementptr {t}, ptr %a, i64 %i", "  br label %time"]\n'
        'def add(t):\n    return f"  %s = fadd {t} %x, %y"\n'
        'HELPER = """\ndefine i64 @get() {\n  ret i64 0\n}\n"""\n'
        'def doc():\n    """`define void @f(ptr %a)` in a docstring is not IR being built."""\n'
        'def msg(x):\n    raise ValueError(f"store float {x}, ptr %p is wrong")\n'
    )
    found = sorted(_formatted_ir(probe, tmp_path), key=lambda hit: int(hit.split(":")[1].split(" ")[0]))
    assert [hit.split(" ")[1] for hit in found] == ["(loop):", "(loop):", "(add):", "(HELPER):"], found


def test_no_ir_built_from_format_strings():
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) for hit in _formatted_ir(path)]
    assert not found, "IR written as text (use the xDSL builders, llvmlite.ir for LLVM IR):\n" + "\n".join(found)


def test_the_checker_finds_the_old_llvm_ir_text():
    # the LLVM IR text the CPU first tier and the denormal helpers wrote before the builder
    path = Path(legacy_ir.__file__)
    where = {hit.split(" (")[1].split(")")[0] for hit in _formatted_ir(path, path.parent)}
    assert {"affine_loop_ir", "dispatch_ir", "_DENORMAL_HELPERS"} <= where, where
