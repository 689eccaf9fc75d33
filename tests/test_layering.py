"""Dependencies run one way (issue 9): the compiler and runtime layers never import
the public API or the tools built on it, so `api` can be rebuilt on top of them.

The test reads every module's imports with `ast` (top-level and lazy ones inside
functions alike) instead of importing anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import scanweaver

PACKAGE = Path(scanweaver.__file__).parent
LOWER_LAYERS = ("runtime", "toolchain", "rewrites")
UPPER_MODULES = ("scanweaver.api", "scanweaver.cli", "scanweaver.demo", "scanweaver.bench")


def _module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, package: Path = PACKAGE) -> set[str]:
    """Absolute names of the modules `path` (a file of `package`) imports, relative
    imports resolved."""
    here = _module_name(path, package).split(".")
    if path.name != "__init__.py":
        here = here[:-1]  # the package a relative import starts from
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names.add(module)
            # `from scanweaver import api` imports the module scanweaver.api
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def _is_upper(name: str) -> bool:
    return any(name == up or name.startswith(up + ".") for up in UPPER_MODULES)


def test_resolves_relative_and_from_imports(tmp_path):
    pkg = tmp_path / "scanweaver" / "runtime"
    pkg.mkdir(parents=True)
    probe = pkg / "probe.py"
    probe.write_text("from .. import api\nfrom scanweaver import cli\ndef f():\n    import scanweaver.demo\n")
    found = {n for n in imported_modules(probe, tmp_path / "scanweaver") if _is_upper(n)}
    assert found == {"scanweaver.api", "scanweaver.cli", "scanweaver.demo"}


@pytest.mark.parametrize("layer", LOWER_LAYERS)
def test_lower_layers_do_not_import_the_api(layer):
    offenders = [
        f"{path.relative_to(PACKAGE.parent)} imports {name}"
        for path in sorted((PACKAGE / layer).rglob("*.py"))
        for name in sorted(imported_modules(path))
        if _is_upper(name)
    ]
    assert not offenders, "imports against the layering:\n" + "\n".join(offenders)


def test_one_cannot_lower_exception():
    from scanweaver.errors import CannotLower
    from scanweaver.rewrites import recurrence_gpu, scan_to_cpu

    assert recurrence_gpu.Unsupported is CannotLower
    assert scan_to_cpu._Unsupported is CannotLower
    why = CannotLower("state of 9 > 8 elements")
    assert why.reason == str(why) == "state of 9 > 8 elements"


def test_one_dtype_table():
    import numpy as np

    from scanweaver import dtypes
    from scanweaver.runtime import cpu
    from scanweaver.workloads import scans

    assert cpu._NUMPY_DTYPES is dtypes.NUMPY_DTYPES
    assert scans.MLIR_ELEMENT is dtypes.MLIR_ELEMENT
    assert dtypes.mlir_element(np.float16) == "f16"
    assert dtypes.mlir_element(np.float16, ("f32", "f64")) is None
    assert dtypes.mlir_element(np.bool_) is None
