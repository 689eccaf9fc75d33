"""What the GPU lowering still refuses, each with its reason: on the command line (one
line, exit 1, no output file) and with scan-to-gpu{diagnose=true} on stderr.  The
README's list of GPU refusals follows these."""

from __future__ import annotations

from pathlib import Path

import pytest

from scanweaver.cli import main
from scanweaver.ir import make_context, parse_ir
from scanweaver.rewrites.blelloch_gpu import ScanToGpu, refusals
from scanweaver.rewrites.raise_affine import RaiseRecurrences

FORMS = Path(__file__).parent / "gpu_refused"

_UNPROVEN = "may access %x out of bounds: the shape contract does not follow its index, so nothing checks it before the launch"
REASONS = {
    # emit reads y[t-1], written by the step before: a true dependence between steps
    "prev": "the GPU lowering left scan.recurrence: emit reads %y, which it writes (a dependence between steps)",
    # the channel loop carries a sum over channels: channels are not independent
    "carried": "the GPU lowering left scan.recurrence: an enclosing scf.for carries values",
    # an f16 state in an f16 loop: not raised, so nothing reaches the GPU lowering
    "f16_scalar": "no scan op was left there, so the raise did not turn that loop into a recurrence",
    # an f32 state that adds an i32 counter it carries beside it: the values depend on
    # each other, so the loop cannot split into one scan op per type
    "mixed_coupled": "no scan op was left there, so the raise did not turn that loop into a recurrence",
    # y[c, 1] = h0 before a time loop from 1 whose emit writes y[c, t]: that element is
    # written twice, so the store cannot move after the recurrence
    "lb1_overlap": "the GPU lowering left scan.recurrence: the prologue writes %y (not one of its allocas) and "
                   "that store cannot move after the recurrence: something after it reads that memref, or emit "
                   "may write the same element",
    # two recurrences in one channel loop, the second reading channel 0's output of the first
    "two_in_nest_cross": "the GPU lowering left scan.recurrence: its channel loop also runs another scan op and "
                         "cannot be split into one nest per scan op: one part reads or writes another channel's "
                         "elements of a memref the other part writes",
    # the second recurrence starts from the first one's final state
    "two_in_nest_handoff": "the GPU lowering left scan.recurrence: its channel loop also runs another scan op and "
                           "cannot be split into one nest per scan op: the later scan op uses a value the earlier "
                           "part computes (e.g. its final state)",
    # an index loaded from memory: nothing bounds it before the launch (issue 12)
    "gather": f"the GPU lowering left scan.recurrence: '%xv = memref.load %x[%c, %i] : memref<?x?xf32>' {_UNPROVEN}",
    # `if t != 0 { y[c, t - 1] }`: a guard on an index that the shape contract does not read
    "unread_guard_prev": "the GPU lowering left scan.recurrence: 'memref.store %hn, %y[%c, %t1] : memref<?x?xf32>' "
                         + _UNPROVEN.replace("%x", "%y"),
    # the gather in a nest with a buffer between its channel loops: the channel program
    # (one thread per channel) that takes such nests refuses it too
    "channel_program_gather": "channel program (one thread per channel): '%xv = memref.load %x[%b, %c, %i] : "
                              f"memref<?x?x?xf32>' {_UNPROVEN}",
}


@pytest.mark.parametrize("name", sorted(REASONS))
def test_command_line_names_the_reason(name, tmp_path, capsys):
    out = tmp_path / f"{name}.ptx"
    assert main(["compile", str(FORMS / f"{name}.mlir"), "--target", "ptx", "-o", str(out)]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"scanweaver: error: function @{name} needs host-side work")
    assert REASONS[name] in err
    assert not out.exists() and not (tmp_path / f"{name}.ptx.launch.json").exists()


@pytest.mark.parametrize("name", ["prev", "carried", "lb1_overlap"])
def test_diagnose_and_function_attribute(name, capsys):
    m = parse_ir((FORMS / f"{name}.mlir").read_text())
    RaiseRecurrences().apply(make_context(), m)
    ScanToGpu(diagnose=True).apply(make_context(), m)
    line = capsys.readouterr().err.strip()
    why = REASONS[name].removeprefix("the GPU lowering left ")
    assert line == f"@{name}: scan-to-gpu: not lowered for the GPU: {why}"
    (fn,) = [op for op in m.ops if op.name == "func.func"]
    assert refusals(fn) == [why]
