"""The GPU check's section of benchmarks/README.md, from benchmarks/results/gpu-check.json.

`benchmarks/gpu/run_bundle.py` writes that JSON on a GPU machine; until a real run's
JSON is committed the section says plainly that nothing has run on GPU hardware.
"""

from __future__ import annotations

import json
from pathlib import Path

RESULT = "gpu-check.json"


def readme_section(results_dir: Path) -> str:
    path = results_dir / RESULT
    lines = ["## GPU check", ""]
    result = json.loads(path.read_text()) if path.exists() else None
    if result is None or result.get("dry_run"):
        lines += [
            "Nothing has run on GPU hardware yet. `benchmarks/gpu/` holds the check bundle (PTX + launch "
            "descriptions for every kernel family, built by `benchmarks/gpu/build_bundle.py`) and its "
            "runner `benchmarks/gpu/run_bundle.py`, which writes `results/gpu-check.json` on a GPU machine; "
            "see benchmarks/gpu/README.md.",
            "",
        ]
        return "\n".join(lines)
    m = result["machine"]
    lines += [
        f"From [`results/{RESULT}`](results/{RESULT}) ({result['created']}): {m.get('gpu', '?')} ({m.get('chip')}), "
        f"driver binding {m.get('driver_binding')}, Python {m.get('python')}"
        + (f", torch {m['torch']}" if m.get("torch") else "") + (f", triton {m['triton']}" if m.get("triton") else "")
        + ". Outputs pre-filled with NaN and checked against float64 references (integers bit for bit) before "
        "timing; times are CUDA events over back-to-back launches on device-resident arrays; the copy is a "
        "device-to-device copy moving the same bytes.",
        "",
        "| case | check | ScanWeaver ms | GB/s | % of copy | peers (ms) |",
        "|---|---|---|---|---|---|",
    ]
    for c in result["cases"]:
        t = c.get("timing")
        status = c["check"]["status"]
        if t:
            peers = ", ".join(
                f"{k} {v['ms']:.3g}" if v.get("status") == "ok" else f"{k}: {v.get('status')}"
                for k, v in t["peers"].items()
            )
            lines.append(f"| {c['name']} | {status} | {t['scanweaver_ms']:.3g} | {t['gbs']:.0f} | "
                         f"{100 * t['copy_fraction']:.0f}% | {peers or '-'} |")
        else:
            lines.append(f"| {c['name']} | {status} | - | - | - | - |")
    lines.append("")
    return "\n".join(lines)


__all__ = ["readme_section"]
