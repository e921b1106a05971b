"""hidden_flow_loss against the plain-loop reference (float64), gradients, masks, edge cases."""

import pytest
import torch

from phf_megatron.objectives import hidden_flow_loss
from phf_megatron.objectives.flow import FLOW_VARIANTS, LayerPlan, flow_terms, layer_loss

from .loop_reference import loop_flow_loss, loop_layer_terms

TOL = dict(rtol=1e-10, atol=1e-12)  # float64 against float64: only summation order differs


def _pair(L=4, B=3, m=7, H=5, dtype=torch.float64):
    return torch.randn(L, B, m, H, dtype=dtype), torch.randn(L, B, m, H, dtype=dtype)


@pytest.mark.parametrize("variant", FLOW_VARIANTS)
def test_equals_loop_reference_all_layers(variant):
    s, t = _pair()
    got = hidden_flow_loss(s, t, variant=variant)
    torch.testing.assert_close(got, torch.tensor(loop_flow_loss(s, t, variant=variant), dtype=torch.float64), **TOL)


@pytest.mark.parametrize("variant", FLOW_VARIANTS)
def test_equals_loop_reference_variable_lengths_and_selected_layers(variant):
    s, t = _pair(L=5, B=4, m=6)
    lengths = torch.tensor([6, 3, 1, 2])
    valid = torch.arange(6)[None] < lengths[:, None]
    layers = [0, 2, 3] if variant != "phf" else [1, 2, 4]
    got = hidden_flow_loss(s, t, valid, variant=variant, layers=layers)
    ref = loop_flow_loss(s, t, valid, variant=variant, layers=layers)
    torch.testing.assert_close(got, torch.tensor(ref, dtype=torch.float64), **TOL)


@pytest.mark.parametrize("layers", [None, [0, 2, 3, 4]])
def test_each_layers_and_pairs_terms_equal_their_equations(layers):
    """L_dir(l), L_geo(l), L_layer(l) and each (l, l+1) summand of L_adj, per layer and sample, against the
    loop reference (the sums above would not see a value put on the wrong layer: the layer-energy
    diagnostic of Section 4 reads them one by one)."""
    s, t = _pair(L=5, B=4, m=6)
    valid = torch.arange(6)[None] < torch.tensor([6, 3, 1, 2])[:, None]
    plan = LayerPlan.build(5, "phf", layers)
    terms = flow_terms(s, t, valid, plan, "phf", 1e-6)
    l_dir, l_geo, l_adj = loop_layer_terms(s, t, valid, 1e-6, list(plan.layers))
    assert terms.sample_mask.tolist() == [True, True, False, True]
    per_layer = layer_loss(terms, "phf")
    for j, l in enumerate(plan.layers):
        for b in (0, 1, 3):
            want = torch.tensor([l_dir[l, b], l_geo[l, b], 0.5 * (l_dir[l, b] + l_geo[l, b])], dtype=torch.float64)
            torch.testing.assert_close(torch.stack([terms.direction[j, b], terms.geometry[j, b], per_layer[j, b]]),
                                       want, **TOL)
    assert terms.adjacent.shape[0] == len(plan.pairs) == len({lower for lower, _ in l_adj})
    for p, (lower, _) in enumerate(plan.pairs):
        for b in (0, 1, 3):
            torch.testing.assert_close(terms.adjacent[p, b], torch.tensor(l_adj[lower, b], dtype=torch.float64), **TOL)


def test_phf_is_half_local_plus_half_adjacent():
    s, t = _pair()
    phf = hidden_flow_loss(s, t, variant="phf")
    local = hidden_flow_loss(s, t, variant="local")
    direction = hidden_flow_loss(s, t, variant="direction")
    geometry = hidden_flow_loss(s, t, variant="geometry")
    torch.testing.assert_close(local, 0.5 * (direction + geometry), **TOL)
    assert not torch.allclose(phf, local)  # the adjacent term is not a copy of the local one


def test_variable_lengths_equal_per_sample_mean():
    """A padded batch equals the mean of each sample computed alone at its own length."""
    s, t = _pair(L=3, B=4, m=8)
    lengths = [8, 5, 1, 2]  # the 1-position sample has no transition and is left out
    valid = torch.arange(8)[None] < torch.tensor(lengths)[:, None]
    batch = hidden_flow_loss(s, t, valid)
    alone = [hidden_flow_loss(s[:, b : b + 1, :n], t[:, b : b + 1, :n]) for b, n in enumerate(lengths) if n >= 2]
    torch.testing.assert_close(batch, torch.stack(alone).mean(), **TOL)


def test_padding_content_is_ignored():
    s, t = _pair(L=2, B=2, m=6)
    valid = torch.arange(6)[None] < torch.tensor([[4], [6]])
    s2, t2 = s.clone(), t.clone()
    s2[:, 0, 4:] = 1e3 * torch.randn_like(s2[:, 0, 4:])
    t2[:, 0, 4:] = -7.0
    torch.testing.assert_close(hidden_flow_loss(s, t, valid), hidden_flow_loss(s2, t2, valid), **TOL)


@pytest.mark.parametrize("variant", FLOW_VARIANTS)
def test_gradcheck(variant):
    s, t = _pair(L=3, B=2, m=5, H=4)
    s.requires_grad_(True)
    valid = torch.tensor([[True] * 5, [True, True, True, False, False]])
    assert torch.autograd.gradcheck(lambda x: hidden_flow_loss(x, t, valid, variant=variant), (s,))


def test_teacher_receives_no_gradient():
    s, t = _pair()
    s.requires_grad_(True)
    t.requires_grad_(True)
    hidden_flow_loss(s, t).backward()
    assert t.grad is None
    assert s.grad is not None and s.grad.abs().sum() > 0


def test_repeated_state_gives_finite_loss_and_gradient():
    s, t = _pair(L=2, B=2, m=5)
    s[:, :, 2] = s[:, :, 1]  # Δh = 0 between positions 1 and 2 of the student
    t[:, 1, 4] = t[:, 1, 3]  # and a zero teacher transition
    s.requires_grad_(True)
    for variant in FLOW_VARIANTS:
        s.grad = None
        loss = hidden_flow_loss(s, t, variant=variant)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(s.grad).all(), variant


def test_no_eligible_sample_gives_zero_with_zero_gradient():
    s, t = _pair(L=2, B=2, m=3)
    s.requires_grad_(True)
    valid = torch.tensor([[True, False, False], [False, False, False]])
    loss = hidden_flow_loss(s, t, valid)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.equal(s.grad, torch.zeros_like(s))


def test_identical_student_and_teacher_give_zero():
    # 1 - <d, d> = 1 - (|dh| / (|dh| + eps))^2 ~ 2 eps / |dh|: exactly 0 only as eps -> 0.
    s, _ = _pair()
    for variant in FLOW_VARIANTS:
        assert hidden_flow_loss(s, s.clone(), variant=variant, eps=1e-13).abs().item() < 1e-11, variant


def test_bf16_input_is_computed_in_fp32_and_close_to_fp64():
    s, t = _pair(dtype=torch.float64)
    ref = hidden_flow_loss(s, t)
    got = hidden_flow_loss(s.bfloat16(), t.bfloat16())
    assert got.dtype == torch.bfloat16
    assert abs(got.double() - ref).item() / ref.item() < 2e-2  # bf16 inputs: ~3 significant digits
