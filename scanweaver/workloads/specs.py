"""Compile-time options of the workload builders, importable without xDSL (the
drivers key their caches by them before deciding whether anything must be built)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SelectiveScanSpec:
    """The compile-time shape of a selective scan kernel (one IR text per spec)."""

    n: int  # state size N (static: the state vector lives in registers)
    b_kind: str  # "const" (D, N) | "shared" (batch, L, N) | "grouped" (batch, G, L, N)
    c_kind: str
    has_d: bool
    has_z: bool
    has_bias: bool
    softplus: bool
    has_h0: bool
    has_last: bool


@dataclass(frozen=True)
class ComplexSelectiveSpec:
    """The compile-time shape of a complex-A selective scan kernel (`selective_complex.py`)."""

    n: int
    real: str  # "f32" | "f64": the element type of the complex state's parts
    b_kind: str  # "const" | "shared" | "grouped" (time before the state index)
    c_kind: str
    has_d: bool
    has_z: bool
    has_bias: bool
    softplus: bool
    has_h0: bool
    has_last: bool


__all__ = ["ComplexSelectiveSpec", "SelectiveScanSpec"]
