"""One exception family for every user-facing failure.

Command-line tools catch `ScanWeaverError` and print its message as one line;
anything else escaping is a bug in ScanWeaver, not in the user's input.  Bad
arguments raise `ScanWeaverValueError` (values, shapes, IR content) or
`ScanWeaverTypeError` (types, dtypes, missing arrays), so that `except ValueError` and
`except TypeError` catch them as they would numpy's; environment problems (tools,
GPU) raise the other subclasses.
"""


class ScanWeaverError(Exception):
    """A problem with the user's input or environment, described in one sentence."""


class ToolNotFoundError(ScanWeaverError):
    """An external binary (mlir-opt, ptxas, ...) is not installed."""


class ToolFailedError(ScanWeaverError):
    """An external tool ran and reported an error."""


class BackendUnavailableError(ScanWeaverError):
    """The requested backend (e.g. CUDA) cannot run on this machine."""


class ScanWeaverValueError(ScanWeaverError, ValueError):
    """A bad value or shape in an argument (what numpy and torch raise `ValueError` for)."""


class ScanWeaverTypeError(ScanWeaverError, TypeError):
    """An argument of the wrong type or dtype (what numpy and torch raise `TypeError` for)."""


class CannotLower(Exception):
    """A lowering strategy declines an op, with the reason (``.reason``, also ``str()``).

    Internal, not user-facing: the pass that catches it leaves the op for the next
    strategy (the sequential lowering) and may report the reason in a remark.
    """

    def __init__(self, reason: str = ""):
        super().__init__(reason)
        self.reason = reason


class ScanWeaverWarning(UserWarning):
    """Something the user should know that does not stop the work."""


class CacheWarning(ScanWeaverWarning):
    """The compile cache is not used (unsafe or unusable directory or entry); builds still work."""
