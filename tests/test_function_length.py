"""No function in `scanweaver/` grows past a screenful (issue 9: long functions are split
into named steps).  The test reads the source with `ast`; a nested function counts on
its own and inside the one holding it.

`ALLOWED` names the functions other branches are splitting now; the integrator removes
an entry when its branch lands (a stale entry fails too, so the list only shrinks).
"""

from __future__ import annotations

import ast
from pathlib import Path

import scanweaver

PACKAGE = Path(scanweaver.__file__).parent
MAX_LINES = 100

#: "path relative to scanweaver/:qualified.name" -> who is splitting it
ALLOWED = {
}


def function_lengths(package: Path = PACKAGE) -> dict[str, int]:
    """Lines (def to last line, decorators excluded) of every function, by "file:qualname"."""
    out: dict[str, int] = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()

        def walk(node: ast.AST, prefix: str) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    name = prefix + child.name
                    out[f"{rel}:{name}"] = child.end_lineno - child.lineno + 1  # type: ignore[operator]
                    walk(child, name + ".")
                elif isinstance(child, ast.ClassDef):
                    walk(child, prefix + child.name + ".")
                else:
                    walk(child, prefix)

        walk(ast.parse(path.read_text(), str(path)), "")
    return out


def test_no_function_is_longer_than_the_limit():
    lengths = function_lengths()
    too_long = {name: n for name, n in lengths.items() if n > MAX_LINES and name not in ALLOWED}
    assert not too_long, (
        f"split these into named steps (at most {MAX_LINES} lines each): "
        + ", ".join(f"{name} ({n} lines)" for name, n in sorted(too_long.items()))
    )


def test_the_allow_list_has_no_stale_entries():
    lengths = function_lengths()
    stale = [name for name in ALLOWED if lengths.get(name, 0) <= MAX_LINES]
    assert not stale, f"remove from ALLOWED (gone or short enough now): {stale}"


def test_the_measure_sees_nested_and_method_functions(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    body = "\n".join(f"            x{i} = {i}" for i in range(MAX_LINES))
    (pkg / "m.py").write_text(f"class C:\n    def f(self):\n        def g():\n{body}\n        return g\n")
    lengths = function_lengths(pkg)
    assert lengths["m.py:C.f.g"] == MAX_LINES + 1
    assert lengths["m.py:C.f"] == MAX_LINES + 3
