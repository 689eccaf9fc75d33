"""`scanweaver-opt`: xdsl-opt with ScanWeaver's dialect and passes, and clean errors.

Same flags as xdsl-opt.  Differences: a parse or verification error, or a
ScanWeaverError from a pass, prints one message and exits 1 instead of a Python
traceback; with `-o FILE`, the file is written only when everything succeeded.
"""

from __future__ import annotations

import sys
from io import StringIO
from pathlib import Path

from xdsl.utils.exceptions import DiagnosticException, ParseError
from xdsl.xdsl_opt_main import xDSLOptMain

from scanweaver.errors import ScanWeaverError


class _KeptOpen(StringIO):
    def close(self) -> None:  # xdsl-opt closes its output stream; keep the text
        pass


class ScanweaverOpt(xDSLOptMain):
    def prepare_output(self):
        self.buffer = _KeptOpen()
        return self.buffer


def main(argv: list[str] | None = None) -> int:
    from scanweaver.cli import write_atomically

    try:
        tool = ScanweaverOpt(args=argv)
        tool.run()
    except (ParseError, DiagnosticException, ScanWeaverError) as e:
        print(f"scanweaver-opt: error: {e}".rstrip(), file=sys.stderr)
        for note in getattr(e, "__notes__", ()):  # the failing op, printed in context
            print(note.rstrip(), file=sys.stderr)
        return 1
    except OSError as e:
        print(f"scanweaver-opt: error: cannot read {e.filename}: {e.strerror}", file=sys.stderr)
        return 1
    except UnicodeDecodeError:
        print("scanweaver-opt: error: the input is not UTF-8 text", file=sys.stderr)
        return 1
    except ValueError as e:  # xDSL's pass-pipeline parser: unknown pass or option
        print(f"scanweaver-opt: error: {e}", file=sys.stderr)
        return 1
    text = tool.buffer.getvalue()
    if tool.args.output_file:
        try:
            write_atomically(Path(tool.args.output_file), text)
        except ScanWeaverError as e:
            print(f"scanweaver-opt: error: {e}", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
