"""The fast-path kernels against their eager definitions (no process group).

* the chunked linear cross entropy (``lm_head._ChunkedLinearCrossEntropy``, one TP rank):
  loss and gradients equal ``F.cross_entropy`` on full logits (float64, 1e-12), for chunk sizes that
  do and do not divide the token count;
  both the vocabulary-parallel path and the fused single-rank chunk (eager here);
* on a GPU: the inductor-compiled RMSNorm and RoPE equal the eager formulas (fp32 to 1e-5,
  bf16 to one rounding step), forward and backward.
"""

import pytest
import torch
import torch.nn.functional as F

from phf_megatron.models import fused
from phf_megatron.models.lm_head import _ChunkedLinearCrossEntropy


@pytest.mark.parametrize("chunk", [3, 7, 64])
@pytest.mark.parametrize("chunk_fn", [None, fused._cross_entropy_chunk], ids=["vocab_parallel", "fused_chunk"])
def test_chunked_cross_entropy_equals_full_logits(chunk, chunk_fn):
    g = torch.Generator().manual_seed(0)
    n, h, v = 13, 16, 40
    hidden = torch.randn(n, h, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(v, h, dtype=torch.float64, generator=g, requires_grad=True)
    labels = torch.randint(0, v, (n,), generator=g)
    w = torch.rand(n, dtype=torch.float64, generator=g)
    w[4] = 0.0
    ref = (F.cross_entropy(hidden @ weight.t(), labels, reduction="none") * w).sum()
    ref_grads = torch.autograd.grad(3.0 * ref, (hidden, weight))
    got = _ChunkedLinearCrossEntropy.apply(hidden, weight, labels, w, None, chunk, chunk_fn)
    got_grads = torch.autograd.grad(3.0 * got, (hidden, weight))
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=0)
    for a, b in zip(got_grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_rmsnorm_and_rope_equal_eager_on_gpu(dtype):
    fused.set_compile_backend("inductor")
    x = torch.randn(64, 2, 4, 128, device="cuda", dtype=dtype, requires_grad=True)
    w = (1 + 0.1 * torch.randn(128, device="cuda")).to(dtype).requires_grad_()
    freqs = torch.rand(64, 1, 1, 128, device="cuda") * 10
    # fp32: compiled == eager to rounding. bf16: both are compared with the fp32 evaluation of the
    # same inputs by relative norm error (a bf16 reduction, e.g. the norm-weight gradient summed
    # over 512 rows, differs element-wise between any two bf16 implementations).
    for eager, compiled, args in ((fused._rms_norm, fused._compiled("rms_norm"), (x, w, 1e-6)),
                                  (fused._rope, fused.fused_rope_bshd, (x, freqs))):
        inputs = [a for a in args if torch.is_tensor(a) and a.requires_grad]
        got = compiled(*args)
        grad = torch.randn_like(got)
        got_grads = torch.autograd.grad(got, inputs, grad)
        if dtype == torch.float32:
            want = eager(*args)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            for a, b in zip(got_grads, torch.autograd.grad(want, inputs, grad)):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
            continue
        args32 = [a.detach().float().requires_grad_(a.requires_grad) if torch.is_tensor(a) else a for a in args]
        ref = eager(*args32)
        ref_grads = torch.autograd.grad(ref, [a for a in args32 if torch.is_tensor(a) and a.requires_grad], grad.float())
        for a, b in zip((got, *got_grads), (ref, *ref_grads)):
            assert float((a.float() - b).norm() / b.norm()) <= 1e-2


@pytest.mark.gpu
def test_compiled_cross_entropy_chunk_equals_eager_on_gpu():
    fused.set_compile_backend("inductor")
    logits = torch.randn(96, 1000, device="cuda", dtype=torch.bfloat16)
    labels = torch.randint(0, 1000, (96,), device="cuda")
    weights = torch.rand(96, device="cuda")
    want_loss, want_grad = fused._cross_entropy_chunk(logits, labels, weights)
    got_loss, got_grad = fused._compiled("cross_entropy_chunk")(logits, labels, weights)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_grad, want_grad, rtol=1.6e-2, atol=1e-4)
