"""Argument checks for the PyTorch operators: one error naming the argument."""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np
import torch

from scanweaver.errors import ScanWeaverTypeError, ScanWeaverValueError

FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def dense_tensor(name: str, x: Any, optional: bool = False) -> torch.Tensor | None:
    """x as a dense (strided) tensor of any dtype (None passes when optional)."""
    if x is None:
        if optional:
            return None
        raise ScanWeaverTypeError(f"argument '{name}' is required (got None)")
    if not isinstance(x, torch.Tensor):
        raise ScanWeaverTypeError(f"argument '{name}' must be a torch.Tensor, got {type(x).__name__}")
    if x.layout != torch.strided:
        raise ScanWeaverValueError(f"argument '{name}' has layout {x.layout}; only dense (strided) tensors are supported")
    return x


def tensor(name: str, x: Any, optional: bool = False) -> torch.Tensor | None:
    """x as a dense floating-point tensor (None passes when optional)."""
    if dense_tensor(name, x, optional) is None:
        return None
    if x.is_complex():
        raise ScanWeaverTypeError(f"argument '{name}' is complex ({x.dtype}); only real tensors are supported")
    if x.dtype not in FLOATS:
        raise ScanWeaverTypeError(
            f"argument '{name}' has dtype {x.dtype}; expected a floating dtype "
            "(float32, float64, float16 or bfloat16)"
        )
    return x


def same_device(named: dict[str, torch.Tensor | None]) -> torch.device:
    given = [(n, t) for n, t in named.items() if t is not None]
    first_name, first = given[0]
    for n, t in given[1:]:
        if t.device != first.device:
            raise ScanWeaverValueError(
                f"argument '{n}' is on {t.device} but '{first_name}' is on {first.device}; "
                "pass all tensors on one device"
            )
    return first.device


def shape(name: str, x: torch.Tensor | None, want: tuple[int, ...], meaning: str) -> None:
    if x is not None and tuple(x.shape) != tuple(want):
        raise ScanWeaverValueError(f"argument '{name}' has shape {tuple(x.shape)}; expected {tuple(want)} ({meaning})")


def scan_dim(dim: Any, ndim: int) -> int:
    """`dim` of a linear_scan made non-negative: an integer (Python or numpy) in range."""
    try:
        index = operator.index(dim)
    except TypeError:
        raise ScanWeaverTypeError(f"dim must be an integer, got {dim!r}") from None
    if ndim == 0:
        raise ScanWeaverValueError("arguments 'a' and 'b' must have at least one dimension")
    if not -ndim <= index < ndim:
        raise ScanWeaverValueError(f"dim {index} is out of range for {ndim}-dimensional inputs")
    return index % ndim


def flag(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ScanWeaverTypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)  # the custom ops take a Python bool


def rows(x: torch.Tensor, dim: int) -> torch.Tensor:
    """x as (channels, L) with `dim` last; the channel count is explicit, so that an
    empty `dim` (L = 0) does not leave reshape's -1 undetermined."""
    moved = x.movedim(dim, -1)
    return moved.reshape(math.prod(moved.shape[:-1]), moved.shape[-1])


def view(x: torch.Tensor, dtype: np.dtype) -> np.ndarray:
    """A numpy view of x in `dtype` (zero copy when x is contiguous and of that dtype)."""
    tdt = torch.float64 if dtype == np.float64 else torch.float32
    return x.detach().to(tdt).contiguous().numpy()


def device_aligned(x: torch.Tensor | None) -> torch.Tensor | None:
    """x itself (no copy) when its data starts on an element boundary, as every torch
    view's does, e.g. `t[1:]`: the kernels test their bases against `DEVICE_ALIGNMENT`
    and run such a view on their scalar path.  Else (a byte-offset storage view) a
    fresh contiguous copy, which the runtime would otherwise refuse."""
    if x is None or x.numel() == 0 or x.data_ptr() % x.element_size() == 0:
        return x
    return x.clone(memory_format=torch.contiguous_format)


def selective_backward_like(u, delta, A, B, C, D, z, delta_bias, initial_state) -> tuple:
    """The backward op's outputs as empty tensors (its fake implementation): one per
    input, an empty tensor for an absent optional input (real and complex ops alike)."""
    like = lambda x: u.new_empty((0,)) if x is None else torch.empty_like(x)  # noqa: E731
    return (torch.empty_like(u), torch.empty_like(delta), torch.empty_like(A), torch.empty_like(B),
            torch.empty_like(C), like(D), like(z), like(delta_bias), like(initial_state))


def save_selective_inputs(ctx, inputs, output) -> None:
    """setup_context of both selective ops: the inputs and the last state's shape and dtype."""
    u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state = inputs
    ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias, initial_state)
    ctx.delta_softplus = delta_softplus
    ctx.last_shape = output[1].shape
    ctx.last_dtype = output[1].dtype


def selective_backward(backward_op):
    """The autograd backward of a selective op whose saved inputs `save_selective_inputs`
    stored: absent cotangents become zeros, and only the inputs that need a gradient get one."""

    def backward(ctx, dout, dlast):
        u, delta, A, B, C, D, z, delta_bias, h0 = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(u)
        if dlast is None:
            dlast = u.new_zeros(ctx.last_shape, dtype=ctx.last_dtype)
        grads = backward_op(u, delta, A, B, C, D, z, delta_bias, ctx.delta_softplus, dout,
                            dlast.to(ctx.last_dtype), h0)
        du, ddelta, dA, dB, dC, dD, dz, dbias, dh0 = grads
        need = ctx.needs_input_grad
        pick = lambda g, i, present=True: g if (present and need[i]) else None  # noqa: E731
        return (pick(du, 0), pick(ddelta, 1), pick(dA, 2), pick(dB, 3), pick(dC, 4),
                pick(dD, 5, D is not None), pick(dz, 6, z is not None), pick(dbias, 7, delta_bias is not None),
                None, pick(dh0, 9, h0 is not None))

    return backward
