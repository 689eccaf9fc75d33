"""Facts read from PTX text (no tools needed): kernels and their static shared memory.

MLIR emits each shared-memory `memref.global` as a module-level `.shared` variable;
a kernel's static shared memory is the sum of those it references, laid out in
declaration order with their alignment (what ptxas reports as `smem`).
"""

from __future__ import annotations

import re

_TYPE_BYTES = {"8": 1, "16": 2, "32": 4, "64": 8}
_SHARED = re.compile(
    r"^\s*\.shared\s+(?:\.align\s+(\d+)\s+)?\.[bfsu](8|16|32|64)\s+([\w$.]+)(?:\[(\d+)\])?\s*;", re.M
)
_ENTRY = re.compile(r"\.entry\s+([\w$]+)\s*\(")


def shared_variables(ptx: str) -> list[tuple[str, int, int]]:
    """(name, bytes, alignment) of every `.shared` variable, in declaration order."""
    out = []
    for m in _SHARED.finditer(ptx):
        align, bits, name, count = m.groups()
        size = _TYPE_BYTES[bits] * (int(count) if count else 1)
        out.append((name, size, int(align) if align else _TYPE_BYTES[bits]))
    return out


def kernel_bodies(ptx: str) -> dict[str, str]:
    """Kernel name -> its text (from `.entry` to the next `.entry` or the end)."""
    starts = [(m.start(), m.group(1)) for m in _ENTRY.finditer(ptx)]
    return {
        name: ptx[pos : starts[i + 1][0] if i + 1 < len(starts) else len(ptx)]
        for i, (pos, name) in enumerate(starts)
    }


def static_shared_bytes(ptx: str) -> dict[str, int]:
    """Kernel name -> bytes of static shared memory it uses."""
    variables = shared_variables(ptx)
    result = {}
    for kernel, body in kernel_bodies(ptx).items():
        total = 0
        for name, size, align in variables:
            if re.search(rf"(?<![\w$]){re.escape(name)}(?![\w$])", body):
                total = -(-total // align) * align + size
        result[kernel] = total
    return result


__all__ = ["kernel_bodies", "shared_variables", "static_shared_bytes"]
