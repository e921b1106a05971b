"""The clipped generalized JSD against a direct token-by-token formula (float64)."""

import pytest
import torch
import torch.nn.functional as F

from phf_megatron.objectives import opsd_loss

from .loop_reference import direct_jsd


def _logits(B=2, T=5, V=11):
    return 3 * torch.randn(B, T, V, dtype=torch.float64), 3 * torch.randn(B, T, V, dtype=torch.float64)


MASK = torch.tensor([[True, True, True, False, False], [True, True, True, True, True]])


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0, 0.3])
@pytest.mark.parametrize("clip", [None, 0.05, 0.5])
@pytest.mark.parametrize("clip_mode", ["element", "token"])
def test_equals_direct_formula(beta, clip, clip_mode):
    s, t = _logits()
    got = opsd_loss(s, t, MASK, beta=beta, temperature=1.1, clip=clip, clip_mode=clip_mode)
    ref = direct_jsd(s, t, MASK, beta, temperature=1.1, clip=clip, clip_mode=clip_mode)
    torch.testing.assert_close(got, torch.tensor(ref, dtype=torch.float64), rtol=1e-10, atol=1e-12)


def test_beta_endpoints_are_the_two_kls():
    s, t = _logits()
    ls, lt = F.log_softmax(s, -1), F.log_softmax(t, -1)
    fwd = (lt.exp() * (lt - ls)).sum(-1)[MASK].mean()
    rev = (ls.exp() * (ls - lt)).sum(-1)[MASK].mean()
    torch.testing.assert_close(opsd_loss(s, t, MASK, beta=0.0), fwd)
    torch.testing.assert_close(opsd_loss(s, t, MASK, beta=1.0), rev)


def test_official_element_clip_differs_from_token_clip():
    s, t = _logits()
    element = opsd_loss(s, t, MASK, clip=0.05, clip_mode="element")
    token = opsd_loss(s, t, MASK, clip=0.05, clip_mode="token")
    assert token <= 0.05 + 1e-12
    assert not torch.allclose(element, token)


def test_teacher_is_detached_and_student_gets_gradient():
    s, t = _logits()
    s.requires_grad_(True)
    t.requires_grad_(True)
    opsd_loss(s, t, MASK, clip=0.5).backward()
    assert t.grad is None and s.grad.abs().sum() > 0


def test_gradcheck_mixture():
    s, t = _logits(B=1, T=3, V=5)
    s.requires_grad_(True)
    mask = torch.tensor([[True, True, False]])
    assert torch.autograd.gradcheck(lambda x: opsd_loss(x, t, mask, beta=0.5, clip=None), (s,))


def test_empty_mask_gives_zero():
    s, t = _logits()
    s.requires_grad_(True)
    loss = opsd_loss(s, t, torch.zeros(2, 5, dtype=torch.bool))
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(s.grad, torch.zeros_like(s))


def test_identical_distributions_give_zero():
    s, _ = _logits()
    for beta in (0.0, 0.5, 1.0):
        assert opsd_loss(s, s.clone(), MASK, beta=beta).abs().item() < 1e-12


def test_bf16_logits_are_computed_in_fp32():
    s, t = _logits()
    ref = opsd_loss(s, t, MASK, clip=0.05)
    got = opsd_loss(s.bfloat16(), t.bfloat16(), MASK, clip=0.05)
    assert got.dtype == torch.float32
    assert abs(got.double() - ref).item() / ref.item() < 3e-2
