"""The vocabulary-parallel clipped JSD equals the reference ``objectives.opsd_token_divergence``.

Single process here (float64, exact to ~1e-13): every beta branch (forward KL, reverse KL,
mixture), no clip / element clip (the official one) / token clip, token chunks smaller than the
batch, gradient by autograd of the reference. The vocabulary split over TP=2 ranks is checked
in the TP=2 spawn of ``test_phf_step.py``.
"""

import pytest
import torch

from phf_megatron.objectives.opsd import opsd_token_divergence
from phf_megatron.parallel.vocab_parallel_jsd import chunk_rows, vocab_parallel_jsd

CASES = [(beta, clip, mode) for beta in (0.0, 0.5, 1.0, 0.3)
         for clip, mode in ((None, "element"), (0.02, "element"), (0.5, "token"))]


def _case(seed=0, dtype=torch.float64, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    zs = (scale * torch.randn(3, 7, 41, generator=g, dtype=dtype)).requires_grad_()
    zt = scale * torch.randn(3, 7, 41, generator=g, dtype=dtype)
    mask = torch.rand(3, 7, generator=g) > 0.3
    return zs, zt, mask, torch.nonzero(mask.flatten()).flatten()


@pytest.mark.parametrize("beta,clip,mode", CASES)
def test_equals_reference_values_and_gradient(beta, clip, mode):
    zs, zt, mask, idx = _case()
    weights = torch.linspace(0.5, 1.5, len(idx), dtype=zs.dtype)
    ref = opsd_token_divergence(zs, zt, beta, 1.1, clip, mode)[mask]
    (grad_ref,) = torch.autograd.grad((ref * weights).sum(), zs)
    out = vocab_parallel_jsd(zs, zt.reshape(-1, 41)[idx], idx, beta, 1.1, clip, mode, chunk_elements=100)
    (grad,) = torch.autograd.grad((out * weights).sum(), zs)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad, grad_ref, rtol=1e-10, atol=1e-14)


def test_clip_is_active_in_the_cases():
    """The clip cases really clip: some summands / tokens above the cap (else they test nothing)."""
    zs, zt, mask, _ = _case()
    unclipped = opsd_token_divergence(zs, zt, 0.5, 1.1, None)[mask]
    assert 0 < (unclipped > 0.17).sum() < len(unclipped)
    element_clipped = opsd_token_divergence(zs, zt, 0.5, 1.1, 0.02)[mask]
    assert (element_clipped < unclipped).any()


def test_float32_within_rounding_and_bf16_logits_accepted():
    zs, zt, mask, idx = _case(dtype=torch.float32, scale=3.0)
    ref = opsd_token_divergence(zs.double(), zt.double(), 0.5, 1.1, 0.05)[mask]
    out = vocab_parallel_jsd(zs, zt.reshape(-1, 41)[idx], idx, 0.5, 1.1, 0.05)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("top_k", [None, 8])
def test_bf16_logits_are_float32_math_on_their_values(top_k):
    """bf16 logits (a bf16 run's): values equal float64 on the same bf16 logits to float32 rounding
    (measured ~1e-6 at 8192 entries), the gradient to its own bf16 rounding (2^-9); both paths of the
    "torch" backend (whole vocabulary, top-k). A bf16 log-softmax would be off by ~1e-2."""
    zs, zt, mask, idx = _case(dtype=torch.float32, scale=3.0)
    zs16, rows16 = zs.detach().bfloat16().requires_grad_(), zt.bfloat16().reshape(-1, 41)[idx]
    zs64 = zs16.detach().double().requires_grad_()
    out16 = vocab_parallel_jsd(zs16, rows16, idx, 0.5, 1.1, 0.05, backend="torch", top_k=top_k)
    out64 = vocab_parallel_jsd(zs64, rows16.double(), idx, 0.5, 1.1, 0.05, backend="torch", top_k=top_k)
    assert out16.dtype == torch.float32
    torch.testing.assert_close(out16.double(), out64, rtol=1e-5, atol=1e-7)
    (g16,) = torch.autograd.grad(out16.sum(), zs16)
    (g64,) = torch.autograd.grad(out64.sum(), zs64)
    assert g16.dtype == torch.bfloat16
    assert (g16.double() - g64).abs().max() <= 2 ** -8 * g64.abs().max()


def test_only_scored_rows_get_gradient():
    zs, zt, mask, idx = _case()
    out = vocab_parallel_jsd(zs, zt.reshape(-1, 41)[idx], idx, 0.5, 1.0, None)
    (grad,) = torch.autograd.grad(out.sum(), zs)
    assert grad[~mask].abs().max() == 0 and grad[mask].abs().max() > 0


def test_chunk_rows_bounds_the_temporary():
    assert chunk_rows(1000, 151936, 1 << 24) == 110
    assert chunk_rows(5, 100, 1 << 24) == 5 and chunk_rows(5, 10**9, 1) == 1


@pytest.mark.parametrize("kwargs,match", [
    (dict(beta=1.5), "beta"), (dict(temperature=0.0), "temperature"), (dict(clip=-1.0), "clip"),
    (dict(clip_mode="row"), "clip_mode"),
])
def test_bad_options_raise(kwargs, match):
    zs, zt, mask, idx = _case()
    with pytest.raises(ValueError, match=match):
        vocab_parallel_jsd(zs, zt.reshape(-1, 41)[idx], idx, **kwargs)


def test_bad_shapes_raise():
    zs, zt, mask, idx = _case()
    with pytest.raises(ValueError, match="teacher_rows"):
        vocab_parallel_jsd(zs, zt.reshape(-1, 41)[idx][:-1], idx)
    with pytest.raises(ValueError, match="student_index"):
        vocab_parallel_jsd(zs, zt.reshape(-1, 41)[idx], idx.int())
