"""Parsing and printing IR with every dialect ScanWeaver understands loaded."""

from __future__ import annotations

from functools import cache
from io import StringIO

from xdsl.context import Context
from xdsl.dialects import arith, get_all_dialects
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.traits import Pure, is_side_effect_free
from xdsl.utils.exceptions import DiagnosticException, ParseError, VerifyException

from scanweaver.errors import ScanWeaverValueError

# xDSL's arith.extsi lacks the Pure trait its siblings (extui, extf, trunci) have, so
# every purity check (the raise, the GPU nest matching) took a sign extension of a
# loaded i8/i16 value for an op with unknown side effects: give it the trait MLIR gives it.
if not is_side_effect_free(arith.ExtSIOp.create(operands=[], result_types=[])):
    arith.ExtSIOp.traits.add_trait(Pure())


@cache
def _dialect_loaders():
    loaders = dict(get_all_dialects())
    from scanweaver.dialects.scan import Scan

    loaders["scan"] = lambda: Scan
    loaders["gpu"] = _gpu_with_shuffle  # (loaded where IR uses it: a CPU build never does)
    return loaders


def _gpu_with_shuffle():
    from scanweaver.dialects.gpu_shuffle import GPU_WITH_SHUFFLE

    return GPU_WITH_SHUFFLE  # xDSL's gpu plus gpu.shuffle


def make_context() -> Context:
    ctx = Context()
    for name, loader in _dialect_loaders().items():
        ctx.register_dialect(name, loader)
    return ctx


def parse_ir(text: str, source: str = "<input>") -> ModuleOp:
    """Parse and verify MLIR text; any problem is one ScanWeaverError naming its location."""
    try:
        module = Parser(make_context(), text, source).parse_module()
        module.verify()
    except ParseError as e:
        raise ScanWeaverValueError(f"cannot parse {source}: {e}") from None
    except (VerifyException, DiagnosticException) as e:
        raise ScanWeaverValueError(f"invalid IR in {source}: {e}") from None
    except RecursionError:  # xDSL's parser and verifier recurse into nested regions
        raise ScanWeaverValueError(f"cannot parse {source}: the IR nests too deeply") from None
    return module


def print_ir(op: Operation) -> str:
    out = StringIO()
    Printer(stream=out).print_op(op)
    return out.getvalue() + "\n"
