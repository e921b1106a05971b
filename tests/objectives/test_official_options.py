"""The official OPSD loss options against a transcription of the official code (float64):
``--top_k_loss`` (teacher top-k, both renormalized), ``--use_tinker_loss`` (sampled-token loss),
and the clip statistics behind the clip diagnostics."""

import pytest
import torch

from phf_megatron.objectives import (
    ObjectiveConfig,
    clip_statistics,
    generalized_jsd_terms,
    opsd_loss,
    sampled_token_loss,
    top_k_indices,
)
from phf_megatron.objectives.opsd import log_probs

from .official_opsd import official_jsd, official_tinker

B, T, V = 3, 6, 29


def _case(seed=0):
    g = torch.Generator().manual_seed(seed)
    zs = (3 * torch.randn(B, T, V, generator=g, dtype=torch.float64)).requires_grad_()
    zt = 3 * torch.randn(B, T, V, generator=g, dtype=torch.float64)
    mask = torch.rand(B, T, generator=g) > 0.3
    labels = torch.where(mask, torch.randint(0, V, (B, T), generator=g), torch.full((B, T), -100))
    tokens = torch.randint(0, V, (B, T), generator=g)
    return zs, zt, mask, labels, tokens


@pytest.mark.parametrize("k", [1, 5, V])
@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("clip", [None, 0.02])
def test_top_k_loss_equals_the_official_values_and_gradient(k, beta, clip):
    zs, zt, mask, labels, _ = _case()
    ours = opsd_loss(zs, zt, mask, beta, 1.1, clip, "element", top_k=k)
    (g_ours,) = torch.autograd.grad(ours, zs)
    ref = official_jsd(zs, zt, labels, beta, 1.1, top_k=k, token_clip=clip)
    (g_ref,) = torch.autograd.grad(ref, zs)
    torch.testing.assert_close(ours, ref, rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(g_ours, g_ref, rtol=1e-12, atol=1e-15)
    if k < V:  # the gradient reaches the teacher's top-k entries only
        outside = torch.ones_like(zs, dtype=torch.bool).scatter(-1, zt.topk(k, -1).indices, False)
        assert g_ours[outside].abs().max() == 0
    assert (g_ours.abs().max() > 0) == (k > 1)  # one renormalized entry is a point mass on both sides: no loss


def test_top_k_of_the_whole_vocabulary_is_the_full_loss():
    zs, zt, mask, *_ = _case(1)
    torch.testing.assert_close(opsd_loss(zs, zt, mask, top_k=V, clip=0.05), opsd_loss(zs, zt, mask, clip=0.05),
                               rtol=1e-14, atol=0)


def test_top_k_ties_go_to_the_lower_vocabulary_index():
    g = torch.Generator().manual_seed(2)
    x = torch.randint(0, 4, (50, 17), generator=g).double()  # many ties at every k-th value
    for k in (1, 3, 8, 17):
        got = top_k_indices(x, k)
        for row, picked in zip(x.tolist(), got.tolist()):
            expected = sorted(range(len(row)), key=lambda v: (-row[v], v))[:k]
            assert picked == sorted(expected)


def test_tinker_loss_equals_the_official_values_and_gradient():
    zs, zt, mask, labels, tokens = _case(3)
    ours = sampled_token_loss(zs, zt, tokens, mask, temperature=1.1)
    (g_ours,) = torch.autograd.grad(ours, zs)
    ref = official_tinker(zs, zt, tokens, labels, temperature=1.1)
    (g_ref,) = torch.autograd.grad(ref, zs)
    torch.testing.assert_close(ours, ref, rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(g_ours, g_ref, rtol=1e-12, atol=1e-15)
    # the policy-gradient form: dL/dz = -A (onehot(y) - p) / tau / N on the scored tokens
    a = log_probs(zs.detach(), 1.1)
    b = log_probs(zt, 1.1)
    adv = (b - a).gather(-1, tokens[..., None])
    expected = -adv * (torch.nn.functional.one_hot(tokens, V) - a.exp()) / 1.1 / mask.sum()
    torch.testing.assert_close(g_ours, torch.where(mask[..., None], expected, 0.0), rtol=1e-12, atol=1e-15)


def test_clip_statistics_count_what_the_clamp_changes():
    zs, zt, mask, *_ = _case(4)
    terms = generalized_jsd_terms(log_probs(zs.detach(), 1.1), log_probs(zt, 1.1), 0.5)
    raw, cut = clip_statistics(terms, 0.02, "element")
    torch.testing.assert_close(raw, terms.sum(-1), rtol=0, atol=0)
    assert torch.equal(cut, (terms.clamp(max=0.02) != terms).sum(-1).double())
    assert 0 < cut.sum() < terms.numel()  # the case really clips, and not everything
    raw_t, cut_t = clip_statistics(terms, 0.3, "token")
    assert torch.equal(cut_t, (raw_t > 0.3).double()) and 0 < cut_t.sum() < cut_t.numel()
    assert clip_statistics(terms, None)[1].abs().sum() == 0


@pytest.mark.parametrize("kwargs,match", [
    (dict(top_k_loss=0), "top_k_loss: must be >= 1"),
    (dict(use_tinker_loss=True, top_k_loss=5, jsd_clip=None), "top_k_loss: the sampled-token loss"),
    (dict(use_tinker_loss=True), "jsd_clip: the sampled-token loss"),
])
def test_invalid_option_combinations_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ObjectiveConfig(**kwargs)
    assert ObjectiveConfig(use_tinker_loss=True, jsd_clip=None).use_tinker_loss


def test_top_k_outside_the_vocabulary_is_refused():
    zs, zt, mask, *_ = _case()
    with pytest.raises(ValueError, match="top_k: must lie in"):
        opsd_loss(zs, zt, mask, top_k=V + 1)
