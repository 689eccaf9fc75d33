"""Deployable GPU artifacts: PTX or a cubin plus a self-contained `OUT.launch.json`.

    scanweaver compile FILE.mlir --target ptx -o OUT        # build host (MLIR tools)
    program = scanweaver.load(OUT)                           # GPU host: numpy + a driver
    program.f(a, b, h)

`load` needs only numpy and one CUDA driver binding (cuda-python, numba-cuda or
numba): it imports neither xDSL nor the MLIR tool packages and runs no tool; the
launch description is plain JSON (`KernelLaunch.to_json`).

`OUT.launch.json` (format "scanweaver-cuda-artifact", version 1):

    image, image_kind ("ptx" | "cubin"), image_sha256, chip
    functions: {host function: {"arg_count": n, "args": [...], "kernels": [index, ...],
                 "results": [...], "contract": {...}}}
        each kernel runs in that order; "args" gives, per host argument, its kind
        ("in" | "out" | "inout" | "scalar" | "unused"), dtype and shape as the kernels see it;
        "contract" (optional) the shape contract of the function's IR (`contract_check`):
        checked before each call, so no access of the kernels leaves its array
    kernels: [KernelLaunch.to_json() + {"ptxas": {registers, spill_stores, ...}}]
        kernel, grid (ints or products of "arg.shape[i]"), block, static_shared_bytes,
        dynamic_shared_bytes (0), args [[name, kind, dtype, shape]], host_args,
        equal_dims, abi ("memref-descriptor": per memref (ptr, ptr, i64 offset,
        i64 sizes[rank], i64 strides[rank]); a scalar is one value of its type)
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from scanweaver.errors import ScanWeaverError, ScanWeaverTypeError, ScanWeaverValueError
from scanweaver.runtime.cuda_launch import KernelLaunch

FORMAT = "scanweaver-cuda-artifact"
VERSION = 1


def launch_json_path(out: Path) -> Path:
    return out.with_name(out.name + ".launch.json")


def describe(
    image: str | bytes,
    image_name: str,
    chip: str,
    launches: dict[str, list[KernelLaunch]],
    arg_counts: dict[str, int],
    ptxas: dict[str, dict[str, int]] | None = None,
    results: dict[str, list[str]] | None = None,
    contracts: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The launch.json document for an image and the launches of each host function
    (`results`: the scalar types a function returns through its last arguments;
    `contracts`: each function's shape contract as plain data, `contract_check`)."""
    kernels: list[KernelLaunch] = []
    index: dict[str, int] = {}
    functions: dict[str, Any] = {}
    for fname, seq in launches.items():
        order = []
        for desc in seq:
            if desc.kernel_name not in index:
                index[desc.kernel_name] = len(kernels)
                kernels.append(desc)
            order.append(index[desc.kernel_name])
        args: list[dict[str, Any]] = [{"kind": "unused"} for _ in range(arg_counts[fname])]
        for desc in seq:
            for (name, kind, dtype, shape), pos in zip(desc.args, desc.host_args):
                if pos < 0:
                    continue
                prev = args[pos].get("kind", "unused")
                merged = kind if prev in ("unused", kind) else "inout"
                args[pos] = {"name": name, "kind": merged, "dtype": dtype, "shape": list(shape)}
        functions[fname] = {"arg_count": arg_counts[fname], "args": args, "kernels": order}
        if (results or {}).get(fname):
            functions[fname]["results"] = list(results[fname])  # type: ignore[index]
        if fname in (contracts or {}):  # the loader checks it before each call, as compile() does
            functions[fname]["contract"] = contracts[fname]  # type: ignore[index]
    data = image.encode() if isinstance(image, str) else image
    return {
        "format": FORMAT,
        "version": VERSION,
        "image": image_name,
        "image_kind": "ptx" if isinstance(image, str) else "cubin",
        "image_sha256": hashlib.sha256(data).hexdigest(),
        "chip": chip,
        "functions": functions,
        "kernels": [dict(k.to_json(), ptxas=(ptxas or {}).get(k.kernel_name, {})) for k in kernels],
    }


def _temp_beside(path: Path, data: bytes) -> str:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the usual permissions
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def write_artifact(out: Path, image: str | bytes, document: dict[str, Any]) -> Path:
    """Write OUT (the image) and OUT.launch.json: both written to temporary files
    first, then renamed into place, so a failure leaves neither half-written."""
    out = Path(out).resolve()
    meta = launch_json_path(out)
    temps: list[str] = []
    try:
        temps.append(_temp_beside(out, image.encode() if isinstance(image, str) else image))
        temps.append(_temp_beside(meta, json.dumps(document, indent=2).encode()))
        os.replace(temps[0], out)
        os.replace(temps[1], meta)
    except OSError as e:
        for t in temps:
            if os.path.exists(t):
                os.unlink(t)
        raise ScanWeaverError(f"cannot write {out}: {e.strerror}") from None
    return meta


def read_artifact(path: str | os.PathLike) -> tuple[dict[str, Any], str | bytes]:
    """(launch document, image) of an artifact given as OUT or OUT.launch.json; every
    field of the document checked (`cuda_artifact_schema`) before it is returned."""
    from scanweaver.runtime.cuda_artifact_schema import check_document, check_ptx_signatures

    if not isinstance(path, str | os.PathLike) or isinstance(os.fspath(path), bytes):
        raise ScanWeaverTypeError(f"an artifact path must be a str or a path, not {type(path).__name__}")
    path = Path(path)
    if not path.name:
        raise ScanWeaverValueError(f"{str(path)!r} names no file: give OUT or OUT.launch.json")
    meta = path if path.name.endswith(".launch.json") else launch_json_path(path)
    try:
        doc = json.loads(meta.read_bytes().decode())
    except OSError as e:
        raise ScanWeaverValueError(f"cannot read {meta}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ScanWeaverValueError(f"{meta} is not UTF-8 text, so not a launch description") from None
    except (json.JSONDecodeError, RecursionError) as e:
        raise ScanWeaverValueError(f"{meta} is not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ScanWeaverValueError(f"{meta} is not a ScanWeaver GPU artifact (no format '{FORMAT}')")
    if doc.get("version") != VERSION or isinstance(doc.get("version"), bool):
        raise ScanWeaverValueError(
            f"{meta} has artifact version {doc.get('version')!r}; this ScanWeaver reads {VERSION}: rebuild it"
        )
    check_document(doc, str(meta))
    image_path = meta.with_name(doc["image"])
    try:
        blob = image_path.read_bytes()
    except OSError as e:
        raise ScanWeaverValueError(f"cannot read {image_path}: {e.strerror}") from None
    if hashlib.sha256(blob).hexdigest() != doc["image_sha256"]:
        raise ScanWeaverValueError(f"{image_path} does not match {meta} (its SHA-256 differs): rebuild both")
    if doc["image_kind"] == "cubin":
        return doc, blob
    try:
        ptx = blob.decode()
    except UnicodeDecodeError:
        raise ScanWeaverValueError(f"{image_path} is not PTX text (not UTF-8)") from None
    check_ptx_signatures(doc, ptx, str(meta))
    return doc, ptx


def plan(doc: dict[str, Any]) -> tuple[dict[str, list[KernelLaunch]], dict[str, int]]:
    """Launch sequences and argument counts of each host function of a document."""
    kernels = [KernelLaunch.from_json(k) for k in doc["kernels"]]
    launches = {name: [kernels[i] for i in f["kernels"]] for name, f in doc["functions"].items()}
    counts = {name: int(f["arg_count"]) for name, f in doc["functions"].items()}
    return launches, counts


def ptx_runs_on(chip: str, device: str) -> bool:
    """Whether the driver can compile PTX built for `chip` to the `device` chip: PTX
    runs on its own and newer chips, "a" (architecture-specific) PTX on that chip
    only, "f" (family) PTX on chips of the same major version."""
    def split(name: str) -> tuple[int, str]:
        digits = name[3:].rstrip("af")
        return int(digits), name[3 + len(digits):]

    (want, kind), (have, _) = split(chip), split(device)
    if kind == "a":
        return have == want
    if kind == "f":
        return have // 10 == want // 10 and have >= want
    return have >= want


def _driver_for(driver: Any):
    """`load`'s driver argument: None, a binding's name ("cuda-python", "numba-cuda",
    "numba") or an opened `CudaDriver`."""
    from scanweaver.runtime.cuda_driver import DRIVER_ORDER, CudaDriver, open_driver

    if driver is None or isinstance(driver, CudaDriver):
        return driver
    if isinstance(driver, str):
        if driver not in DRIVER_ORDER:
            raise ScanWeaverValueError(f"driver {driver!r} is not a CUDA driver binding: one of {', '.join(DRIVER_ORDER)}")
        return open_driver(driver)
    raise ScanWeaverTypeError(f"driver must be a binding's name or a CudaDriver, not {type(driver).__name__}")


def load(path: str | os.PathLike, driver: Any = None):
    """A callable `Program` from an artifact written by `scanweaver compile --target
    ptx|cubin -o OUT` (give OUT or OUT.launch.json).  Needs a CUDA driver binding:
    `driver` names one ("cuda-python", "numba-cuda", "numba") or is an opened
    `CudaDriver`; by default the first that starts."""
    from scanweaver.runtime.program import Program
    from scanweaver.runtime.cuda import CudaFunction, CudaModule, current_driver, device_chip
    from scanweaver.runtime.cuda_results import with_results

    doc, image = read_artifact(path)
    driver = _driver_for(driver) or current_driver()
    have = device_chip(driver)
    if doc["image_kind"] == "cubin" and have != doc["chip"]:
        raise ScanWeaverValueError(
            f"{path}: the cubin is for {doc['chip']} but this GPU is {have}; build PTX (--target ptx) "
            "or a cubin for this chip"
        )
    if doc["image_kind"] == "ptx" and not ptx_runs_on(doc["chip"], have):
        raise ScanWeaverValueError(
            f"{path}: the PTX is for {doc['chip']}, which this GPU ({have}) cannot run; "
            f"rebuild with --chip {have}"
        )
    launches, counts = plan(doc)
    module = CudaModule(image, driver=driver)
    functions = {
        name: with_results(CudaFunction(module, name, seq, counts[name], doc["functions"][name].get("contract")),
                           name, doc["functions"][name].get("results", []), counts[name])
        for name, seq in launches.items()
    }
    return Program(functions, [], image if isinstance(image, str) else doc["image"])


__all__ = ["FORMAT", "VERSION", "describe", "launch_json_path", "load", "plan", "ptx_runs_on", "read_artifact",
           "write_artifact"]
