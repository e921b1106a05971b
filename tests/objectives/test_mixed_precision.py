"""bf16 inputs, as a bf16 run hands them to the losses: computed in float32, equal to float64 on the same inputs.

The references run the same equations in float64 on the bf16 values themselves, so what is left is the
float32 arithmetic (about 1e-5 relative here); a loss computed in bf16 would be off by 1e-3 or more (its
2^-9 rounding at every step). Shapes as the GPU runs them, scaled down for a CPU: hidden 1024 with a few
large-magnitude dimensions (Qwen3's residual stream), windows of 32 positions; peaked logits up to ~25
over 4096 entries at the rollout temperature 1.1 with the paper's element clip 0.05.
"""

import pytest
import torch

from phf_megatron.objectives.flow import FLOW_VARIANTS, LayerPlan, flow_terms, layer_loss
from phf_megatron.objectives.opsd import opsd_token_divergence

TERMS = ("direction", "geometry", "adjacent", "pointwise")


def _rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.detach().double() - ref.detach()).abs().max() / ref.detach().abs().max())


def _hidden_states(L=3, B=2, m=32, H=1024, seed=0):
    g = torch.Generator().manual_seed(seed)
    offset = torch.randn(L, B, 1, H, generator=g, dtype=torch.float64)
    offset[..., :4] *= 100.0  # a few massive dimensions: |h| ~ 200, bf16 spacing 1 there
    student = offset + torch.randn(L, B, m, H, generator=g, dtype=torch.float64)
    teacher = student + 0.3 * torch.randn(L, B, m, H, generator=g, dtype=torch.float64)
    valid = torch.arange(m)[None] < torch.tensor([m, m // 2])[:, None]
    return student.bfloat16(), teacher.bfloat16(), valid


@pytest.mark.parametrize("variant", FLOW_VARIANTS)
def test_flow_terms_of_bf16_states_equal_float64_on_the_same_states(variant):
    student, teacher, valid = _hidden_states()
    plan = LayerPlan.build(student.shape[0], variant)
    s16, s64 = student.clone().requires_grad_(), student.double().requires_grad_()
    got = flow_terms(s16, teacher, valid, plan, variant)
    ref = flow_terms(s64, teacher.double(), valid, plan, variant)
    for name in TERMS:
        if getattr(ref, name) is not None:
            assert getattr(got, name).dtype == torch.float32, name
            assert _rel(getattr(got, name), getattr(ref, name)) < 1e-4, (name, _rel(getattr(got, name), getattr(ref, name)))
    (g16,) = torch.autograd.grad(layer_loss(got, variant).sum(), s16)
    (g64,) = torch.autograd.grad(layer_loss(ref, variant).sum(), s64)
    assert g16.dtype == torch.bfloat16
    assert _rel(g16, g64) < 2 ** -7  # the gradient's own rounding to bf16 (2^-9 relative), nothing more


def _logits(B=2, T=16, V=4096, seed=0):
    g = torch.Generator().manual_seed(seed)
    student = 3.0 * torch.randn(B, T, V, generator=g, dtype=torch.float64)
    student[..., :20] += 12.0  # peaked: a few likely entries
    teacher = student + 0.5 * torch.randn(B, T, V, generator=g, dtype=torch.float64)
    return student.bfloat16(), teacher.bfloat16()


@pytest.mark.parametrize("beta,clip,mode", [(0.5, 0.05, "element"), (0.5, None, "element"), (0.0, 0.05, "element"),
                                            (1.0, 0.5, "token")])
def test_clipped_jsd_of_bf16_logits_equals_float64_on_the_same_logits(beta, clip, mode):
    student, teacher = _logits()
    s16, s64 = student.clone().requires_grad_(), student.double().requires_grad_()
    got = opsd_token_divergence(s16, teacher, beta, 1.1, clip, mode)
    ref = opsd_token_divergence(s64, teacher.double(), beta, 1.1, clip, mode)
    assert got.dtype == torch.float32
    assert _rel(got, ref) < 1e-4, _rel(got, ref)
    (g16,) = torch.autograd.grad(got.sum(), s16)
    (g64,) = torch.autograd.grad(ref.sum(), s64)
    assert g16.dtype == torch.bfloat16
    assert _rel(g16, g64) < 2 ** -7
