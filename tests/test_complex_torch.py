"""Complex `scanweaver.torch.linear_scan`: forward against a complex128 loop, gradients
in PyTorch's complex autograd convention checked with `torch.autograd.gradcheck`."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from scanweaver.errors import ScanWeaverTypeError  # noqa: E402
from scanweaver.torch import linear_scan  # noqa: E402


def _loop(a, b, h0, reverse, dim):
    a, b = a.movedim(dim, -1), b.movedim(dim, -1)
    h = torch.zeros(a.shape[:-1], dtype=a.dtype) if h0 is None else h0.to(a.dtype)
    out = []
    steps = range(a.shape[-1] - 1, -1, -1) if reverse else range(a.shape[-1])
    for t in steps:
        h = a[..., t] * h + b[..., t]
        out.append(h)
    if reverse:
        out = out[::-1]
    return torch.stack(out, -1).movedim(-1, dim)


def _c(*shape, scale=1.0, gen=None):
    return (torch.randn(*shape, dtype=torch.complex128, generator=gen) * scale)


@pytest.mark.parametrize("reverse,dim", [(False, -1), (True, 0)])
def test_complex_forward_matches_loop(reverse, dim):
    g = torch.Generator().manual_seed(17)
    a, b = _c(3, 9, 2, scale=0.7, gen=g), _c(3, 9, 2, gen=g)
    ch = [s for i, s in enumerate(a.shape) if i != dim % 3]
    h0 = _c(*ch, gen=g)
    h = linear_scan(a, b, h0, reverse=reverse, dim=dim)
    torch.testing.assert_close(h, _loop(a, b, h0, reverse, dim % 3), rtol=1e-12, atol=1e-12)
    h32 = linear_scan(a.to(torch.complex64), b.to(torch.complex64), h0.to(torch.complex64), reverse, dim)
    assert h32.dtype == torch.complex64
    torch.testing.assert_close(h32, h.to(torch.complex64), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("reverse", [False, True])
def test_gradcheck_wirtinger(reverse):
    g = torch.Generator().manual_seed(3)
    a = _c(2, 6, scale=0.6, gen=g).requires_grad_()
    b = _c(2, 6, gen=g).requires_grad_()
    h0 = _c(2, gen=g).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b, h0: linear_scan(a, b, h0, reverse=reverse), (a, b, h0))


def test_gradients_equal_torch_autograd_of_the_loop():
    g = torch.Generator().manual_seed(5)
    a0, b0, h00 = _c(4, 7, scale=0.8, gen=g), _c(4, 7, gen=g), _c(4, gen=g)
    w = _c(4, 7, gen=g)
    grads = []
    for fn in (lambda a, b, h0: linear_scan(a, b, h0), lambda a, b, h0: _loop(a, b, h0, False, 1)):
        a, b, h0 = (x.clone().requires_grad_() for x in (a0, b0, h00))
        loss = (fn(a, b, h0) * w).real.sum() + fn(a, b, h0).abs().square().sum()
        loss.backward()
        grads.append((a.grad, b.grad, h0.grad))
    for mine, ref in zip(*grads):
        torch.testing.assert_close(mine, ref, rtol=1e-10, atol=1e-10)


def test_real_decay_promotes_and_differentiates():
    g = torch.Generator().manual_seed(9)
    a = torch.rand(2, 5, dtype=torch.float64, generator=g).requires_grad_()
    b = _c(2, 5, gen=g).requires_grad_()
    h = linear_scan(a, b)
    assert h.dtype == torch.complex128
    h.abs().sum().backward()
    assert a.grad.dtype == torch.float64 and b.grad.dtype == torch.complex128
    a2, b2 = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    _loop(a2.to(torch.complex128), b2, None, False, 1).abs().sum().backward()
    torch.testing.assert_close(a.grad, a2.grad, rtol=1e-10, atol=1e-10)
    with pytest.raises(ScanWeaverTypeError, match="argument 'b' has dtype torch.int32"):
        linear_scan(_c(2, 3), torch.ones(2, 3, dtype=torch.int32))
