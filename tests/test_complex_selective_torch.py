"""`scanweaver.torch.selective_scan_fn` with complex A (Mamba's complex wtype): forward
against a complex torch loop written from mamba_ssm's `selective_scan_ref`, gradients in
PyTorch's complex autograd convention checked by `gradcheck` (complex128 / float64) and
against autograd through the loop, `opcheck` of both ops, and bad input."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from scanweaver.errors import ScanWeaverTypeError, ScanWeaverValueError  # noqa: E402
from scanweaver.torch import selective_scan_fn  # noqa: E402

CF = torch.complex128


def _complex_weight(M, L):
    """Mamba: real input-dependent B/C hold (re, im) pairs on the last axis."""
    if M.is_complex() or M.dim() == 2:
        return M.to(CF)
    return torch.view_as_complex(M.to(torch.float64).reshape(*M.shape[:-1], L, 2).contiguous())


def _at(M, t, dim):
    if M.dim() == 2:
        return M[None]
    if M.dim() == 3:
        return M[:, None, :, t]
    return M[:, :, :, t].repeat_interleave(dim // M.shape[1], dim=1)


def _loop(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, h0=None):
    """mamba_ssm's selective_scan_ref for complex A, in complex128, one step at a time."""
    batch, dim, L = u.shape
    dt = delta + delta_bias[None, :, None] if delta_bias is not None else delta
    if delta_softplus:
        dt = F.softplus(dt)
    B, C = _complex_weight(B, L), _complex_weight(C, L)
    h = torch.zeros(batch, dim, A.shape[1], dtype=CF) if h0 is None else h0.to(CF)
    ys = []
    for t in range(L):
        d = dt[:, :, t, None]
        h = torch.exp(d * A[None]) * h + d * _at(B, t, dim) * u[:, :, t, None]
        ys.append(2 * (h * _at(C, t, dim)).sum(-1).real)
    out = torch.stack(ys, -1)
    if D is not None:
        out = out + D[None, :, None] * u
    if z is not None:
        out = out * F.silu(z)
    return out, h


def _inputs(kind_b, kind_c, batch=2, dim=4, L=5, N=3, seed=0, G=2):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, dtype=torch.float64, generator=g)  # noqa: E731
    A = torch.complex(-torch.rand(dim, N, dtype=torch.float64, generator=g) - 0.2, r(dim, N))

    def weight(kind):
        return {"const": lambda: torch.complex(r(dim, N), r(dim, N)),
                "const_real": lambda: r(dim, N),
                "pairs": lambda: r(batch, N, 2 * L),
                "grouped_pairs": lambda: r(batch, G, N, 2 * L),
                "shared_complex": lambda: torch.complex(r(batch, N, L), r(batch, N, L)),
                "grouped_complex": lambda: torch.complex(r(batch, G, N, L), r(batch, G, N, L))}[kind]()

    u, delta = r(batch, dim, L), 0.5 * r(batch, dim, L)
    return dict(u=u, delta=delta, A=A, B=weight(kind_b), C=weight(kind_c), D=r(dim), z=r(batch, dim, L),
                delta_bias=0.3 * r(dim), h0=torch.complex(r(batch, dim, N), r(batch, dim, N)))


# (B kind, C kind, softplus, with D, z, delta_bias and initial_state): the forward and
# gradcheck tests share these, so each compiled kernel is built once
CASES = [("const", "pairs", True, True), ("pairs", "grouped_complex", False, True),
         ("grouped_pairs", "const_real", True, False), ("shared_complex", "const", False, False)]
OPTIONAL = ["D", "z", "delta_bias", "h0"]


def _call(fn, kw, softplus):
    return fn(kw["u"], kw["delta"], kw["A"], kw["B"], kw["C"], kw.get("D"), kw.get("z"), kw.get("delta_bias"),
              softplus, kw.get("h0"))


def _ours(u, delta, A, B, C, D, z, delta_bias, softplus, h0):
    return selective_scan_fn(u, delta, A, B, C, D, z, delta_bias, softplus, return_last_state=True,
                             initial_state=h0)


@pytest.mark.parametrize("kind_b,kind_c,softplus,optional", CASES)
def test_forward_matches_mamba_loop(kind_b, kind_c, softplus, optional):
    x = _inputs(kind_b, kind_c, seed=CASES.index((kind_b, kind_c, softplus, optional)))
    kw = {n: x[n] for n in ["u", "delta", "A", "B", "C"] + (OPTIONAL if optional else [])}
    out, last = _call(_ours, kw, softplus)
    ref_out, ref_last = _call(_loop, kw, softplus)
    assert out.dtype == torch.float64 and last.dtype == CF
    torch.testing.assert_close(out, ref_out, rtol=1e-11, atol=1e-11)
    torch.testing.assert_close(last, ref_last, rtol=1e-11, atol=1e-11)


def test_complex64_forward_is_float32():
    x = _inputs("const", "pairs", seed=9)
    out32 = selective_scan_fn(x["u"].float(), x["delta"].float(), x["A"].to(torch.complex64), x["B"], x["C"],
                              delta_softplus=True)
    ref, _ = _loop(x["u"], x["delta"], x["A"], x["B"], x["C"], delta_softplus=True)
    assert out32.dtype == torch.float32
    torch.testing.assert_close(out32.double(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind_b,kind_c,softplus,optional", CASES)
def test_gradcheck_wirtinger(kind_b, kind_c, softplus, optional):
    x = _inputs(kind_b, kind_c, batch=1, dim=2, L=4, N=2, seed=7, G=1)
    names = ["u", "delta", "A", "B", "C"] + (OPTIONAL if optional else [])
    args = [x[n].clone().requires_grad_() for n in names]
    assert torch.autograd.gradcheck(lambda *a: _call(_ours, dict(zip(names, a)), softplus), args)


def test_gradients_equal_autograd_of_the_loop():
    x = _inputs("pairs", "grouped_complex", L=150, N=2, seed=11)  # CASES[1], L > 2 chunks of the backward
    names = ["u", "delta", "A", "B", "C", "D", "z", "delta_bias", "h0"]
    grads = []
    for impl in ("scanweaver", "loop"):
        args = {n: x[n].clone().requires_grad_() for n in names}
        if impl == "scanweaver":
            out, last = selective_scan_fn(*(args[n] for n in names[:8]), False, return_last_state=True,
                                          initial_state=args["h0"])
        else:
            out, last = _loop(*(args[n] for n in names[:8]), False, args["h0"])
        loss = (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)).sum() \
            + last.abs().square().sum()
        loss.backward()
        grads.append([args[n].grad for n in names])
    for n, mine, ref in zip(names, *grads):
        assert mine.dtype == ref.dtype and mine.shape == ref.shape, n
        torch.testing.assert_close(mine, ref, rtol=1e-9, atol=1e-9, msg=lambda m: f"{n}: {m}")


def test_float32_gradients_near_float64():
    x = _inputs("const", "pairs", batch=1, dim=8, L=64, N=4, seed=3)
    grads = []
    for ct, rt in ((torch.complex64, torch.float32), (CF, torch.float64)):
        u = x["u"].to(rt).requires_grad_()
        A = x["A"].to(ct).requires_grad_()
        B = x["B"].to(ct).requires_grad_()
        out = selective_scan_fn(u, x["delta"].to(rt), A, B, x["C"].to(rt), delta_softplus=True)
        out.square().sum().backward()
        grads.append((u.grad, A.grad, B.grad))
    for g32, g64 in zip(*grads):
        assert g32.dtype in (torch.float32, torch.complex64)
        scale = g64.abs().max()
        assert ((g32.to(g64.dtype) - g64).abs().max() / scale) < 1e-4


def test_opcheck():
    x = _inputs("const", "pairs", batch=1, dim=2, L=3, N=2, seed=1)  # CASES[0]
    args = (x["u"], x["delta"], x["A"], x["B"], x["C"], x["D"], x["z"], x["delta_bias"])
    torch.library.opcheck(torch.ops.scanweaver.complex_selective_scan_fwd.default, (*args, True, x["h0"]))
    torch.library.opcheck(torch.ops.scanweaver.complex_selective_scan_fwd.default, (*args[:5], None, None, None,
                                                                                    False))
    out, last = torch.ops.scanweaver.complex_selective_scan_fwd(*args, True, x["h0"])
    torch.library.opcheck(torch.ops.scanweaver.complex_selective_scan_bwd.default,
                          (*args, True, torch.ones_like(out), torch.ones_like(last), x["h0"]))


def test_bad_input_names_the_argument():
    x = _inputs("pairs", "pairs", batch=1, dim=2, L=3, N=2)
    call = lambda **kw: selective_scan_fn(**{**dict(u=x["u"], delta=x["delta"], A=x["A"], B=x["B"],  # noqa: E731
                                                    C=x["C"]), **kw})
    with pytest.raises(ScanWeaverValueError, match=r"argument 'B' must have shape \(batch, N, 2L"):
        call(B=x["B"][..., :3])
    with pytest.raises(ScanWeaverValueError, match="argument 'C'"):
        call(C=torch.complex(x["C"], x["C"]))  # complex input-dependent C has length L, not 2L
    with pytest.raises(ScanWeaverTypeError, match="argument 'u' has dtype torch.complex128"):
        call(u=x["u"].to(CF))
    with pytest.raises(ScanWeaverTypeError, match="argument 'D' has dtype torch.int64"):
        call(D=torch.ones(2, dtype=torch.int64))
    with pytest.raises(ScanWeaverValueError, match="argument 'initial_state' has shape"):
        call(initial_state=torch.zeros(1, 2, 3, dtype=CF))
    with pytest.raises(ScanWeaverValueError, match="argument 'A'"):
        call(A=x["A"][:1])


def test_torch_compile_fullgraph():
    x = _inputs("const", "pairs", batch=1, dim=2, L=3, N=2, seed=1)  # CASES[0]
    names = ["u", "delta", "A", "B", "C", "D", "z", "delta_bias", "h0"]
    args = [x[n].clone().requires_grad_() for n in names]

    def loss(*a):
        out, last = _call(_ours, dict(zip(names, a)), True)
        return (out * out).sum() + last.abs().sum()

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    got, want = compiled(*args), loss(*args)
    torch.testing.assert_close(got, want)
    for g1, g2 in zip(torch.autograd.grad(got, args), torch.autograd.grad(want, args)):
        torch.testing.assert_close(g1, g2)
