"""The fast-path kernels against their eager definitions (no process group).

* the chunked linear cross entropy (``lm_head._ChunkedLinearCrossEntropy``, one TP rank):
  loss and gradients equal ``F.cross_entropy`` on full logits (float64, 1e-12), for chunk sizes that
  do and do not divide the token count;
  both the vocabulary-parallel path and the fused single-rank chunk (eager here);
* the compiled RMSNorm and RoPE (``aot_eager`` on CPU: the same dynamo guards and autograd) equal the
  eager formulas in float64, forward and backward, for the layouts the trainer calls them with, and
  compile a fixed handful of graphs however lengths, batch, heads and grad mode vary;
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


def _layouts():
    """(x, rope input, freqs): padded [s, b, h] / [s, b, n, d] and a packed row (b = 1), several lengths."""
    g = torch.Generator().manual_seed(0)
    for s, b, n in ((37, 4, 4), (101, 1, 4), (53, 4, 2), (64, 1, 2), (29, 2, 4)):
        yield (torch.randn(s, b, 24, dtype=torch.float64, generator=g), torch.randn(s, b, n, 8, dtype=torch.float64, generator=g),
               torch.rand(s, 1, 1, 8, dtype=torch.float64, generator=g) * 10)


@pytest.fixture
def aot_eager():
    torch._dynamo.reset()
    fused.set_compile_backend("aot_eager")
    yield
    fused.set_compile_backend("inductor")
    torch._dynamo.reset()


@pytest.mark.parametrize("weight_grad", [True, False], ids=["full", "frozen_weight"])
def test_compiled_rmsnorm_and_rope_equal_eager_forward_and_backward(aot_eager, weight_grad):
    """RoPE in float64 to 1e-12; the norm keeps its statistics in float32 by definition (HF Qwen3), so it
    is compared in float32, to a few rounding steps (its own reduction layout)."""
    from phf_megatron.models.norm import rms_norm

    for x, q, freqs in _layouts():
        for inp, w in ((x.float(), torch.linspace(0.5, 1.5, 24)), (q.float(), torch.linspace(0.9, 1.1, 8))):
            a, wa = inp.clone().requires_grad_(), w.clone().requires_grad_(weight_grad)
            b, wb = inp.clone().requires_grad_(), w.clone().requires_grad_(weight_grad)
            want, got = rms_norm(a, wa, 1e-6), fused.compiled_rms_norm(b, wb, 1e-6)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
            dy = torch.randn_like(want)
            wants = torch.autograd.grad(want, [a, wa] if weight_grad else [a], dy)
            gots = torch.autograd.grad(got, [b, wb] if weight_grad else [b], dy)
            assert len(gots) == len(wants)
            for u, v in zip(gots, wants):
                torch.testing.assert_close(u, v, rtol=1e-5, atol=1e-5)
        a, b = q.clone().requires_grad_(), q.clone().requires_grad_()
        want, got = fused._rope(a, freqs), fused.fused_rope_bshd(b, freqs)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        dy = torch.randn_like(want)
        torch.testing.assert_close(torch.autograd.grad(got, b, dy)[0], torch.autograd.grad(want, a, dy)[0],
                                   rtol=1e-12, atol=1e-12)


def test_compiled_kernels_compile_a_fixed_handful_of_graphs(aot_eager):
    """The trainer calls the norm with [s, b, h] and [s, b, n, d], padded (b = micro-batch) and packed (b = 1),
    a new length every micro-batch, grad on (student) and off (teacher), inputs with and without
    requires_grad. Before: every variant was a graph, dynamo's limit (8) was hit in the first training step
    on the H100 and the kernels fell back to eager. Now: one graph per hidden size, kernel and direction."""
    from types import SimpleNamespace

    from torch._dynamo.utils import counters

    norm = fused.rmsnorm_fn(SimpleNamespace(fused_rmsnorm=True))   # what models/norm.RMSNorm calls

    def rounds(k):
        for x, q, freqs in _layouts():
            x, q, freqs = x.float(), q.float(), freqs.float()
            for grad, needs in ((False, False), (True, True), (True, False)):
                with torch.set_grad_enabled(grad):
                    xs = (x[: len(x) - k].clone().requires_grad_(needs), q[: len(q) - k].clone().requires_grad_(needs))
                    outs = [norm(xs[0], torch.ones(24), 1e-6), norm(xs[1], torch.ones(8), 1e-6),
                            fused.fused_rope_bshd(xs[1], freqs[: len(q) - k])]
                    cu = torch.tensor([0, 5, xs[1].shape[0] * xs[1].shape[1]])
                    outs.append(fused.fused_rope_thd(xs[1].flatten(0, 1), cu, freqs.expand(-1, xs[1].shape[1], 1, 8).flatten(0, 1)[:, None]))
                    if needs:
                        torch.autograd.grad(sum(o.sum() for o in outs), xs)

    start = counters["stats"]["unique_graphs"]
    rounds(0)
    first = counters["stats"]["unique_graphs"]
    rounds(3)   # every length new
    assert counters["stats"]["unique_graphs"] == first
    # forward: the norm at two hidden sizes, RoPE; backward: the same three
    assert first - start <= 6, first - start


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
    for eager, compiled, args in ((fused.rms_norm, fused.compiled_rms_norm, (x, w, 1e-6)),
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
