"""The vocabulary-parallel output-loss options equal the reference objectives (single process, float64):
top-k JSD, the sampled token's log-probability, and the clip statistics of every path.

The same pieces with the vocabulary split over TP=2 ranks (ties in the top-k included) are
checked in ``test_output_options_tp.py``.
"""

import pytest
import torch

from phf_megatron.objectives import clip_statistics, generalized_jsd_terms, opsd_token_divergence, token_log_probs
from phf_megatron.objectives.opsd import log_probs, restrict_to_top_k
from phf_megatron.parallel.sampled_token import vocab_parallel_token_logprob
from phf_megatron.parallel.vocab_parallel_jsd import resolve_backend, vocab_parallel_jsd

V = 41


def _case(seed=0):
    g = torch.Generator().manual_seed(seed)
    zs = (2 * torch.randn(3, 7, V, generator=g, dtype=torch.float64)).requires_grad_()
    zt = 2 * torch.randn(3, 7, V, generator=g, dtype=torch.float64)
    mask = torch.rand(3, 7, generator=g) > 0.3
    tokens = torch.randint(0, V, (3, 7), generator=g)
    return zs, zt, mask, mask.flatten().nonzero().flatten(), tokens


def _reference_stats(zs, zt, beta, clip, mode, top_k=None):
    s, t = (restrict_to_top_k(zs.detach(), zt, top_k) if top_k else (zs.detach(), zt))
    return torch.stack(clip_statistics(generalized_jsd_terms(log_probs(s, 1.1), log_probs(t, 1.1), beta), clip, mode))


@pytest.mark.parametrize("top_k", [None, 1, 6, V])
@pytest.mark.parametrize("beta,clip,mode", [(0.5, 0.02, "element"), (0.0, None, "element"), (1.0, "median", "token")])
def test_values_gradient_and_clip_statistics_equal_the_reference(top_k, beta, clip, mode):
    zs, zt, mask, idx, _ = _case()
    if clip == "median":  # halfway between two middle token divergences: about half the tokens cut
        values = opsd_token_divergence(zs.detach(), zt, beta, 1.1, top_k=top_k)[mask].sort().values
        clip = float(values[len(values) // 2 - 1: len(values) // 2 + 1].mean()) or 0.1  # k = 1: all zero
    w = torch.linspace(0.5, 1.5, len(idx), dtype=torch.float64)
    ref = opsd_token_divergence(zs, zt, beta, 1.1, clip, mode, top_k)[mask]
    (g_ref,) = torch.autograd.grad((ref * w).sum(), zs)
    out, stats = vocab_parallel_jsd(zs, zt.reshape(-1, V)[idx], idx, beta, 1.1, clip, mode, chunk_elements=100,
                                    top_k=top_k, return_clip_stats=True)
    (grad,) = torch.autograd.grad((out * w).sum(), zs)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad, g_ref, rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(stats, _reference_stats(zs, zt, beta, clip, mode, top_k)[:, mask], rtol=1e-12,
                               atol=1e-14)
    if clip is not None and top_k != 1:  # the case clips something, not everything
        cells = len(idx) * (top_k or V) if mode == "element" else len(idx)
        assert 0 < stats[1].sum() < cells and (stats[0] > out).any()


def test_top_k_takes_the_eager_path_and_refuses_triton():
    zs, zt, _, idx, _ = _case()
    assert resolve_backend("auto", zs, zt, top_k=4) == "top_k"
    with pytest.raises(ValueError, match="objective.top_k_loss"):
        vocab_parallel_jsd(zs, zt.reshape(-1, V)[idx], idx, top_k=4, backend="triton")
    with pytest.raises(ValueError, match="top_k: must lie in"):
        vocab_parallel_jsd(zs, zt.reshape(-1, V)[idx], idx, top_k=V + 1)


def test_sampled_token_logprob_equals_the_reference():
    zs, zt, mask, idx, tokens = _case(1)
    w = torch.linspace(-1.0, 2.0, len(idx), dtype=torch.float64)
    ref = token_log_probs(zs, tokens, 1.1)[mask]
    (g_ref,) = torch.autograd.grad((ref * w).sum(), zs)
    out = vocab_parallel_token_logprob(zs, idx, tokens[mask], 1.1, chunk_elements=100)
    (grad,) = torch.autograd.grad((out * w).sum(), zs)
    torch.testing.assert_close(out, ref, rtol=1e-13, atol=1e-14)
    torch.testing.assert_close(grad, g_ref, rtol=1e-12, atol=1e-14)
    teacher = vocab_parallel_token_logprob(zt.reshape(-1, V)[idx], torch.arange(len(idx)), tokens[mask], 1.1)
    torch.testing.assert_close(teacher, token_log_probs(zt, tokens, 1.1)[mask], rtol=1e-13, atol=1e-14)
