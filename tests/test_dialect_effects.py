"""The scan dialect's memory effects and its declarative syntax.

Generic xDSL passes (dce, cse, licm) decide what they may delete or move from the
effects an op declares; a scan must report that it reads its inputs and writes its
outputs, whatever its regions do."""

from __future__ import annotations

import inspect

import pytest
from xdsl.traits import MemoryEffectKind, get_effects, is_side_effect_free

from scanweaver.dialects import scan
from scanweaver.ir import parse_ir as parse_module

PURE_COMBINE_SCAN = """
func.func @f(%a: memref<4x8xf32>, %b: memref<4x8xf32>) {
  scan.scan ins(%a : memref<4x8xf32>) outs(%b : memref<4x8xf32>) axis 1 {
  ^bb0(%x: f32, %y: f32):
    %s = arith.addf %x, %y : f32
    scan.yield %s : f32
  }
  func.return
}
"""

AFFINE = """
func.func @f(%a: memref<4x?xf32>, %b: memref<4x?xf32>, %h0: memref<4xf32>,
             %h: memref<4x?xf32>, %hT: memref<4xf32>) {
  scan.affine %a, %b init %h0 into %h final %hT axis 1 reverse
      : memref<4x?xf32>, memref<4x?xf32>, memref<4xf32> -> memref<4x?xf32>, memref<4xf32>
  func.return
}
"""

RECURRENCE = """
func.func @f(%a: memref<4x128xf32>, %y: memref<128xf32>, %h: memref<4xf32>) {
  %lb = arith.constant 0 : index
  %ub = arith.constant 128 : index
  %c1 = arith.constant 1 : index
  scan.recurrence %lb to %ub step %c1 state(%h : memref<4xf32>) coeffs {
  ^bb0(%i: index, %k: index):
    %av = memref.load %a[%k, %i] : memref<4x128xf32>
    %one = arith.constant 1.0 : f32
    scan.yield %av, %one : f32, f32
  } emit {
  ^bb0(%t: index, %s: memref<4xf32>):
    %c0 = arith.constant 0 : index
    %v = memref.load %s[%c0] : memref<4xf32>
    memref.store %v, %y[%t] : memref<128xf32>
    scan.yield
  }
  func.return
}
"""


def _only_op(text: str, cls):
    module = parse_module(text)
    (op,) = [o for o in module.walk() if isinstance(o, cls)]
    return module, op


def _effects(op) -> set[tuple[MemoryEffectKind, str]]:
    effects = get_effects(op)
    assert effects is not None, f"{op.name} declares no known effects"
    return {(e.kind, e.value.name_hint) for e in effects if e.value is not None}


def test_scan_with_pure_combine_reads_inputs_and_writes_outputs():
    _, op = _only_op(PURE_COMBINE_SCAN, scan.ScanOp)
    assert not is_side_effect_free(op)
    assert _effects(op) == {(MemoryEffectKind.READ, "a"), (MemoryEffectKind.WRITE, "b")}


def test_affine_effects_name_every_operand():
    _, op = _only_op(AFFINE, scan.AffineOp)
    R, W = MemoryEffectKind.READ, MemoryEffectKind.WRITE
    assert _effects(op) == {(R, "a"), (R, "b"), (R, "h0"), (W, "h"), (W, "hT")}


def test_recurrence_reads_and_writes_state_and_keeps_region_effects():
    _, op = _only_op(RECURRENCE, scan.RecurrenceOp)
    R, W = MemoryEffectKind.READ, MemoryEffectKind.WRITE
    effects = get_effects(op)
    named = _effects(op)
    assert {(R, "h"), (W, "h")} <= named
    # the emit region's store to %y is a write the op must report
    assert any(e.kind is W and e.value is None for e in effects) or (W, "y") in named


@pytest.mark.parametrize("text", [PURE_COMBINE_SCAN, AFFINE, RECURRENCE])
def test_dead_code_elimination_keeps_scans(text):
    from xdsl.context import Context
    from xdsl.transforms.dead_code_elimination import DeadCodeElimination

    module = parse_module(text)
    before = sum(1 for o in module.walk() if o.dialect_name() == "scan")
    DeadCodeElimination().apply(Context(), module)
    after = sum(1 for o in module.walk() if o.dialect_name() == "scan")
    assert before == after > 0


@pytest.mark.parametrize("cls", [scan.AffineOp, scan.ScanOp, scan.RecurrenceOp,
                                 scan.LinearRecurrenceOp, scan.YieldOp])
def test_every_op_uses_a_declarative_assembly_format(cls):
    assert cls.assembly_format, f"{cls.name} has no assembly_format"


def test_the_dialect_hand_writes_no_printer_or_parser():
    source = inspect.getsource(scan)
    assert "def print(" not in source and "def parse(" not in source
