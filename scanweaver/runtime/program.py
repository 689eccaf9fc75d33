"""`Program`: a compiled module whose functions are called by name.

Both backends' builders (the CPU JIT in `api.compile`, the GPU in `cuda_program` and
`cuda_artifact`) return one, so it lives here, below the API that re-exports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from scanweaver.errors import ScanWeaverError, ScanWeaverValueError


class NoSuchFunctionError(ScanWeaverError, AttributeError):
    """A `Program` has no function of that name (an AttributeError too, for hasattr)."""


class Program:
    """A compiled module: call its functions by name with numpy arrays.

    Memref arguments are numpy arrays written in place; scalar results are returned.
    ``program.stages`` lists (stage name, IR text) after each pass;
    ``program.stage_ir(name)`` returns one of them.
    """

    def __init__(
        self,
        functions: dict[str, Callable[..., Any]],
        stages: Callable[[], list[Any]] | list[Any],
        artifact: str,
        cache_hit: bool = False,
    ):
        self._functions = functions
        self._stages = stages
        self.artifact = artifact
        self.cache_hit = cache_hit  # the build came from the on-disk compile cache

    @property
    def stages(self) -> list[tuple[str, str]]:
        """(stage name, IR) after each pass; recomputed on demand after a cached build."""
        if callable(self._stages):
            self._stages = self._stages()
        return [(s.name, s.ir) for s in self._stages]

    @property
    def function_names(self) -> list[str]:
        return sorted(self._functions)

    def stage_ir(self, name: str) -> str:
        for stage, ir in self.stages:
            if stage == name:
                return ir
        raise ScanWeaverValueError(
            f"no stage named '{name}' (stages: {', '.join(s for s, _ in self.stages)})"
        )

    def __getitem__(self, name: str) -> Callable[..., Any]:
        try:
            return self._functions[name]
        except KeyError:
            raise NoSuchFunctionError(
                f"no function '@{name}' in the program (have: {', '.join(self.function_names)})"
            ) from None

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_"):
            raise AttributeError(name)
        return self[name]


__all__ = ["NoSuchFunctionError", "Program"]
