"""PyTorch operators with compiler-derived backward passes (needs `torch`).

    from scanweaver.torch import selective_scan_fn, linear_scan

`selective_scan_fn` has the signature, shapes and meaning of mamba_ssm's; `linear_scan`
is h[t] = a[t] * h[t-1] + b[t] along `dim`.  Both are `torch.library.custom_op`s with
fake implementations and autograd: torch.compile(fullgraph=True) traces them.  The
forward runs the CPU JIT on numpy views of the tensors; the backward runs `@..._vjp`,
which the `scanweaver-grad` pass derives from the forward IR.

This package imports `torch` (absolute imports: `scanweaver.torch` is not `torch`);
`import scanweaver` does not.
"""

from scanweaver.torch.linear import linear_scan
from scanweaver.torch.reference import linear_scan_ref, selective_scan_ref
from scanweaver.torch.selective import selective_scan_fn

__all__ = ["linear_scan", "linear_scan_ref", "selective_scan_fn", "selective_scan_ref"]
