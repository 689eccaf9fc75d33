"""The IR of the drivers' kernels, from the workload builders, cached by their options.

`kernel_ir("affine", shape=..., ...)` or `kernel_ir("selective", spec=...)` returns the
printed module, its function's name and its argument list (per argument a memref
rank or a scalar type name, read from the built function's signature).  The result
is kept in-process and on disk (keyed by the builder, its options and ScanWeaver's
sources), so a warm process gets its kernels' IR without importing xDSL: the IR text
is then the key of the compiled kernel in the compile cache.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import threading
from dataclasses import dataclass
from typing import Any

#: workload name -> (module, builder function): the one builder of each workload.
BUILDERS = {
    "affine": ("scanweaver.workloads.affine", "affine_scan"),
    "selective": ("scanweaver.workloads.selective", "selective_scan_recurrence"),
    "selective_gpu": ("scanweaver.workloads.selective", "selective_scan_gpu"),
    "selective_tiled": ("scanweaver.workloads.selective", "selective_scan_tiled"),
    "selective_complex": ("scanweaver.workloads.selective_complex", "selective_scan_complex_recurrence"),
    "selective_complex_gpu": ("scanweaver.workloads.selective_complex", "selective_scan_complex_gpu"),
}


@dataclass(frozen=True)
class KernelIR:
    text: str  # the printed builtin.module
    name: str  # its func.func
    args: tuple[int | str, ...]  # per argument: memref rank, or scalar type name


_MEMO: dict[str, KernelIR] = {}
_LOCK = threading.Lock()


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {"type": type(value).__name__, **dataclasses.asdict(value)}
    raise TypeError(f"cannot key a workload option of type {type(value).__name__}")


def build(workload: str, **options: Any):
    """The built `ModuleOp` of `workload` (imports xDSL)."""
    module, name = BUILDERS[workload]
    builder = getattr(importlib.import_module(module), name)
    return builder(**options)


def _build_entry(workload: str, options: dict[str, Any]) -> bytes:
    from xdsl.dialects import func

    from scanweaver.ir import print_ir
    from scanweaver.workloads.types import kernel_arguments

    module = build(workload, **options)
    (fn,) = [op for op in module.body.block.ops if isinstance(op, func.FuncOp)]
    entry = {"text": print_ir(module), "name": fn.sym_name.data, "args": list(kernel_arguments(fn))}
    with _LOCK:
        _JUST_BUILT[entry["text"]] = module
    return json.dumps(entry).encode()


#: Modules built in this process, by their printed text, until one compile takes each
#: (`take_built`): a cold first call then lowers the module it has just built instead
#: of parsing its text again (the parse of the selective kernel is a tenth of its cold
#: build; the module is the one its text was printed from).
_JUST_BUILT: dict[str, Any] = {}


def take_built(text: str):
    """The module whose printed text is `text` if this process built it and no compile
    has taken it yet (the caller may change it), else None."""
    with _LOCK:
        return _JUST_BUILT.pop(text, None)


def _parse_entry(payload: bytes) -> KernelIR:
    """A `workload-ir` cache entry; TypeError/ValueError/KeyError when malformed."""
    data = json.loads(payload)
    text, name, args = data["text"], data["name"], data["args"]
    if not isinstance(text, str) or not isinstance(name, str) or not isinstance(args, list):
        raise TypeError("malformed workload-ir entry")
    if not all(isinstance(a, (int, str)) and not isinstance(a, bool) for a in args):
        raise TypeError("malformed workload-ir argument list")
    return KernelIR(text, name, tuple(args))


class _NotCached(Exception):
    """A lookup (`cached_only`) found no entry."""


def _not_cached() -> bytes:
    raise _NotCached


def kernel_ir(workload: str, cached_only: bool = False, **options: Any) -> KernelIR | None:
    """The IR of `workload` built with `options` (see `BUILDERS`), cached.
    cached_only: None when it is neither in this process nor in the disk cache (nothing
    is built, xDSL is not imported)."""
    from scanweaver.compiler import built_workload

    if workload not in BUILDERS:
        raise ValueError(f"unknown workload {workload!r} (have: {', '.join(BUILDERS)})")
    # JSON-plain options (dataclass specs as dicts): the memo and the disk cache key
    material = json.loads(json.dumps({"workload": workload, "options": options}, default=_plain))
    key = json.dumps(material, sort_keys=True)
    with _LOCK:
        found = _MEMO.get(key)
    if found is not None:
        return found
    try:
        found = built_workload(material, _not_cached if cached_only else lambda: _build_entry(workload, options),
                               _parse_entry)
    except _NotCached:
        return None
    with _LOCK:
        _MEMO[key] = found
    return found


__all__ = ["BUILDERS", "KernelIR", "build", "kernel_ir", "take_built"]
