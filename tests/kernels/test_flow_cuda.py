"""The fused CUDA flow loss against the float64 reference (GPU only; skipped without CUDA).

Tolerances (‖Δ‖ / ‖ref‖): 1e-5 for float32 inputs (3xTF32 and fp32-FMA products), 1e-2 for
bfloat16/float16 inputs, on the per-term values and on the input gradient of a random
weighting of the terms (so every upstream-gradient path is exercised), and on the scalar
``hidden_flow_loss``. Every launch has its outputs poisoned with NaN first.

Two comparisons need a stated scale:
- geometry/adjacent are ‖G^S - G^T‖² / n²: computing E = G^S - G^T to tol relative to |G|
  (what any finite precision, the float32 reference included, can do) bounds their error by
  about tol·value + tol²·(‖G^S‖² + ‖G^T‖²)/n². The second part matters only where E cancels
  to ~0, e.g. one transition (m_b = 2): E = ‖d^S‖² - ‖d^T‖² = O(eps), the value ~1e-15.
- float16 gradients of the unscaled loss are ~1e-6, float16 subnormals with a few bits;
  as in float16 training (GradScaler), the loss is scaled by 2^12 before backward and the
  gradient unscaled for the comparison.
"""

import pytest
import torch

from phf_megatron.kernels import hidden_flow_loss
from phf_megatron.objectives.flow import (
    LayerPlan,
    adjacent_layer_loss,
    flow_terms,
    geometry_loss,
    transitions,
    unit_directions,
)

pytestmark = pytest.mark.gpu

EPS = 1e-6
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
LOSS_SCALE = {torch.float32: 1.0, torch.bfloat16: 1.0, torch.float16: 2.0**12}

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
    got, ref = got.detach().double(), ref.detach().double()
    return float((got - ref).norm() / ref.norm().clamp(min=1e-30))


def _gram_scales(s, t, valid, plan):
    """(‖G^S‖² + ‖G^T‖²)/n² per (layer, sample) and (‖C^S‖² + ‖C^T‖²)/n² per (pair, sample)."""
    idx = torch.tensor(plan.layers, device=s.device)
    delta_s, tv = transitions(s.double().index_select(0, idx), valid)
    delta_t, _ = transitions(t.double().index_select(0, idx), valid)
    d_s, d_t = unit_directions(delta_s, tv, EPS), unit_directions(delta_t, tv, EPS)
    zero = torch.zeros_like(d_s)
    geo = geometry_loss(d_s, zero, tv) + geometry_loss(zero, d_t, tv)
    pos = {layer: i for i, layer in enumerate(plan.layers)}
    lo = torch.tensor([pos[a] for a, _ in plan.pairs], device=s.device, dtype=torch.long)
    hi = torch.tensor([pos[c] for _, c in plan.pairs], device=s.device, dtype=torch.long)
    z = zero[lo]
    adj = adjacent_layer_loss(d_s[lo], d_s[hi], z, z, tv) + adjacent_layer_loss(z, z, d_t[lo], d_t[hi], tv)
    return {"geo": geo, "adj": adj}


def _assert_term_close(name, got, ref, tol, scale=None, seed=None):
    """‖got - ref‖ <= tol ‖ref‖ (+ tol² ‖scale‖ for the squared Gram differences)."""
    assert torch.isfinite(got).all(), f"{name}: unwritten/NaN values (seed {seed})"
    err = float((got.detach().double() - ref.detach().double()).norm())
    bound = tol * float(ref.detach().double().norm()) + (tol * tol * float(scale.norm()) if scale is not None else 0.0)
    assert err <= bound, f"{name}: |Δ| {err:.2e} > {bound:.2e} (rel {_rel(got, ref):.2e}, seed {seed})"


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
    scale = LOSS_SCALE[dtype]
    loss, got = _weighted(terms, {k: scale * w.float() for k, w in weights.items()})
    (grad,) = torch.autograd.grad(loss, s_k)
    _check(got, ref, grad.double() / scale, ref_grad, TOL[dtype], _gram_scales(s, t, valid, plan), seed)


def _check(got, ref, grad, ref_grad, tol, scales, seed):
    for k in ("dir", "geo", "adj"):
        assert (got[k] is None) == (ref[k] is None), k
        if got[k] is not None:
            _assert_term_close(k, got[k], ref[k], tol, scales.get(k), seed)
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
    (LOSS_SCALE[dtype] * got).backward()
    assert got.dtype == dtype
    assert _rel(got.detach(), ref.detach()) <= TOL[dtype], f"loss (seed {seed})"
    assert _rel(s_k.grad.double() / LOSS_SCALE[dtype], s_ref.grad) <= TOL[dtype], f"gradient (seed {seed})"


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
    scales = _gram_scales(s, t, valid, plan)
    for name, key in (("direction", "dir"), ("geometry", "geo"), ("adjacent", "adj")):
        _assert_term_close(name, getattr(got, name), getattr(ref, name), 1e-5, scales.get(key), seed)


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


MODE_CASES = [CASES[1], CASES[3]]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "3xbf16", "3xtf32"])
@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("case", MODE_CASES, ids=[IDS[1], IDS[3]])
def test_every_product_mode_runs_on_every_input_dtype(case, dtype, precision, seed):
    """Each (mode, dtype) kernel is a separate instantiation. bf16 products round Δh to
    bfloat16 (about 2^-9): on m_b = 2 with H = 37 the single adjacent term (the square of one
    difference of two cosines) then misses 1e-2 in about a quarter of the draws
    (tests/kernels/test_kernel_emulation.py), so there its value is only checked for being
    written and finite. 3xbf16 meets 1e-2 everywhere, 3xtf32 / fp32 1e-5 on float32 inputs."""
    from phf_megatron.kernels.flow_cuda import flow_terms_cuda

    dtype = DTYPES[dtype]
    variant, L, layers = case[:3]
    s, t, valid = _inputs(case, dtype, offset=1.0)
    valid = torch.ones(s.shape[1], s.shape[2], dtype=torch.bool, device="cuda") if valid is None else valid
    plan = LayerPlan.build(L, variant, layers)
    s_ref = s.double().requires_grad_(True)
    ref = flow_terms(s_ref, t.double(), valid, plan, variant, EPS)
    ref_parts = {"dir": ref.direction, "geo": ref.geometry, "adj": ref.adjacent}
    (ref_grad,) = torch.autograd.grad(sum(v.sum() for v in ref_parts.values()), s_ref)
    s_k = s.clone().requires_grad_(True)
    got = flow_terms_cuda(s_k, t, valid, plan, variant, EPS, precision=precision, poison=True)
    parts = {"dir": got.direction, "geo": got.geometry, "adj": got.adjacent}
    scale = LOSS_SCALE[dtype]
    (grad,) = torch.autograd.grad(scale * sum(v.sum() for v in parts.values()), s_k)
    tol = 1e-5 if dtype == torch.float32 and precision in ("fp32", "3xtf32") else 1e-2
    if precision == "bf16" and case is CASES[3]:
        assert torch.isfinite(parts["adj"]).all(), f"adj: unwritten/NaN values (seed {seed})"
        parts["adj"] = ref_parts["adj"] = None
    _check(parts, ref_parts, grad.double() / scale, ref_grad, tol, _gram_scales(s, t, valid, plan), seed)
