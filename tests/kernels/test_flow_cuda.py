"""The fused CUDA flow loss against the float64 reference (GPU only; skipped without CUDA).

Tolerances (‖Δ‖ / ‖ref‖): 1e-5 for float32 inputs (3xTF32 and fp32-FMA products), 1e-2 for
bfloat16/float16 inputs, on the per-term values and on the input gradient of a random
weighting of the terms (so every upstream-gradient path is exercised), and on the scalar
``hidden_flow_loss``. Every launch has its outputs poisoned with NaN first.
"""

import pytest
import torch

from phf_megatron.objectives import hidden_flow_loss
from phf_megatron.objectives.flow import LayerPlan, flow_terms

pytestmark = pytest.mark.gpu

EPS = 1e-6
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# variant, L, layers, B, m, H, lengths (None = all valid), repeats (which, l, b, i): h_{i+1} = h_i
CASES = [
    ("phf", 4, None, 3, 128, 4099, None, ()),
    ("phf", 3, None, 4, 128, 257, [128, 77, 2, 1], [("s", 0, 0, 10), ("t", 1, 1, 3)]),
    ("phf", 5, [0, 1, 3, 4], 2, 50, 1000, [50, 2], [("s", 3, 0, 0)]),
    ("phf", 2, None, 1, 2, 37, None, ()),
    ("local", 3, None, 3, 100, 130, [100, 64, 33], [("s", 2, 2, 31)]),
    ("local", 3, [1], 2, 9, 96, [9, 5], ()),
    ("direction", 4, [0, 2, 3], 2, 128, 515, [128, 120], ()),
    ("geometry", 3, None, 2, 31, 77, [31, 17], [("t", 0, 0, 5)]),
    ("phf", 2, None, 3, 17, 5, [17, 9, 0], ()),  # tiny H (H = 1 is pure eps-cancellation in fp32)
]
IDS = [f"{c[0]}-L{c[1]}-B{c[3]}-m{c[4]}-H{c[5]}" for c in CASES]


def _inputs(case, dtype, offset=0.0):
    variant, L, layers, B, m, H, lengths, repeats = case
    base = 5.0 * offset * torch.randn(L, B, 1, H, device="cuda")  # a shared, position-independent part
    s = torch.randn(L, B, m, H, device="cuda") + base
    t = torch.randn(L, B, m, H, device="cuda") + base
    for which, l, b, i in repeats:
        if dtype == torch.float16:  # the gradient at Δh = 0 is (1/eps)·g: beyond float16's range
            continue
        x = s if which == "s" else t
        x[l, b, i + 1] = x[l, b, i]
    valid = None if lengths is None else torch.arange(m, device="cuda")[None] < torch.tensor(lengths, device="cuda")[:, None]
    return s.to(dtype), t.to(dtype), valid


def _rel(got, ref):
    got, ref = got.double(), ref.double()
    return float((got - ref).norm() / ref.norm().clamp(min=1e-30))


def _weighted(terms, weights):
    parts = {"dir": terms.direction, "geo": terms.geometry, "adj": terms.adjacent}
    return sum((weights[k] * v).sum() for k, v in parts.items() if v is not None), parts


@pytest.mark.parametrize("precision", ["auto", "fp32"])
@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_terms_and_gradient_equal_float64_reference(case, dtype, precision, seed):
    from phf_megatron.kernels.flow_cuda import flow_terms_cuda

    dtype = DTYPES[dtype]
    variant, L, layers = case[:3]
    s, t, valid = _inputs(case, dtype, offset=1.0)
    B, m = s.shape[1], s.shape[2]
    valid = torch.ones(B, m, dtype=torch.bool, device="cuda") if valid is None else valid
    plan = LayerPlan.build(L, variant, layers)
    n_l, n_p = len(plan.layers), len(plan.pairs)
    weights = {k: torch.rand(n, B, device="cuda", dtype=torch.float64) for k, n in (("dir", n_l), ("geo", n_l), ("adj", n_p))}

    s_ref = s.double().requires_grad_(True)
    ref_loss, ref = _weighted(flow_terms(s_ref, t.double(), valid, plan, variant, EPS), weights)
    (ref_grad,) = torch.autograd.grad(ref_loss, s_ref)

    s_k = s.clone().requires_grad_(True)
    terms = flow_terms_cuda(s_k, t, valid, plan, variant, EPS, precision=precision, poison=True)
    loss, got = _weighted(terms, {k: w.float() for k, w in weights.items()})
    (grad,) = torch.autograd.grad(loss, s_k)

    tol = TOL[dtype]
    for k in ("dir", "geo", "adj"):
        assert (got[k] is None) == (ref[k] is None), k
        if got[k] is not None:
            assert torch.isfinite(got[k]).all(), f"{k}: unwritten/NaN values (seed {seed})"
            assert _rel(got[k], ref[k]) <= tol, f"{k}: rel {_rel(got[k], ref[k]):.2e} > {tol} (seed {seed})"
    assert torch.isfinite(grad).all(), f"gradient: unwritten/NaN values (seed {seed})"
    assert _rel(grad, ref_grad) <= tol, f"gradient: rel {_rel(grad, ref_grad):.2e} > {tol} (seed {seed})"


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("variant", ["phf", "local", "direction", "geometry"])
def test_hidden_flow_loss_cuda_backend_equals_reference(variant, dtype, seed):
    dtype = DTYPES[dtype]
    case = (variant, 4, None, 3, 64, 300, [64, 40, 1], [("s", 1, 1, 2)])
    s, t, valid = _inputs(case, dtype)
    s_ref = s.double().requires_grad_(True)
    ref = hidden_flow_loss(s_ref, t.double(), valid, variant=variant, backend="torch")
    ref.backward()
    s_k = s.clone().requires_grad_(True)
    got = hidden_flow_loss(s_k, t, valid, variant=variant, backend="cuda")
    got.backward()
    assert got.dtype == dtype
    assert _rel(got.detach(), ref.detach()) <= TOL[dtype], f"loss (seed {seed})"
    assert _rel(s_k.grad, s_ref.grad) <= TOL[dtype], f"gradient (seed {seed})"


def test_auto_backend_runs_the_kernel_on_cuda_inputs(monkeypatch, seed):
    from phf_megatron.kernels import flow_cuda

    calls = []
    original = flow_cuda.flow_terms_cuda
    monkeypatch.setattr(flow_cuda, "flow_terms_cuda", lambda *a, **k: calls.append(1) or original(*a, **k))
    s, t, _ = _inputs(CASES[1], torch.float32)
    hidden_flow_loss(s, t)
    assert calls == [1]
    hidden_flow_loss(s, t, backend="torch")
    hidden_flow_loss(s, t, variant="pointwise_mse", backend="cuda")  # no kernel: the reference
    assert calls == [1]


@pytest.mark.parametrize("n_chunks", [1, 2, 3, 8])
def test_split_of_the_hidden_axis_does_not_change_the_result(n_chunks, seed):
    from phf_megatron.kernels.flow_cuda import flow_terms_cuda

    s, t, valid = _inputs(CASES[2], torch.float32)
    plan = LayerPlan.build(5, "phf", [0, 1, 3, 4])
    ref = flow_terms(s.double(), t.double(), valid, plan, "phf", EPS)
    got = flow_terms_cuda(s, t, valid, plan, "phf", EPS, n_chunks=n_chunks, poison=True)
    for name in ("direction", "geometry", "adjacent"):
        assert _rel(getattr(got, name), getattr(ref, name)) <= 1e-5, f"{name} (seed {seed})"


def test_batch_without_transitions_gives_zero_loss_and_zero_gradient():
    s = torch.randn(3, 2, 8, 40, device="cuda", requires_grad=True)
    t = torch.randn(3, 2, 8, 40, device="cuda")
    valid = torch.zeros(2, 8, dtype=torch.bool, device="cuda")
    valid[0, 0] = True
    loss = hidden_flow_loss(s, t, valid, backend="cuda")
    loss.backward()
    assert float(loss) == 0.0
    assert torch.equal(s.grad, torch.zeros_like(s))


def test_teacher_gets_no_gradient_and_noncontiguous_inputs_work(seed):
    big_s = torch.randn(3, 2, 16, 70, device="cuda")
    s = big_s[..., 3:67].requires_grad_(True)  # a non-contiguous view
    t = torch.randn(3, 2, 16, 64, device="cuda", requires_grad=True)
    loss = hidden_flow_loss(s, t, backend="cuda")
    loss.backward()
    assert t.grad is None
    s_ref = s.detach().double().requires_grad_(True)
    ref = hidden_flow_loss(s_ref, t.detach().double(), backend="torch")
    ref.backward()
    assert _rel(s.grad, s_ref.grad) <= 1e-5, f"seed {seed}"


def test_long_window_falls_back_on_auto_and_raises_on_cuda():
    s = torch.randn(2, 1, 130, 8, device="cuda")
    t = torch.randn(2, 1, 130, 8, device="cuda")
    torch.testing.assert_close(hidden_flow_loss(s, t), hidden_flow_loss(s, t, backend="torch"))
    with pytest.raises(ValueError, match="at most 128"):
        hidden_flow_loss(s, t, backend="cuda")


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("case", CASES[:3], ids=IDS[:3])
def test_two_ctas_per_sm_build_agrees_with_reference(case, dtype, seed):
    """The register-capped build (PHF_FLOW_CTAS_PER_SM=2) is a separately compiled kernel."""
    from phf_megatron.kernels.flow_cuda import flow_terms_cuda

    dtype = DTYPES[dtype]
    variant, L, layers = case[:3]
    s, t, valid = _inputs(case, dtype)
    valid = torch.ones(s.shape[1], s.shape[2], dtype=torch.bool, device="cuda") if valid is None else valid
    plan = LayerPlan.build(L, variant, layers)
    s_ref = s.double().requires_grad_(True)
    ref = flow_terms(s_ref, t.double(), valid, plan, variant, EPS)
    (ref_grad,) = torch.autograd.grad(ref.geometry.sum() + ref.adjacent.sum() + ref.direction.sum(), s_ref)
    s_k = s.clone().requires_grad_(True)
    got = flow_terms_cuda(s_k, t, valid, plan, variant, EPS, ctas_per_sm=2, poison=True)
    (grad,) = torch.autograd.grad(got.geometry.sum() + got.adjacent.sum() + got.direction.sum(), s_k)
    for name in ("direction", "geometry", "adjacent"):
        assert _rel(getattr(got, name), getattr(ref, name)) <= TOL[dtype], f"{name} (seed {seed})"
    assert _rel(grad, ref_grad) <= TOL[dtype], f"gradient (seed {seed})"
