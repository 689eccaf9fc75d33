"""Peak extra memory of one forward + backward, per selective-grad peer, in a fresh process.

Each peer runs in its own child process (`python -m scanweaver.bench.grad_memory`): the
inputs are made and the peer set up and warmed up (JIT compiles, caches), then the peak
resident set size is reset (`/proc/self/clear_refs` = 5, Linux) and one forward +
backward runs (ScanWeaver's output cache emptied first: the buffers it would hand out are
the run's memory too).  Extra memory = peak RSS during that run - RSS before it: what the run
allocates on top of its inputs, whatever allocates it (numpy, torch, XLA, the JIT code's
own mallocs).  For ScanWeaver the numpy allocations are also traced with tracemalloc
(numpy reports its buffers to it), as a cross-check that excludes page-cache effects.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

#: Peers whose allocations are numpy arrays (tracemalloc sees them).
_NUMPY_PEERS = ("scanweaver-cpu",)


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def measure_here(peer_name: str, params: dict[str, Any]) -> dict[str, Any]:
    """Set up `peer_name` on the selective-grad case `params`, warm it up, then measure one run."""
    import tracemalloc

    from scanweaver.bench.harness import Case, make_inputs
    from scanweaver.bench.peers import default_peers

    peer = next(p for p in default_peers() if p.workload == "selective-grad" and p.name == peer_name)
    case = Case("selective-grad", "peak memory", dict(params))
    prepared = peer.setup(make_inputs(case))
    if prepared.compile is not None:
        prepared.compile()  # JIT compiles and first-call caches are not the run's memory
    if peer_name in _NUMPY_PEERS:
        # The warm-up left its dropped outputs and gradient buffers in ScanWeaver's output
        # cache, where the run would take them again unseen: empty it, so the run's peak
        # counts every buffer the run holds.
        from scanweaver.runtime.cpu_variants import release_outputs

        release_outputs()
    gc.collect()
    before = _status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak RSS (VmHWM) to the current RSS
    traced = peer_name in _NUMPY_PEERS
    if traced:
        tracemalloc.start()
    result = prepared.run()
    peak = _status_kib("VmHWM")
    numpy_peak = tracemalloc.get_traced_memory()[1] if traced else None
    if traced:
        tracemalloc.stop()
    del result
    return {"rss_before_bytes": before * 1024, "extra_bytes": (peak - before) * 1024,
            "numpy_traced_peak_bytes": numpy_peak}


def measure(peer_name: str, params: dict[str, Any], timeout_s: float = 900.0) -> dict[str, Any]:
    """measure_here in a child process; {"status": "failed", "reason": ...} when it fails."""
    cmd = [sys.executable, "-m", "scanweaver.bench.grad_memory", peer_name, json.dumps(params)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"status": "failed", "reason": f"took over {timeout_s:.0f} s"}
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"status": "failed", "reason": last}
    return {"status": "ok", **json.loads(done.stdout.strip().splitlines()[-1])}


def problem_bytes(params: dict[str, Any]) -> int:
    """One (batch, D, L) float32 array: the unit the extra memory is counted in."""
    return 4 * params["batch"] * params["D"] * params["L"]


def readme_section(result: dict[str, Any]) -> str:
    """Markdown for the peak-memory measurements of a harness result ("" without any)."""
    rows = []
    for case in result.get("cases", []):
        mem = case.get("peak_memory")
        if not mem:
            continue
        unit = problem_bytes(case["params"])
        for peer, m in mem.items():
            if m.get("status") != "ok":
                rows.append(f"| {case['label']} | {peer} | {m.get('status')}: {m.get('reason')} | | |")
                continue
            traced = m.get("numpy_traced_peak_bytes")
            rows.append(
                f"| {case['label']} | {peer} | {m['extra_bytes'] / 2**20:.1f} | {m['extra_bytes'] / unit:.1f} | "
                + (f"{traced / 2**20:.1f}" if traced is not None else "-") + " |")
    if not rows:
        return ""
    head = [
        "## Peak memory of forward + backward",
        "",
        "Each peer in a fresh process (`scanweaver.bench.grad_memory`): set up and warmed up, then the peak "
        "resident set size is reset and one forward + backward runs. Extra = peak RSS during the run - RSS "
        "before it (MiB), and that in units of one (batch, D, L) float32 array. numpy traced: tracemalloc's "
        "peak of the run's numpy allocations (ScanWeaver only).",
        "",
        "| case | peer | extra (MiB) | extra / (batch x D x L x 4 B) | numpy traced (MiB) |",
        "|---|---|---|---|---|",
    ]
    return "\n".join(head + rows) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scanweaver.bench.grad_memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("peer")
    parser.add_argument("params", help='JSON: {"batch": .., "D": .., "N": .., "L": ..}')
    args = parser.parse_args(argv)
    print(json.dumps(measure_here(args.peer, json.loads(args.params))))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
