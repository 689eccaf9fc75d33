"""Registers ScanWeaver's dialect and passes with `xdsl-opt` (entry point `xdsl.universe`)."""

from xdsl.universe import Universe


def _scan_dialect():
    from scanweaver.dialects.scan import Scan

    return Scan


def _pass(module: str, cls: str):
    def load():
        import importlib

        return getattr(importlib.import_module(module), cls)

    return load


SCANWEAVER_UNIVERSE = Universe(
    all_dialects={"scan": _scan_dialect},
    all_passes={
        "scanweaver-lower": _pass("scanweaver.rewrites.pipeline", "ScanweaverLower"),
        "scan-to-loops": _pass("scanweaver.rewrites.scan_to_loops", "ScanToLoops"),
    },
)
