"""scanweaver.torch: gradcheck, agreement with PyTorch autograd through the loop
reference, opcheck, torch.compile, and bad input."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (pip install '.[test]')")

from scanweaver.errors import ScanWeaverTypeError, ScanWeaverValueError  # noqa: E402
from scanweaver.torch import linear_scan, linear_scan_ref, selective_scan_fn, selective_scan_ref  # noqa: E402

BATCH, DIM, L, N, G = 2, 4, 6, 3, 2


def _bc(layout: str, dtype, gen):
    shape = {"const": (DIM, N), "shared": (BATCH, N, L), "grouped": (BATCH, G, N, L)}[layout]
    return torch.randn(shape, dtype=dtype, generator=gen)


def make_inputs(b_layout="const", c_layout="const", D=True, z=True, bias=True, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    u = torch.randn(BATCH, DIM, L, dtype=dtype, generator=gen)
    delta = torch.rand(BATCH, DIM, L, dtype=dtype, generator=gen) - 0.5
    A = -(torch.rand(DIM, N, dtype=dtype, generator=gen) + 0.3)
    args = [u, delta, A, _bc(b_layout, dtype, gen), _bc(c_layout, dtype, gen)]
    args += [torch.randn(DIM, dtype=dtype, generator=gen) if D else None]
    args += [torch.randn(BATCH, DIM, L, dtype=dtype, generator=gen) if z else None]
    args += [torch.rand(DIM, dtype=dtype, generator=gen) * 0.4 - 0.2 if bias else None]
    return [a.requires_grad_() if a is not None else None for a in args]


def _gradcheck(args, softplus, last):
    present = [i for i, a in enumerate(args) if a is not None]

    def f(*xs):
        full = list(args)
        for i, x in zip(present, xs):
            full[i] = x
        return selective_scan_fn(*full, delta_softplus=softplus, return_last_state=last)

    assert torch.autograd.gradcheck(f, [args[i] for i in present], eps=1e-6, atol=1e-6, rtol=1e-5)


# D, delta_bias and return_last_state are runtime options of one compiled kernel: every
# combination of them.  The B / C layouts, z and softplus select the compiled kernel
# (a compile of the forward and of its VJP each, seconds): every value of each, both
# layouts of B and C together and mixed.
@pytest.mark.parametrize("D, bias, last", list(itertools.product([False, True], repeat=3)))
def test_gradcheck_runtime_options(D, bias, last):
    _gradcheck(make_inputs(D=D, z=True, bias=bias), softplus=True, last=last)


@pytest.mark.parametrize(
    "b_layout, c_layout, z, softplus",
    [("const", "const", False, False), ("shared", "grouped", True, False), ("grouped", "shared", False, True)],
)
def test_gradcheck_kernel_options(b_layout, c_layout, z, softplus):
    _gradcheck(make_inputs(b_layout, c_layout, D=True, z=z, bias=True), softplus=softplus, last=True)


def _initial_state(dtype, seed=5):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(BATCH, DIM, N, dtype=dtype, generator=gen).requires_grad_()


def test_gradcheck_initial_state():
    """initial_state (h0) gets its gradient (dh0 = a_1 * lambda_1), in float64 against
    finite differences, with the other inputs' gradients and the last state."""
    args = make_inputs("shared", "const", D=True, z=True, bias=True) + [_initial_state(torch.float64)]

    def f(*xs):
        return selective_scan_fn(*xs[:8], delta_softplus=True, return_last_state=True, initial_state=xs[8])

    assert torch.autograd.gradcheck(f, args, eps=1e-6, atol=1e-6, rtol=1e-5)


def test_initial_state_continues_a_split_sequence():
    """Scanning the first half, then the second half from its last state, is the scan of
    the whole sequence (what chunked / streaming inference relies on)."""
    args = [a.detach() for a in make_inputs("shared", "shared", D=True, z=True, bias=True)]
    u, delta, A, B, C, D, z, bias = args
    whole, last = selective_scan_fn(*args, delta_softplus=True, return_last_state=True)
    k = L // 2
    cut = lambda x, s: x[..., s] if x.dim() == 3 else x  # noqa: E731
    part = lambda s, h0=None: selective_scan_fn(  # noqa: E731
        cut(u, s), cut(delta, s), A, cut(B, s), cut(C, s), D, cut(z, s), bias,
        delta_softplus=True, return_last_state=True, initial_state=h0)
    first, mid = part(slice(0, k))
    second, end = part(slice(k, L), mid)
    torch.testing.assert_close(torch.cat([first, second], dim=-1), whole)
    torch.testing.assert_close(end, last)


# float32 tests share one compiled kernel (with the training test): shared B and C, z, softplus
F32 = dict(b_layout="shared", c_layout="shared", dtype=torch.float32)


@pytest.mark.parametrize("with_h0", [False, True])
def test_float32_grads_match_autograd_through_reference(with_h0):
    args = make_inputs(**F32, seed=3) + ([_initial_state(torch.float32)] if with_h0 else [])
    h0 = args[8] if with_h0 else None
    out, last = selective_scan_fn(*args[:8], delta_softplus=True, return_last_state=True, initial_state=h0)
    ref, ref_last = selective_scan_ref(*args[:8], delta_softplus=True, return_last_state=True, initial_state=h0)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(last, ref_last, rtol=1e-5, atol=1e-5)
    g, gl = torch.randn_like(out), torch.randn_like(last)
    ours = torch.autograd.grad((out * g).sum() + (last * gl).sum(), args)
    theirs = torch.autograd.grad((ref * g).sum() + (ref_last * gl).sum(), args)
    for name, x, y in zip("u delta A B C D z delta_bias initial_state".split(), ours, theirs):
        assert x.dtype == y.dtype and x.shape == y.shape, name
        err = (x - y).abs().max().item() / y.abs().max().item()
        assert err <= 1e-4, f"d{name}: relative error {err}"


def test_low_precision_inputs_return_their_dtype():
    args = [a.detach().to(torch.bfloat16).requires_grad_() if a is not None else None
            for a in make_inputs(**F32)]
    out, last = selective_scan_fn(*args, delta_softplus=True, return_last_state=True)
    assert out.dtype == torch.bfloat16 and last.dtype == torch.float32
    out.float().sum().backward()
    assert all(a.grad.dtype == torch.bfloat16 for a in args)


def test_only_some_inputs_require_grad():
    args = [a.detach() if a is not None else None for a in make_inputs(**F32)]
    args[0].requires_grad_()
    selective_scan_fn(*args, delta_softplus=True).sum().backward()
    assert args[0].grad is not None and args[1].grad is None


def test_opcheck():
    args = [a.detach() if a is not None else None for a in make_inputs(**F32)]
    for i in range(8):
        if args[i] is not None:
            args[i].requires_grad_()
    torch.library.opcheck(torch.ops.scanweaver.selective_scan_fwd.default, (*args, True))
    out = torch.randn(BATCH, DIM, L)
    last = torch.randn(BATCH, DIM, N)  # noqa: F841 - the bwd op's inputs
    plain = [a.detach() if a is not None else None for a in args]
    torch.library.opcheck(torch.ops.scanweaver.selective_scan_bwd.default, (*plain, True, out, last))
    h0 = _initial_state(torch.float32)
    torch.library.opcheck(torch.ops.scanweaver.selective_scan_fwd.default, (*args, True, h0))
    torch.library.opcheck(torch.ops.scanweaver.selective_scan_bwd.default, (*plain, True, out, last, h0.detach()))
    f64 = dict(dtype=torch.float64, requires_grad=True)
    a, b, h0 = torch.rand(3, 8, **f64), torch.randn(3, 8, **f64), torch.randn(3, **f64)
    torch.library.opcheck(torch.ops.scanweaver.linear_scan_fwd.default, (a, b, h0, False))


def test_torch_compile_fullgraph():
    args = make_inputs(**F32)

    def loss(*xs):
        out = selective_scan_fn(*xs, delta_softplus=True)
        h = linear_scan(torch.sigmoid(xs[0]).double(), xs[1].double(), dim=-1)
        return (out * out).sum() + h.sum().float()

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    got = compiled(*args)
    want = loss(*args)
    torch.testing.assert_close(got, want)
    g1 = torch.autograd.grad(got, args)
    g2 = torch.autograd.grad(want, args)
    for x, y in zip(g1, g2):
        torch.testing.assert_close(x, y)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dim", [0, -1])
def test_linear_scan_gradcheck_and_reference(reverse, dim):
    gen = torch.Generator().manual_seed(1)
    a = (torch.rand(5, 3, dtype=torch.float64, generator=gen) * 1.6 - 0.8).requires_grad_()
    b = torch.randn(5, 3, dtype=torch.float64, generator=gen).requires_grad_()
    h0 = torch.randn(3 if dim == 0 else 5, dtype=torch.float64, generator=gen).requires_grad_()
    torch.testing.assert_close(linear_scan(a, b, h0, reverse, dim), linear_scan_ref(a, b, h0, reverse, dim))
    assert torch.autograd.gradcheck(lambda *x: linear_scan(*x, reverse=reverse, dim=dim), (a, b, h0))
    assert torch.autograd.gradcheck(lambda x, y: linear_scan(x, y, reverse=reverse, dim=dim), (a, b))


def test_bad_inputs_name_the_argument():
    args = [a.detach() if a is not None else None for a in make_inputs(**F32)]
    u, delta, A, B, C, D, z, bias = args
    with pytest.raises(ScanWeaverTypeError, match="'delta'.*dtype"):
        selective_scan_fn(u, delta.to(torch.int64), A, B, C)
    with pytest.raises(ScanWeaverValueError, match="'z' has shape"):
        selective_scan_fn(u, delta, A, B, C, z=z[:, :, :-1])
    with pytest.raises(ScanWeaverValueError, match="'B'.*must have shape"):
        selective_scan_fn(u, delta, A, B[..., :-1], C)
    with pytest.raises(ScanWeaverValueError, match="'A' is on meta"):
        selective_scan_fn(u, delta, A.to("meta"), B, C)
    # complex A is Mamba's complex wtype: real input-dependent B holds (re, im) pairs (2L)
    with pytest.raises(ScanWeaverValueError, match=r"'B' must have shape \(batch, N, 2L"):
        selective_scan_fn(u, delta, A.to(torch.complex64), B, C)
    with pytest.raises(ScanWeaverValueError, match="'u' has layout"):
        selective_scan_fn(u.to_sparse(), delta, A, B, C)
    with pytest.raises(ScanWeaverTypeError, match="'D' must be a torch.Tensor"):
        selective_scan_fn(u, delta, A, B, C, D=[1.0] * DIM)
    with pytest.raises(ScanWeaverValueError, match="'initial_state' has shape"):
        selective_scan_fn(u, delta, A, B, C, initial_state=torch.zeros(BATCH, DIM, N + 1))
    with pytest.raises(ScanWeaverTypeError, match="'initial_state' has dtype"):
        selective_scan_fn(u, delta, A, B, C, initial_state=torch.zeros(BATCH, DIM, N, dtype=torch.int32))
    with pytest.raises(ScanWeaverTypeError, match="'h0'.*one dtype"):
        linear_scan(torch.rand(2, 3), torch.rand(2, 3), torch.rand(2, dtype=torch.float64))
    with pytest.raises(ScanWeaverTypeError, match="'a' has dtype torch.int32"):
        linear_scan(torch.ones(2, 3, dtype=torch.int32), torch.ones(2, 3, dtype=torch.int32))
    with pytest.raises(ScanWeaverValueError, match="'h0' has shape"):
        linear_scan(torch.rand(2, 3), torch.rand(2, 3), torch.rand(3))


def test_non_contiguous_inputs_give_the_same_result():
    args = [a.detach() if a is not None else None for a in make_inputs(**F32)]
    u_t = args[0].transpose(1, 2).contiguous().transpose(1, 2)  # same values, other strides
    assert not u_t.is_contiguous()
    full = [u_t, *args[1:]]
    torch.testing.assert_close(selective_scan_fn(*full), selective_scan_fn(*args))


def test_import_scanweaver_does_not_import_torch():
    code = "import sys, scanweaver, scanweaver.api; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
