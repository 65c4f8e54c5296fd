"""Fused Triton kernels (fastfair.kernels) against the PyTorch references.

Without CUDA these run under the Triton interpreter: tests/conftest.py sets TRITON_INTERPRET=1
before any test module (hence fastfair.kernels, whose @triton.jit reads the flag when it
decorates) is imported. The interpreter has no bf16 (NumPy has none): the kernels compute on
an fp32 copy there, so the bf16 tests on CPU check that path and the GPU tests check real bf16.
Sizes stay small: the interpreter runs each program in NumPy.
"""
from __future__ import annotations

import math

import pytest
import torch

from fastfair import attacks, ops
from fastfair.ops import losses, steps
from fastfair.errors import UserError

K = pytest.importorskip("fastfair.kernels")
from fastfair.kernels import _launch, fused_loss  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
TERMS = losses.TERM_NAMES


def _weights(kind: str, n: int, gen: torch.Generator) -> dict:
    """Non-zero weights for every term: floats, per-sample tensors, or a mix."""
    out = {}
    for k, name in enumerate(TERMS):
        if kind == "float" or kind == "mixed" and k % 2:
            out[name] = 0.25 + 0.5 * k / len(TERMS)
        else:
            out[name] = torch.rand(n, generator=gen).to(DEV) + 0.1
    return out


def _compare(z_nat, z_adv, y, kw, atol=1e-4, rtol=1e-4, grad_atol=None, grad_rtol=None):
    """Loss and gradients (w.r.t. every logits tensor that requires grad) vs the reference."""
    grad_atol = atol if grad_atol is None else grad_atol
    grad_rtol = rtol if grad_rtol is None else grad_rtol

    def run(fn):
        zn = None if z_nat is None else z_nat.detach().clone().requires_grad_(z_nat.requires_grad)
        za = None if z_adv is None else z_adv.detach().clone().requires_grad_(z_adv.requires_grad)
        loss = fn(zn, za, y, **kw)
        leaves = [z for z in (zn, za) if z is not None and z.requires_grad]
        go = torch.linspace(-1.0, 2.0, y.shape[0], device=y.device)
        grads = torch.autograd.grad((loss * go).sum(), leaves, allow_unused=True) if leaves else ()
        return loss, [torch.zeros_like(z) if g is None else g for z, g in zip(leaves, grads)]

    got, got_g = run(K.row_loss)
    want, want_g = run(losses.row_loss)
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
    for g, w in zip(got_g, want_g):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g.float(), w.float(), atol=grad_atol, rtol=grad_rtol)


def _logits(n, c, gen, scale=3.0, dtype=torch.float32):
    return (torch.randn(n, c, generator=gen) * scale).to(DEV, dtype)


# ---- fused row loss ---------------------------------------------------------------------------


@pytest.mark.parametrize("c", [2, 10, 100, 1000])
@pytest.mark.parametrize("term", TERMS)
def test_each_term_matches_reference(c, term):
    gen = torch.Generator().manual_seed(c)
    n = 37
    y = torch.randint(0, c, (n,), generator=gen).to(DEV)
    zn = _logits(n, c, gen).requires_grad_()
    za = _logits(n, c, gen).requires_grad_()
    _compare(zn, za, y, {term: 0.7})


@pytest.mark.parametrize("term", losses.TERMS, ids=TERMS)
def test_kernel_implements_every_table_term(term):
    """Each entry of losses.TERMS alone, with a random per-row weight and only the logits it reads:
    a term added to the table without its kernel block (or with wrong ``reads``) fails here."""
    gen = torch.Generator().manual_seed(17)
    n, c = 9, 10
    y = torch.randint(0, c, (n,), generator=gen).to(DEV)
    z = {r: _logits(n, c, gen).requires_grad_() if r in term.reads else None for r in ("nat", "adv")}
    w = torch.rand(n, generator=gen).to(DEV) + 0.1
    _compare(z["nat"], z["adv"], y, {term.name: w, "smoothing": 0.1, "temperature": 0.7, "kappa": 1.5})


def test_kernel_term_masks_follow_the_table():
    """Bit k is table entry k; the nat / adv masks are the terms whose ``reads`` name those logits."""
    assert fused_loss.BIT == {t.name: 1 << k for k, t in enumerate(losses.TERMS)}
    for side, mask in (("nat", fused_loss.NAT_TERMS), ("adv", fused_loss.ADV_TERMS)):
        assert {t for t in TERMS if mask & fused_loss.BIT[t]} == {t.name for t in losses.TERMS if side in t.reads}
    assert fused_loss.NAT_TERMS | fused_loss.ADV_TERMS == (1 << len(TERMS)) - 1


def test_unknown_weight_name_raises():
    z = torch.randn(4, 10).to(DEV)
    y = torch.zeros(4, dtype=torch.long, device=DEV)
    for fn in (K.row_loss, losses.row_loss):
        with pytest.raises(TypeError, match="unknown weight.*kl_adv.*known terms: ce_nat"):
            fn(z, z, y, ce_adv=1.0, kl_adv=1.0)


@pytest.mark.parametrize("c", [2, 10, 100, 1000])
@pytest.mark.parametrize("weights", ["float", "tensor", "mixed"])
@pytest.mark.parametrize("smoothing,temperature", [(0.0, 1.0), (0.1, 0.5), (0.1, 2.0)])
def test_all_terms_combined(c, weights, smoothing, temperature):
    gen = torch.Generator().manual_seed(1000 + c)
    n = 19
    y = torch.randint(0, c, (n,), generator=gen).to(DEV)
    zn = _logits(n, c, gen).requires_grad_()
    za = _logits(n, c, gen).requires_grad_()
    kw = _weights(weights, n, gen) | {"smoothing": smoothing, "temperature": temperature, "kappa": 2.0}
    _compare(zn, za, y, kw)


@pytest.mark.parametrize("c", [10, 100])
def test_many_programs_with_a_partial_last_block(monkeypatch, c):
    """Small tiles force several programs over rows; N is not a multiple of BLOCK_R."""
    monkeypatch.setattr(fused_loss, "_TILE_INTERPRET", 4 * triton_next_pow2(c))
    monkeypatch.setattr(fused_loss, "_TILE_GPU", 4 * triton_next_pow2(c))
    assert fused_loss._blocks(23, c)[0] == 4
    gen = torch.Generator().manual_seed(7)
    n = 23
    y = torch.randint(0, c, (n,), generator=gen).to(DEV)
    zn = _logits(n, c, gen).requires_grad_()
    za = _logits(n, c, gen).requires_grad_()
    _compare(zn, za, y, _weights("mixed", n, gen) | {"smoothing": 0.1})


def triton_next_pow2(c):
    return 1 << (c - 1).bit_length()


@pytest.mark.parametrize("c", [10, 1000])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_extreme_logits_stay_finite(c, smoothing):
    """|z| ~ 1e4: log-sum-exp with the row max subtracted (absolute error ~ ulp(1e4))."""
    gen = torch.Generator().manual_seed(3)
    n = 13
    y = torch.randint(0, c, (n,), generator=gen).to(DEV)
    zn = (_logits(n, c, gen, scale=1.0) * 1e4).requires_grad_()
    za = (_logits(n, c, gen, scale=1.0) * 1e4).requires_grad_()
    kw = {t: 1.0 for t in TERMS} | {"smoothing": smoothing}
    _compare(zn, za, y, kw, atol=1e-2, rtol=1e-5)


def test_confident_rows_give_zero_loss_and_gradient():
    """p_y -> 1: CE and entropy and their gradients go to 0 without NaN."""
    n, c = 8, 10
    y = torch.arange(n, device=DEV) % c
    z = torch.zeros(n, c, device=DEV)
    z[torch.arange(n), y] = 200.0
    z.requires_grad_()
    for term in ("ce_adv", "ent_adv"):
        loss = K.row_loss(None, z, y, **{term: 1.0})
        (g,) = torch.autograd.grad(loss.sum(), z)
        assert torch.isfinite(loss).all() and loss.abs().max() < 1e-6
        assert torch.isfinite(g).all() and g.abs().max() < 1e-6
    _compare(z.detach().requires_grad_(), z.detach().requires_grad_(), y, {t: 1.0 for t in TERMS})


def test_none_logits_when_their_terms_are_zero():
    gen = torch.Generator().manual_seed(5)
    n, c = 11, 10
    y = torch.randint(0, c, (n,), generator=gen).to(DEV)
    z = _logits(n, c, gen).requires_grad_()
    _compare(None, z, y, {"ce_adv": 1.0, "ent_adv": 0.3, "cw_adv": torch.rand(n).to(DEV), "kappa": 1.0})
    _compare(z, None, y, {"ce_nat": torch.rand(n).to(DEV), "ent_nat": 0.3, "smoothing": 0.1})
    with pytest.raises(ValueError):
        K.row_loss(None, z, y, kl=1.0)
    zero = K.row_loss(z, z, y)
    assert torch.equal(zero, torch.zeros(n, device=DEV))


def test_attack_case_detached_nat_and_weight_tensor_with_zeros():
    """TRADES attack: z_nat detached, gradient to z_adv only; zero entries in weight tensors."""
    gen = torch.Generator().manual_seed(6)
    n, c = 16, 10
    y = torch.randint(0, c, (n,), generator=gen).to(DEV)
    zn = _logits(n, c, gen)
    za = _logits(n, c, gen).requires_grad_()
    w = torch.rand(n).to(DEV)
    w[::3] = 0.0
    _compare(zn, za, y, {"kl": 1.0, "ce_adv": w})
    loss = K.row_loss(zn, za, y, kl=1.0)
    (g,) = torch.autograd.grad(loss.sum(), za)
    assert g.shape == za.shape


def test_cw_margin_ties_and_kappa():
    """Ties in max_{j != y} share the gradient as amax does; at margin > kappa it is 0."""
    y = torch.tensor([0, 1, 2], device=DEV)
    z = torch.tensor([[0.0, 3.0, 3.0, 1.0], [5.0, 0.0, 5.0, 5.0], [9.0, 0.0, 0.0, 1.0]], device=DEV)
    _compare(None, z.clone().requires_grad_(), y, {"cw_adv": 1.0, "kappa": 4.0})


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs(dtype):
    """Maths in fp32 whatever the input dtype; gradients come back in the input dtype."""
    gen = torch.Generator().manual_seed(8)
    n, c = 21, 100
    y = torch.randint(0, c, (n,), generator=gen).to(DEV)
    zn = _logits(n, c, gen, dtype=dtype).requires_grad_()
    za = _logits(n, c, gen, dtype=dtype).requires_grad_()
    kw = _weights("mixed", n, gen) | {"smoothing": 0.1, "temperature": 0.5}
    # Gradients are rounded to the input dtype: allow one ulp of it.
    _compare(zn, za, y, kw, atol=1e-4, rtol=1e-4, grad_atol=1e-2, grad_rtol=2 * torch.finfo(dtype).eps)


def test_gradcheck_fp64_inputs():
    """The kernel computes in fp32 even on fp64 inputs, so the finite differences are coarse. Fast mode: the
    Jacobian against its finite differences along random directions (a wrong gradient fails it as surely), two
    launches per input where the full Jacobian takes two per element (each one a NumPy run under the interpreter)."""
    gen = torch.Generator().manual_seed(9)
    n, c = 5, 7
    y = torch.randint(0, c, (n,), generator=gen).to(DEV)
    zn = _logits(n, c, gen, scale=1.0, dtype=torch.float64).requires_grad_()
    za = _logits(n, c, gen, scale=1.0, dtype=torch.float64).requires_grad_()
    w = torch.rand(n, generator=gen, dtype=torch.float64).to(DEV)
    kw = {"ce_nat": 0.5, "ce_adv": w, "kl": 2.0, "ent_nat": 0.3, "ent_adv": w, "cw_adv": 0.7,
          "smoothing": 0.1, "temperature": 1.5}
    assert torch.autograd.gradcheck(
        lambda a, b: K.row_loss(a, b, y, **kw), (zn, za), eps=1e-3, atol=2e-3, rtol=1e-2, fast_mode=True
    )


def test_weight_that_requires_grad_uses_the_reference():
    gen = torch.Generator().manual_seed(10)
    n, c = 6, 10
    y = torch.randint(0, c, (n,), generator=gen).to(DEV)
    z = _logits(n, c, gen)
    w = torch.rand(n, device=DEV, requires_grad=True)
    loss = K.row_loss(None, z, y, ce_adv=w)
    (gw,) = torch.autograd.grad(loss.sum(), w)
    torch.testing.assert_close(gw, losses.cross_entropy(z, y))


def test_no_grad_skips_gradient_outputs():
    gen = torch.Generator().manual_seed(11)
    n, c = 6, 10
    y = torch.randint(0, c, (n,), generator=gen).to(DEV)
    z = _logits(n, c, gen).requires_grad_()
    with torch.no_grad():
        loss = K.row_loss(None, z, y, ce_adv=1.0)
    assert not loss.requires_grad
    rows, scalars, row_of, terms = fused_loss.kernel_weights({"ce_adv": 1.0}, n, DEV)
    _, gn, ga = K.row_loss_op(None, z.detach(), y, rows, scalars, row_of, terms, 0.0, 1.0, math.inf, False, False)
    assert gn.numel() == 0 and ga.numel() == 0


def test_cpu_without_interpreter_falls_back_to_reference(monkeypatch):
    gen = torch.Generator().manual_seed(12)
    z = torch.randn(4, 10, generator=gen)
    y = torch.randint(0, 10, (4,), generator=gen)
    monkeypatch.setattr(_launch, "_INTERPRET", False)
    torch.testing.assert_close(K.row_loss(None, z, y, ce_adv=1.0), losses.row_loss(None, z, y, ce_adv=1.0))
    rows, scalars, row_of, terms = fused_loss.kernel_weights({"ce_adv": torch.ones(4)}, 4, "cpu")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        K.row_loss_op(None, z, y, rows, scalars, row_of, terms, 0.0, 1.0, math.inf, False, False)
    x = torch.rand(4, 3, 2, 2, generator=gen)
    g = torch.randn(4, 3, 2, 2, generator=gen)
    eps_c, alpha_c = torch.full((10,), 0.1), torch.full((10,), 0.05)
    assert torch.equal(K.pgd_step(x, g, x, y, eps_c, alpha_c), steps.pgd_step(x, g, x, y, eps_c, alpha_c))
    assert ((K.random_start(x, y, eps_c, "uniform") - x).abs() <= 0.1 + 1e-6).all()


def test_compiles_without_graph_breaks_on_cpu():
    """fullgraph=True through the ops; under the interpreter the ops stay opaque graph nodes."""
    gen = torch.Generator().manual_seed(13)
    n, c = 9, 10
    y = torch.randint(0, c, (n,), generator=gen).to(DEV)
    zn = _logits(n, c, gen)
    za = _logits(n, c, gen).requires_grad_()

    def f(zn, za, y):
        return K.row_loss(zn, za, y, ce_adv=1.0, kl=6.0, cw_adv=0.5, temperature=0.5).sum()

    backend = "aot_eager" if DEV == "cpu" else "inductor"
    got = torch.compile(f, backend=backend, fullgraph=True)(zn, za, y)
    (g,) = torch.autograd.grad(got, za)
    za2 = za.detach().requires_grad_()
    want = losses.row_loss(zn, za2, y, ce_adv=1.0, kl=6.0, cw_adv=0.5, temperature=0.5).sum()
    (g2,) = torch.autograd.grad(want, za2)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(g, g2, atol=1e-5, rtol=1e-4)


# ---- PGD step and random start ----------------------------------------------------------------


def _batch(shape, layout, dtype, gen, c=10):
    n = shape[0]
    x = torch.rand(shape, generator=gen)
    x[:, :, 0, 0] = 0.0  # on the box edge
    x[:, :, 0, 1] = 1.0
    x_adv = (x + (torch.rand(shape, generator=gen) - 0.5) * 0.05).clamp(0, 1)
    grad = torch.randn(shape, generator=gen)
    grad[:, :, 1, :] = 0.0  # sign(0) = 0
    y = torch.randint(0, c, (n,), generator=gen)
    eps_c = torch.rand(c, generator=gen) * 0.05 + 0.01
    alpha_c = eps_c / 4
    mf = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    cast = lambda t: t.to(DEV, dtype).contiguous(memory_format=mf)  # noqa: E731
    return cast(x_adv), cast(grad), cast(x), y.to(DEV), eps_c.to(DEV), alpha_c.to(DEV)


def _in_ball(out, x, y, eps_c, slack):
    eps = eps_c[y].view(-1, 1, 1, 1)
    d = (out.float() - x.float()).abs()
    assert (d <= eps + slack).all()
    assert out.min() >= 0 and out.max() <= 1


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(5, 3, 8, 8), (3, 3, 20, 20)])  # per-sample 192 and 1200 > BLOCK
def test_pgd_step_matches_reference(layout, dtype, shape):
    gen = torch.Generator().manual_seed(sum(shape))
    x_adv, grad, x, y, eps_c, alpha_c = _batch(shape, layout, dtype, gen)
    out = K.pgd_step(x_adv, grad, x, y, eps_c, alpha_c)
    want = steps.pgd_step(x_adv, grad, x, y, eps_c, alpha_c)
    assert out.dtype == dtype and out.shape == x.shape
    assert out.stride() == x_adv.stride()
    assert torch.equal(out, want)
    _in_ball(out, x, y, eps_c, slack=torch.finfo(dtype).eps)


def test_pgd_step_mixed_layouts_and_fp16_budgets():
    gen = torch.Generator().manual_seed(21)
    x_adv, grad, x, y, eps_c, alpha_c = _batch((4, 3, 6, 6), "channels_last", torch.float32, gen)
    x, grad = x.contiguous(), grad.contiguous()  # x_adv channels_last, the others NCHW: copied to its layout
    sliced = torch.rand(4, 3, 6, 12, generator=gen).to(DEV)[..., ::2]  # not dense: made contiguous
    out = K.pgd_step(x_adv, grad, x, y, eps_c.half(), alpha_c)
    torch.testing.assert_close(out, steps.pgd_step(x_adv, grad, x, y, eps_c.half(), alpha_c), atol=0, rtol=0)
    out2 = K.pgd_step(sliced, grad, x, y, eps_c, alpha_c)
    assert torch.equal(out2, steps.pgd_step(sliced, grad, x, y, eps_c, alpha_c))


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_random_start_uniform_in_ball(layout, dtype):
    gen = torch.Generator().manual_seed(31)
    _, _, x, y, eps_c, _ = _batch((6, 3, 16, 16), layout, dtype, gen)
    torch.manual_seed(0)
    out = K.random_start(x, y, eps_c, "uniform")
    assert out.dtype == dtype and out.shape == x.shape
    _in_ball(out, x, y, eps_c, slack=torch.finfo(dtype).eps)
    # Uniform on [-eps, eps] where the box does not clip: mean 0, variance eps^2 / 3.
    eps = eps_c[y].view(-1, 1, 1, 1).float()
    inner = (x.float() > 0.1) & (x.float() < 0.9)
    u = ((out.float() - x.float()) / eps)[inner]
    assert abs(u.mean().item()) < 0.05 and abs(u.var().item() - 1 / 3) < 0.03
    assert u.min() < -0.95 and u.max() > 0.95
    torch.manual_seed(0)
    assert torch.equal(out, K.random_start(x, y, eps_c, "uniform"))  # torch.manual_seed reproduces it
    assert not torch.equal(out, K.random_start(x, y, eps_c, "uniform"))


def test_random_start_normal_and_none():
    gen = torch.Generator().manual_seed(32)
    _, _, x, y, eps_c, _ = _batch((4, 3, 32, 32), "channels_last", torch.float32, gen)
    out = K.random_start(x, y, eps_c, "normal")
    d = (out - x) / 0.001
    assert abs(d.mean().item()) < 0.05 and abs(d.std().item() - 1.0) < 0.05
    assert out.stride() == x.stride()
    assert torch.equal(K.random_start(x, y, eps_c, "none"), x)
    with pytest.raises(UserError):
        K.random_start(x, y, eps_c, "gaussian")


# ---- ops backend ------------------------------------------------------------------------------


def test_triton_backend_and_pgd_attack_match_torch_backend():
    """The whole attack with the triton backend equals the torch backend (deterministic init).

    TRADES-KL is checked by its property only, from TRADES's random start: at x' = x its
    gradient is exactly 0 in the kernel (p_adv - p_nat) and rounding noise in the reference.
    """
    gen = torch.Generator().manual_seed(41)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 4, 10)).to(DEV)
    x = torch.rand(7, 3, 4, 4, generator=gen).to(DEV)
    y = torch.randint(0, 10, (7,), generator=gen).to(DEV)
    eps_c = (torch.rand(10, generator=gen) * 0.05 + 0.01).to(DEV)
    adv = {}
    o = ops.backend("triton")
    assert o.row_loss is K.row_loss and o.pgd_step is K.pgd_step and o.random_start is K.random_start
    assert ops.backend("torch") is ops.REFERENCE
    for backend in ("triton", "torch"):
        for objective in ("ce", "kl", "cw"):
            init = "normal" if objective == "kl" else "none"
            atk = attacks.PGD(steps=3, objective=objective, init=init, kappa=5.0, ops=ops.backend(backend))
            adv[backend, objective] = atk(model, x, y, eps_c, eps_c / 4)
    for objective in ("ce", "cw"):
        assert torch.equal(adv["triton", objective], adv["torch", objective])
    x_kl = adv["triton", "kl"]
    _in_ball(x_kl, x, y, eps_c, slack=1e-6)
    with torch.no_grad():
        assert (losses.trades_kl(model(x), model(x_kl)) > 0).all()


# ---- GPU only ---------------------------------------------------------------------------------


@gpu
@needs_cuda
@pytest.mark.parametrize("c", [10, 100, 1000])
def test_gpu_bf16_row_loss(c):
    gen = torch.Generator().manual_seed(51)
    n = 300
    y = torch.randint(0, c, (n,), generator=gen).to(DEV)
    zn = _logits(n, c, gen, dtype=torch.bfloat16).requires_grad_()
    za = _logits(n, c, gen, dtype=torch.bfloat16).requires_grad_()
    kw = _weights("mixed", n, gen) | {"smoothing": 0.1, "temperature": 0.5}
    _compare(zn, za, y, kw, atol=1e-3, rtol=1e-3, grad_atol=1e-2, grad_rtol=2 * torch.finfo(torch.bfloat16).eps)


@gpu
@needs_cuda
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_gpu_bf16_pgd_step(layout):
    gen = torch.Generator().manual_seed(52)
    x_adv, grad, x, y, eps_c, alpha_c = _batch((64, 3, 32, 32), layout, torch.bfloat16, gen)
    out = K.pgd_step(x_adv, grad, x, y, eps_c, alpha_c)
    assert torch.equal(out, steps.pgd_step(x_adv, grad, x, y, eps_c, alpha_c))


@gpu
@needs_cuda
def test_gpu_compile_zero_graph_breaks():
    import torch._dynamo

    gen = torch.Generator().manual_seed(53)
    n, c = 128, 10
    y = torch.randint(0, c, (n,), generator=gen).to(DEV)
    zn = _logits(n, c, gen)
    za = _logits(n, c, gen).requires_grad_()
    x_adv, grad, x, yy, eps_c, alpha_c = _batch((n, 3, 8, 8), "channels_last", torch.float32, gen)

    def f(zn, za, y):
        loss = K.row_loss(zn, za, y, ce_adv=1.0, kl=6.0, ent_adv=torch.rand(n, device=DEV)).sum()
        return loss, K.pgd_step(x_adv, grad, x, yy, eps_c, alpha_c)

    torch._dynamo.reset()
    explain = torch._dynamo.explain(f)(zn, za, y)
    assert explain.graph_break_count == 0 and explain.graph_count == 1
    loss, out = torch.compile(f, fullgraph=True)(zn, za, y)
    loss.backward()
    assert torch.equal(out, steps.pgd_step(x_adv, grad, x, yy, eps_c, alpha_c))


def test_float_weights_travel_as_arguments_and_one_per_sample_weight_as_a_view():
    """No weight tensors are built per call (the wrapper used to stack a full row for every term)."""
    rows, scalars, row_of, terms = fused_loss.kernel_weights({"ce_nat": 1.0, "ent_adv": 0.5}, 8, "cpu")
    assert rows is None and set(row_of) == {-1}
    assert scalars[TERMS.index("ent_adv")] == 0.5 and terms == fused_loss.BIT["ce_nat"] | fused_loss.BIT["ent_adv"]
    beta = torch.rand(8)
    rows, scalars, row_of, _ = fused_loss.kernel_weights({"kl": beta, "ce_nat": 1.0}, 8, "cpu")
    assert rows.shape == (1, 8) and rows.data_ptr() == beta.data_ptr() and row_of[TERMS.index("kl")] == 0
