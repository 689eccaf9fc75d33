"""Plots (matplotlib, optional) and the README text, both generated from the result JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class PlotsUnavailable(Exception):
    """matplotlib is missing (pip install .[bench])."""


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as error:  # noqa: BLE001
        raise PlotsUnavailable(f"matplotlib not importable ({error}); pip install .[bench]") from None
    return plt


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text).strip("-").replace("--", "-")


def _families(result: dict[str, Any]) -> dict[str, list[dict]]:
    fams: dict[str, list[dict]] = {}
    for case in result["cases"]:
        fams.setdefault(case["family"], []).append(case)
    for cases in fams.values():
        cases.sort(key=lambda c: c["params"]["L"])
    return fams


def _peer_names(cases: list[dict]) -> list[str]:
    names: list[str] = []
    for case in cases:
        for name in case["results"]:
            if name not in names:
                names.append(name)
    return names


def make_plots(result: dict[str, Any], out_dir: Path, name: str) -> dict[str, Path]:
    """One latency plot per family (log-log), one bandwidth plot per family."""
    plt = _pyplot()
    images: dict[str, Path] = {}
    roof_gbs = result["stream_roofline"]["gbs"]
    for family, cases in _families(result).items():
        for kind in ("latency", "bandwidth"):
            fig, ax = plt.subplots(figsize=(7, 4.5))
            for peer in _peer_names(cases):
                xs, ys = [], []
                for case in cases:
                    r = case["results"].get(peer, {})
                    if r.get("status") == "ok":
                        xs.append(case["params"]["L"])
                        ys.append(r["median_s"] * 1e3 if kind == "latency" else r["gbs"])
                if xs:
                    style = dict(linewidth=2.5, color="black") if peer.startswith("scanweaver") else {}
                    ax.plot(xs, ys, marker="o", label=peer, **style)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("sequence length L")
            if kind == "latency":
                ax.set_yscale("log")
                ax.set_ylabel("median time (ms)")
                ax.set_title(f"{family}: latency")
            else:
                ax.axhline(roof_gbs, linestyle="--", color="grey", label=f"streaming roofline {roof_gbs:.1f} GB/s")
                ax.set_ylabel("achieved GB/s (minimal traffic)")
                ax.set_title(f"{family}: bandwidth")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7, loc="best")
            fig.tight_layout()
            path = out_dir / f"{name}-{_slug(family)}-{kind}.png"
            fig.savefig(path, dpi=110)
            plt.close(fig)
            images[f"{family} {kind}"] = path
    return images


def _fmt_ms(r: dict) -> str:
    status = r.get("status")
    if status == "ok":
        return f"{r['median_s'] * 1e3:.3g}"
    return status or "-"


def _row_key(case: dict) -> str:
    return str(case["params"].get("shape", case["params"]["L"]))


#: First-call rows: cold and warm are the goal's; the third shows what bytecode compilation costs.
_FIRST_CALL_KINDS = {"cold": "cold", "warm": "warm",
                     "cold_installed_bytecode": "cold, with the installed package's bytecode"}


def _first_call_breakdown(breakdown: dict) -> list[str]:
    """The table of where a cold first call's time goes (cpu_goals._breakdown_process)."""
    rows = [(what, r) for what, r in breakdown.items() if "stages_s" in r and r.get("profiled_s")]
    if not rows:
        return [f"First-call breakdown: {what}: error: {r['error']}" for what, r in breakdown.items() if "error" in r]
    lines = ["Where a cold first call's time goes (import scanweaver + the call in another cold process, under "
             "cProfile: each function's own time, by stage; the profiler slows Python code, so these seconds "
             "exceed the rows above; `bench/cpu_goals.py` FIRST_CALL_STAGES):", "",
             "| function | stage | profiled s | share |", "|---|---|---|---|"]
    for what, r in rows:
        for stage, sec in sorted(r["stages_s"].items(), key=lambda kv: -kv[1]):
            lines.append(f"| {what} | {stage} | {sec:.3f} | {100 * sec / r['profiled_s']:.0f}% |")
        lines.append(f"| {what} | total (packages loaded: {', '.join(r.get('packages') or []) or 'none'}) | "
                     f"{r['profiled_s']:.3f} | 100% |")
    return lines + [""]


def _process_text(row: dict) -> str:
    wall = row.get("process_wall_s")
    return "" if wall is None else f"{wall:.3f}"


def _verdict(ok: bool | None) -> str:
    return "-" if ok is None else ("yes" if ok else "**no**")


def goals_text(result: dict[str, Any]) -> list[str]:
    """The CPU goals section (cpu_goals.py measurements), empty when not measured."""
    from scanweaver.bench.miss_reasons import first_call_cold_reason, reason_for

    goals = result.get("cpu_goals") or {}
    if not goals:
        return []
    lines = ["## CPU goals (issue 16)", ""]
    tiny = goals.get("tiny_call", {})
    if "us_per_call" in tiny:
        lines += [f"Tiny calls ({tiny['shape'][0]} x {tiny['shape'][1]} f32, per call, median of interleaved "
                  f"rounds; target <= {tiny['target_us']:g} us for ScanWeaver):", "",
                  "| call | us | met |", "|---|---|---|"]
        for name, us in tiny["us_per_call"].items():
            met = us <= tiny["target_us"] if name.startswith("scanweaver") else None
            lines.append(f"| {name} | {us:.2f} | {_verdict(met)} |")
        lines.append("")
        if any(us > tiny["target_us"] for n, us in tiny["us_per_call"].items() if n.startswith("scanweaver")):
            lines += ["Why: " + reason_for("tiny_call"), ""]
    nb = goals.get("neighbours", {})
    if nb.get("rows"):
        lim = nb["limits"]
        lines += [f"Neighbours: linear_scan {nb['shape'][0]} x {nb['shape'][1]} f32 alternating with another "
                  f"library's call, each median against its own solo median (limits: ScanWeaver "
                  f"<= {lim['scanweaver']}x, neighbour <= {lim['neighbour']}x):", "",
                  "| neighbour | ScanWeaver solo ms | mixed ms | slowdown | neighbour solo ms | mixed ms | "
                  "slowdown | met |", "|---|---|---|---|---|---|---|---|"]
        for name, r in nb["rows"].items():
            lines.append(f"| {name} | {r['scanweaver_solo_s'] * 1e3:.3g} | {r['scanweaver_mixed_s'] * 1e3:.3g} | "
                         f"{r['scanweaver_slowdown']:.2f}x | {r['neighbour_solo_s'] * 1e3:.3g} | "
                         f"{r['neighbour_mixed_s'] * 1e3:.3g} | {r['neighbour_slowdown']:.2f}x | "
                         f"{_verdict(r['met'])} |")
        lines.append("")
        policies = [f"{name}: {r['scanweaver_policy']}" for name, r in nb["rows"].items() if r.get("scanweaver_policy")]
        if policies:
            lines += ["ScanWeaver's policy in each row (`runtime/cpu_parallel.py`): " + "; ".join(policies) + ".", ""]
        if nb.get("scanweaver_alone_s"):
            lines += [f"ScanWeaver alone, before any neighbour call of these rows: {nb['scanweaver_alone_s'] * 1e3:.3g} ms "
                      "(median).", ""]
        if any(r["met"] is False for r in nb["rows"].values()):
            lines += ["Why: " + reason_for("neighbours"), ""]
    fc = goals.get("first_call", {})
    missed_cold = False
    if fc.get("rows"):
        t = fc["targets_s"]
        lines += [f"First call in a new process (targets: cold <= {t['cold']:g} s, warm <= {t['warm'] * 1e3:.0f} ms "
                  "for import scanweaver + the first call; cold: an empty disk cache, warm: the best of 3 "
                  "later processes; process s: the whole process until it exits, which includes "
                  "waiting for a full build still compiling in the background, `runtime/cpu_tiers.py`):", "",
                  "| function | cache | import numpy s | import scanweaver s | first call s | total s | met | process s |",
                  "|---|---|---|---|---|---|---|---|"]
        for what, rows in fc["rows"].items():
            for kind in ("cold", "warm", "cold_installed_bytecode"):
                if kind not in rows:
                    continue
                r = rows[kind]
                if "error" in r:
                    lines.append(f"| {what} | {kind} | error: {r['error']} | | | | | |")
                    continue
                total = r["import_scanweaver_s"] + r["first_call_s"]
                label, target = _FIRST_CALL_KINDS[kind], t["cold" if kind.startswith("cold") else kind]
                verdict = _verdict(total <= target) if kind in t else f"(for information: {_verdict(total <= target)})"
                lines.append(f"| {what} | {label} | {r['import_numpy_s']:.3f} | {r['import_scanweaver_s']:.3f} | "
                             f"{r['first_call_s']:.3f} | {total:.3f} | {verdict} | {_process_text(r)} |")
                missed_cold |= kind == "cold" and total > t[kind]
        lines.append("")
        if missed_cold:
            lines += ["Why (cold): " + first_call_cold_reason(fc.get("breakdown", {})), ""]
        lines += _first_call_breakdown(fc.get("breakdown", {}))
    pm = goals.get("peak_memory", {})
    if pm.get("rows"):
        lines += ["Peak extra memory (" + pm["note"] + "):", "",
                  "| call | result MB | peak MB | extra beyond the result MB | met |", "|---|---|---|---|---|"]
        for name, r in pm["rows"].items():
            ok = r["extra_over_result"] <= r.get("allowed_extra_bytes", 0.05 * r["result_bytes"])
            lines.append(f"| {name} | {r['result_bytes'] / 1e6:.1f} | {r['peak_bytes'] / 1e6:.1f} | "
                         f"{r['extra_over_result'] / 1e6:.1f} | {_verdict(ok)} |")
        lines.append("")
    roof = goals.get("fma_exp_roofline", {})
    if "updates_per_s" in roof:
        lines += [f"Selective scan against the compute roofline ({roof['how']}: "
                  f"{roof['updates_per_s'] / 1e9:.2f} G updates/s):", "",
                  "| case | state updates/s (G) | % of roofline |", "|---|---|---|"]
        for case in result["cases"]:
            sw = case["results"].get("scanweaver-cpu", {})
            if case["workload"] != "selective" or sw.get("status") != "ok":
                continue
            p = case["params"]
            rate = p["batch"] * p["D"] * p["N"] * p["L"] / sw["median_s"]
            lines.append(f"| {case['label']} | {rate / 1e9:.2f} | {100 * rate / roof['updates_per_s']:.0f}% |")
        lines.append("")
    errors = [f"- {k}: {v['error']}" for k, v in goals.items() if isinstance(v, dict) and "error" in v]
    if errors:
        lines += ["Goals not measured:", ""] + errors + [""]
    return lines


def readme_text(result: dict[str, Any]) -> str:
    """benchmarks/README.md, generated entirely from the result JSON."""
    lines = _header_lines(result) + _speed_bar_lines(result) + _compile_time_lines(result)
    plots = result.get("plots", {})
    for family, cases in _families(result).items():
        lines += _family_lines(family, cases, plots)
    lines += goals_text(result)
    lines += _peer_lines(result)
    return "\n".join(lines)


def _header_lines(result: dict[str, Any]) -> list[str]:
    """Title, method, machine and versions."""
    m, v = result["machine"], result["versions"]
    roof = result["stream_roofline"]
    return [
        "# ScanWeaver benchmarks",
        "",
        f"Generated by `python -m scanweaver.bench.harness{' --full' if 'full' in (result.get('name') or '') else ''}` "
        f"from [`results/{result.get('name')}.json`](results/{result.get('name')}.json) on {result['created']}. "
        "Do not edit by hand: rerun the harness.",
        "",
        "Method: every peer runs in one process on identical inputs; each result is checked "
        f"against a float64 reference first (max error / max |reference| <= {result['settings']['tolerance']:g}; "
        "a wrong result is reported, not timed); then warm-up (at least one call and "
        f"{result['settings']['timing'].get('warmup_s', 0):g} s, so idle cores are running again) "
        "and timed runs with `time.perf_counter` "
        "(median, min, max). GB/s counts the minimal traffic (each input read once, each output "
        "written once) over the median time; the streaming roofline is "
        f"{roof['how']} over {roof['bytes'] >> 20} MiB in the same run (bytes read + written), "
        "measured at the start and again before each case (the % of roofline columns use the larger of the two). "
        "Ratios are peer time / ScanWeaver time (> 1: ScanWeaver faster).",
        "",
        f"Machine: {m.get('cpu', m.get('machine'))}, {m.get('cpus')} CPUs, {m.get('memory_gib')} GiB, "
        f"GPU: {'yes' if m.get('gpu') else 'no'}; Python {m.get('python')}. "
        f"Streaming roofline: {roof['gbs']:.1f} GB/s (best {roof['gbs_best']:.1f}).",
        "",
        "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val) + ".",
        "",
    ]


_SPEED_BAR_MEASURES = {
    "roofline_fraction": "fraction of the streaming roofline",
    "best_peer": "speed-up over the best peer",
    "backward_over_forward": "backward time / forward time (at most)",
}


def _speed_bar_lines(result: dict[str, Any]) -> list[str]:
    if not result.get("speed_bar"):
        return []
    from scanweaver.bench.miss_reasons import reason_for, shortfall

    lines = ["## Speed bar", "", "| case | measure | target | measured | met | short by | why |",
             "|---|---|---|---|---|---|---|"]
    reasons: list[str] = []
    for label, rows in result["speed_bar"].items():
        for what, row in rows.items():
            meas = "-" if row["measured"] is None else f"{row['measured']:.2f}"
            met = "-" if row["met"] is None else ("yes" if row["met"] else "**no**")
            kind = _SPEED_BAR_MEASURES.get(what, f"speed-up over {what}")
            short = why = ""
            if row.get("invalid"):
                met, why = "**invalid**", row["invalid"]
            if row["met"] is False:
                short = shortfall(row["measured"], row["target"], what.startswith("backward_over_forward"))
                reason = reason_for(what, label)
                if reason not in reasons:
                    reasons.append(reason)
                why = f"({reasons.index(reason) + 1})"
            lines.append(f"| {label} | {kind} | {row['target']} | {meas} | {met} | {short} | {why} |")
    lines.append("")
    if reasons:
        lines += ["Why the missed goals are missed:", ""]
        lines += [f"{i}. {r}" for i, r in enumerate(reasons, 1)] + [""]
    return lines


def _compile_time_lines(result: dict[str, Any]) -> list[str]:
    if not result.get("scanweaver_compile"):
        return []
    lines = [
        "## ScanWeaver compile time",
        "",
        "Cold: empty compile caches. Disk cache: a new process (JIT only). In-process: a repeated call.",
        "",
        "| kernel | cold (s) | disk cache (s) | in-process (us) |",
        "|---|---|---|---|",
    ]
    for name, t in result["scanweaver_compile"].items():
        disk = t.get("disk_cached_s")
        disk_text = f"{disk:.2f}" if disk is not None else "-"
        lines.append(f"| {name} | {t['cold_s']:.2f} | {disk_text} | {t['cached_s'] * 1e6:.0f} |")
    lines.append("")
    return lines


def _family_lines(family: str, cases: list[dict[str, Any]], plots: dict[str, str]) -> list[str]:
    """One workload family: times, speed-ups and bandwidth, plots, what was not timed."""
    peers = _peer_names(cases)
    lines = [f"## {family}", "", "Median time in ms (status where not timed):", ""]
    col = "shape" if "shape" in cases[0]["params"] else "L"
    lines.append(f"| {col} | " + " | ".join(peers) + " |")
    lines.append("|---" * (len(peers) + 1) + "|")
    for case in cases:
        cells = [_fmt_ms(case["results"].get(p, {})) for p in peers]
        lines.append(f"| {_row_key(case)} | " + " | ".join(cells) + " |")
    lines += ["", "Speed-up of ScanWeaver CPU (peer time / ScanWeaver time) and its bandwidth:", ""]
    others = [p for p in peers if p != "scanweaver-cpu"]
    lines.append(f"| {col} | roofline GB/s | ScanWeaver GB/s | % of roofline | " + " | ".join(others) + " |")
    lines.append("|---" * (len(others) + 4) + "|")
    for case in cases:
        sw = case["results"].get("scanweaver-cpu", {})
        gbs = f"{sw['gbs']:.1f}" if sw.get("status") == "ok" else "-"
        frac = f"{100 * sw['roofline_fraction']:.0f}%" if sw.get("status") == "ok" else "-"
        cells = [f"{case['ratios'][p]:.1f}x" if p in case["ratios"] else "-" for p in others]
        roof_now = f"{case['roofline_gbs']:.1f}" if "roofline_gbs" in case else "-"
        lines.append(f"| {_row_key(case)} | {roof_now} | {gbs} | {frac} | " + " | ".join(cells) + " |")
    lines.append("")
    for kind in ("latency", "bandwidth"):
        path = plots.get(f"{family} {kind}")
        if path:
            lines += [f"![{family} {kind}]({path})", ""]
    notes = {
        f"{p}: {case['results'][p].get('reason')}"
        for case in cases
        for p in peers
        if case["results"].get(p, {}).get("status") in ("skipped", "error", "wrong")
    }
    if notes:
        lines += ["Not timed:", ""] + [f"- {n}" for n in sorted(notes)] + [""]
    return lines


def _peer_lines(result: dict[str, Any]) -> list[str]:
    """How each peer formulates the workload, and the peers not run here."""
    lines: list[str] = []
    if result.get("peer_notes"):
        lines += ["## Peer formulations", ""]
        lines += [f"- {k}: {note}" for k, note in sorted(result["peer_notes"].items())]
        lines.append("")
    if result.get("skipped_peers"):
        lines += ["## Peers not run here", ""]
        lines += [f"- {k}: {why}" for k, why in sorted(result["skipped_peers"].items())]
        lines.append("")
    return lines


__all__ = ["PlotsUnavailable", "make_plots", "readme_text"]
