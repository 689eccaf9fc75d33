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

REASONS = {
    # emit reads y[t-1], written by the step before: a true dependence between steps
    "prev": "the GPU lowering left scan.recurrence: emit reads %y, which it writes (a dependence between steps)",
    # the channel loop carries a sum over channels: channels are not independent
    "carried": "the GPU lowering left scan.recurrence: an enclosing scf.for carries values",
    # an f16 state in an f16 loop: not raised, so nothing reaches the GPU lowering
    "f16_scalar": "no scan op was left there, so the raise did not turn that loop into a recurrence",
    # only the final state per channel: the raise leaves a reduction in a loop nest as a loop
    "final_only": "no scan op was left there, so the raise did not turn that loop into a recurrence",
    # an f32 state and an i32 counter in one loop: the raise takes carried values of one type
    "mixed_types": "no scan op was left there, so the raise did not turn that loop into a recurrence",
    # y[c, 1] = h0 before a time loop from 1 whose emit writes y[c, t]: that element is
    # written twice, so the store cannot move after the recurrence
    "lb1_overlap": "the GPU lowering left scan.recurrence: the prologue writes %y (not one of its allocas) and "
                   "that store cannot move after the recurrence: something after it reads that memref, or emit "
                   "may write the same element",
    # two recurrences in one channel loop, the second reading channel 0's output of the first
    "two_in_nest_cross": "the GPU lowering left scan.recurrence: its channel loop also runs another scan op and "
                         "cannot be split into one nest per scan op: one part reads or writes another channel's "
                         "elements of a memref the other part writes",
    # a channel loop from 1 to memref.dim: the grid formula takes 0 to a dim, or constants
    "chan_lb1": "the GPU lowering left scan.recurrence: channel loop bounds must be constants, or 0 to "
                "memref.dim(%arg, c) step 1",
    # the second recurrence starts from the first one's final state
    "two_in_nest_handoff": "the GPU lowering left scan.recurrence: its channel loop also runs another scan op and "
                           "cannot be split into one nest per scan op: the later scan op uses a value the earlier "
                           "part computes (e.g. its final state)",
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
