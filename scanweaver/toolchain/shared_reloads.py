"""Loads from a block's shared copy of per-element values stay where they are used.

`recurrence_gpu._hoist_elements_to_shared` keeps the element-only values of a large
state (the selective scan's A[d, n] at N = 64) in one shared array per block instead of
N registers per thread, and reads each where it is used. Nothing writes that array after
the kernel's first barrier, so LLVM's GVN may replace the replay's loads by the first
pass's values, which are then all live across the tile: ptxas sm_90, N = 64, 168 to 255
registers (3 resident blocks to 2). A `volatile` load is never merged with another, so
each read stays a `ld.volatile.shared` next to its use (168 registers, 0 spills).

`mark_shared_reloads_volatile` works on the kernels' printed LLVM-dialect MLIR between
`convert-gpu-to-nvvm` and `gpu-module-to-binary` (`mlir._lower_gpu`), as
`readonly_params.mark_readonly_loads_invariant` does, for the loads whose address is a
shared global named `*RELOADED_SHARED_SUFFIX` or a `getelementptr` chain on one.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from scanweaver.rewrites.gpu_kernel import RELOADED_SHARED_SUFFIX

_FUNC_START = re.compile(r"^\s*llvm\.func @", re.M)
_GEP = re.compile(r"^\s*(%[\w$.-]+) = llvm\.getelementptr (?:[\w|]+ )?(%[\w$.-]+)\[")
_ADDRESS_OF = re.compile(r"^\s*(%[\w$.-]+) = llvm\.mlir\.addressof @([\w$.-]+)")


def mark_loads_on_chains(llvm_text: str, word: str, roots: Callable[[str, str], set[str]]) -> str:
    """In each `gpu.kernel` function of printed LLVM-dialect MLIR, the loads whose
    address is one of `roots(head, body)` (SSA names) or a chain of `llvm.getelementptr`
    on one get `word` (`invariant`, `volatile`), once."""
    load = re.compile(rf"^(\s*%[\w$.-]+ = llvm\.load )(%[\w$.-]+)( (?!{word}\b))")
    starts = [m.start() for m in _FUNC_START.finditer(llvm_text)] + [len(llvm_text)]
    out = [llvm_text[: starts[0]]]
    for begin, end in zip(starts, starts[1:]):
        body = llvm_text[begin:end]
        head = body.split("\n", 1)[0]
        if "gpu.kernel" not in head:
            out.append(body)
            continue
        chain = roots(head, body)
        lines = body.split("\n")
        for i, line in enumerate(lines):
            gep = _GEP.match(line)
            if gep and gep.group(2) in chain:
                chain.add(gep.group(1))
                continue
            found = load.match(line)
            if found and found.group(2) in chain:
                lines[i] = _with_word(line, found, word)
        out.append("\n".join(lines))
    return "".join(out)


def _with_word(line: str, found: re.Match[str], word: str) -> str:
    """`llvm.load volatile %p ...` (before the address), `llvm.load %p invariant ...` (after)."""
    if word == "volatile":
        return found.group(1) + "volatile " + line[found.start(2):]
    return found.group(1) + found.group(2) + f" {word}" + line[found.end(2):]


def _reloaded_globals(_head: str, body: str) -> set[str]:
    return {m.group(1) for line in body.split("\n") if (m := _ADDRESS_OF.match(line))
            and m.group(2).endswith(RELOADED_SHARED_SUFFIX)}


def mark_shared_reloads_volatile(llvm_text: str) -> str:
    """Loads from the `*RELOADED_SHARED_SUFFIX` shared arrays become `volatile` (module doc)."""
    return mark_loads_on_chains(llvm_text, "volatile", _reloaded_globals)
