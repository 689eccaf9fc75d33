"""`scanweaver-opt`: xdsl-opt with ScanWeaver's dialect and passes, and clean errors.

Same flags as xdsl-opt.  Differences: a parse or verification error, or a
ScanWeaverError from a pass, prints one message and exits 1 instead of a Python
traceback (so do IR nested too deeply and Ctrl-C, which exits 130); `-o FILE` follows
`scanweaver.outputs`: written only when everything succeeded, never over the input,
`-o -` for standard output.
"""

from __future__ import annotations

# xDSL is imported inside `main`: Ctrl-C while it loads is caught like Ctrl-C later.
import sys


def _say(msg: str) -> None:
    print(msg.rstrip(), file=sys.stderr, flush=True)


def _tool_class():
    from io import StringIO

    from xdsl.xdsl_opt_main import xDSLOptMain

    from scanweaver.outputs import Inputs, check_outputs

    class _KeptOpen(StringIO):
        def close(self) -> None:  # xdsl-opt closes its output stream; keep the text
            pass

    class ScanweaverOpt(xDSLOptMain):
        inputs = Inputs()

        def get_input_stream(self):
            stream, extension = super().get_input_stream()
            name = self.args.input_file or "standard input"
            self.inputs.add_fd(stream, name)
            if self.args.output_file:  # refuse `-o INPUT` before any work
                check_outputs([self.args.output_file], self.inputs)
            return stream, extension

        def prepare_output(self):
            self.buffer = _KeptOpen()
            return self.buffer

    return ScanweaverOpt


def _run(argv: list[str] | None) -> int:
    from xdsl.utils.exceptions import DiagnosticException, ParseError

    from scanweaver.errors import ScanWeaverError
    from scanweaver.outputs import write_output

    try:
        tool = _tool_class()(args=argv)
        tool.run()
    except (ParseError, DiagnosticException, ScanWeaverError) as e:
        _say(f"scanweaver-opt: error: {e}")
        for note in getattr(e, "__notes__", ()):  # the failing op, printed in context
            _say(note)
        return 1
    except OSError as e:
        _say(f"scanweaver-opt: error: cannot read {e.filename}: {e.strerror}")
        return 1
    except UnicodeDecodeError:
        _say("scanweaver-opt: error: the input is not UTF-8 text")
        return 1
    except RecursionError:  # xDSL parses, verifies and prints nested regions recursively
        _say("scanweaver-opt: error: the IR nests too deeply to process")
        return 1
    except ValueError as e:  # xDSL's pass-pipeline parser: unknown pass or option
        _say(f"scanweaver-opt: error: {e}")
        return 1
    text = tool.buffer.getvalue()
    try:
        write_output(tool.args.output_file or "-", text, tool.inputs)
    except ScanWeaverError as e:
        _say(f"scanweaver-opt: error: {e}")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        return _run(argv)
    except KeyboardInterrupt:
        _say("scanweaver-opt: interrupted")
        return 130
    except BrokenPipeError:  # `scanweaver-opt ... | head`: the reader left
        from scanweaver.cli import _quiet_stdout

        _quiet_stdout()
        return 1


if __name__ == "__main__":
    sys.exit(main())
