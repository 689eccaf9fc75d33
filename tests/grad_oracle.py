"""The VJP oracle: `@f_vjp` (interpreted) against central finite differences of `@f`.

@f is seen as a map from the contents of its float memref arguments before the call to
their contents after it; with cotangents c_X, F(x) = sum_X <X_after(x), c_X>.  The VJP
(shadows entering as c_X) must return dF/dX_before; checked along random directions v:
<vjp, v> == (F(x + eps v) - F(x - eps v)) / (2 eps), in float64.
"""

from __future__ import annotations

import numpy as np

from scanweaver.interp.run import run_function
from scanweaver.ir import make_context, parse_ir, print_ir
from scanweaver.rewrites.grad import ScanweaverGrad
from scanweaver.rewrites.raise_affine import RaiseRecurrences


def raise_and_grad(module_or_text, chunk: int = 3, functions: str = "", window: int = 8192,
                   fuse: bool = True) -> str:
    """Text of the module after scanweaver-raise and scanweaver-grad (a small `window`:
    chunks before the kept coefficients' window exist, their reverse refills them)."""
    module = parse_ir(module_or_text) if isinstance(module_or_text, str) else module_or_text
    ctx = make_context()
    RaiseRecurrences().apply(ctx, module)
    ScanweaverGrad(chunk=chunk, functions=functions, window=window, fuse=fuse).apply(ctx, module)
    module.verify()
    return print_ir(module)


def _is_float(x) -> bool:
    return isinstance(x, np.ndarray) and x.dtype.kind == "f"


def objective(text: str, name: str, args, cot) -> float:
    work = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    run_function(text, name, *work)
    return float(sum(np.sum(w * c) for w, c in zip([w for w in work if _is_float(w)], cot)))


def check_vjp(text: str, name: str, args, rng, directions: int = 2, eps: float = 1e-6, tol: float = 1e-6):
    """Assert the VJP of @name matches finite differences; returns the gradients."""
    text = parse_ir(text) if isinstance(text, str) else text  # parsed once for every run
    floats = [a for a in args if _is_float(a)]
    cot = [rng.standard_normal(a.shape) for a in floats]
    shadows = [c.copy() for c in cot]
    run_function(text, name + "_vjp", *[a.copy() if isinstance(a, np.ndarray) else a for a in args], *shadows)
    for _ in range(directions):
        v = [rng.standard_normal(a.shape) for a in floats]

        def moved(s):
            it = iter(v)
            return [a + s * eps * next(it) if _is_float(a) else a for a in args]

        fd = (objective(text, name, moved(1), cot) - objective(text, name, moved(-1), cot)) / (2 * eps)
        got = float(sum(np.sum(g * d) for g, d in zip(shadows, v)))
        scale = max(1.0, abs(fd))
        assert abs(got - fd) <= tol * scale, f"@{name}: VJP gives {got}, finite differences {fd}"
    return shadows
