"""Our two Megatron modules against direct formulas (single process, float64 where compared).

* ``SDPACoreAttention``: causal GQA, an explicit Megatron-convention mask (True = masked),
  packed sequences (block-diagonal causal), all against softmax(QKᵀ·scale + mask)·V with K/V
  repeated per query group;
* ``RMSNorm``: bit-equal to HF's ``Qwen3RMSNorm`` in fp32 and bf16; its weight carries the
  ``sequence_parallel`` flag Megatron reads to all-reduce it.
"""

import math

import pytest
import torch
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType

from phf_megatron.models.attention import SDPACoreAttention
from phf_megatron.models.config import qwen3_transformer_config
from phf_megatron.models.norm import RMSNorm

from ..helpers.tiny_qwen3 import tiny_config


def _config(**kw):
    return qwen3_transformer_config(tiny_config("gqa", num_layers=2), dtype=torch.float64, **kw)


def _reference(q, k, v, keep):
    """q [s, b, n, d], k/v [s, b, g, d], keep [b or 1, 1, s, s] bool -> [s, b, n·d]."""
    rep = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)
    scores = torch.einsum("sbnd,tbnd->bnst", q, k) / math.sqrt(q.shape[-1])
    probs = scores.masked_fill(~keep, float("-inf")).softmax(-1)
    out = torch.einsum("bnst,tbnd->sbnd", probs, v)
    return out.reshape(out.shape[0], out.shape[1], -1)


def _qkv(s, b, heads=4, groups=2, d=32):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(s, b, heads, d, generator=g, dtype=torch.float64),
            torch.randn(s, b, groups, d, generator=g, dtype=torch.float64),
            torch.randn(s, b, groups, d, generator=g, dtype=torch.float64))


def _attention():
    return SDPACoreAttention(_config(), layer_number=1, attn_mask_type=AttnMaskType.causal).eval()


def test_causal_gqa_without_mask():
    q, k, v = _qkv(9, 2)
    causal = torch.ones(9, 9, dtype=torch.bool).tril()[None, None]
    torch.testing.assert_close(_attention()(q, k, v, None), _reference(q, k, v, causal), rtol=1e-12, atol=1e-12)


def test_explicit_mask_uses_megatron_convention():
    q, k, v = _qkv(7, 2)
    keep = torch.ones(2, 1, 7, 7, dtype=torch.bool).tril()
    keep[0, :, :, :2] = False  # sample 0: left padding of 2 (queries still see themselves below)
    keep[0, :, :2, :2] = torch.eye(2, dtype=torch.bool)
    torch.testing.assert_close(_attention()(q, k, v, ~keep), _reference(q, k, v, keep), rtol=1e-12, atol=1e-12)


def test_packed_sequences_attend_within_their_segment():
    q, k, v = _qkv(12, 1)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=7, max_seqlen_kv=7)
    got = _attention()(q[:, 0], k[:, 0], v[:, 0], None, packed_seq_params=params)  # Megatron's [t, n, d]
    for a, b in ((0, 5), (5, 12)):
        causal = torch.ones(b - a, b - a, dtype=torch.bool).tril()[None, None]
        want = _reference(q[a:b], k[a:b], v[a:b], causal)
        torch.testing.assert_close(got[a:b], want, rtol=1e-12, atol=1e-12)


def test_attention_leaves_cudnn_out_packed_and_padded(monkeypatch):
    # cuDNN builds a plan per exact sequence length: each packed sample's and each padded micro-batch's are new
    # every step of on-policy training (H200, torch 2.11: BENCHMARKS.md, issue 23)
    import torch.nn.functional as F

    from phf_megatron.models import attention

    seen, sdpa = [], F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    q, k, v = _qkv(12, 1)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=7, max_seqlen_kv=7)
    _attention()(q[:, 0], k[:, 0], v[:, 0], None, packed_seq_params=params)
    assert seen == [False, False]                   # one call per packed sequence
    assert torch.backends.cuda.cudnn_sdp_enabled()  # restored after the call
    _attention()(q, k, v, None)                     # padded, causal
    keep = torch.ones(1, 1, 12, 12, dtype=torch.bool).tril()
    _attention()(q, k, v, ~keep)                    # padded, a mask
    assert seen == [False] * 4 and torch.backends.cuda.cudnn_sdp_enabled()


#: The ATen op each SDPA kernel runs as (what the profiler records; on CPU flash's ends in ``_for_cpu``).
_KERNEL_OPS = {"flash": "aten::_scaled_dot_product_flash_attention", "math": "aten::_scaled_dot_product_attention_math",
               "memory-efficient": "aten::_scaled_dot_product_efficient_attention"}


@pytest.mark.parametrize("groups, dropout", [(2, 0.0), (4, 0.0), (2, 0.1)])
def test_kernel_in_use_names_the_kernel_that_runs(groups, dropout):
    # the start line's attention kernel: PyTorch's own choice, read from the op that really runs packed and padded,
    # in training (with attention dropout: PyTorch's CPU flash takes none, so math runs)
    from torch.profiler import ProfilerActivity, profile

    from phf_megatron.models.attention import kernel_in_use
    from phf_megatron.runtime.megatron_session import megatron_session

    q, k, v = (t.float() for t in _qkv(12, 1, heads=4, groups=groups))
    name = kernel_in_use(4, groups, 32, torch.float32, torch.device("cpu"), dropout)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=7, max_seqlen_kv=7)
    config = qwen3_transformer_config(tiny_config("gqa", num_layers=2), dtype=torch.float32, attention_dropout=dropout)
    attend = SDPACoreAttention(config, layer_number=1, attn_mask_type=AttnMaskType.causal).train()
    with megatron_session(1, 1), profile(activities=[ProfilerActivity.CPU]) as prof:   # (its RNG tracker: dropout)
        attend(q[:, 0], k[:, 0], v[:, 0], None, packed_seq_params=params)
        attend(q, k, v, None)
    ran = {kernel for kernel, op in _KERNEL_OPS.items() for e in prof.key_averages() if e.key.startswith(op)}
    assert ran == {name}


def test_kernel_in_use_reads_the_allowed_backends(monkeypatch):
    from torch.nn.attention import SDPBackend

    from phf_megatron.models import attention

    assert attention.kernel_in_use(4, 2, 32, torch.float32, torch.device("cpu")) != "math"   # PyTorch's CPU flash
    monkeypatch.setattr(attention, "SDPA_BACKENDS", [SDPBackend.MATH])
    assert attention.kernel_in_use(4, 2, 32, torch.float32, torch.device("cpu")) == "math"


def test_packed_sequences_reject_bad_lengths():
    q, k, v = _qkv(12, 1)
    cu = torch.tensor([0, 5, 10], dtype=torch.int32)
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        _attention()(q, k, v, None, packed_seq_params=params)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_equals_hf_qwen3_rmsnorm(dtype):
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    ours = RMSNorm(_config(), hidden_size=64, eps=1e-6)
    hf = Qwen3RMSNorm(64, eps=1e-6)
    w = 1 + 0.1 * torch.randn(64)
    with torch.no_grad():
        ours.weight.copy_(w)
        hf.weight.copy_(w)
    ours, hf = ours.to(dtype), hf.to(dtype)
    x = torch.randn(5, 3, 64).to(dtype)
    assert torch.equal(ours(x), hf(x))


@pytest.mark.parametrize("sp", [False, True])
def test_rmsnorm_weight_carries_sequence_parallel_flag(sp):
    config = qwen3_transformer_config(tiny_config("gqa"), tp=2, sp=sp, dtype=torch.float32)
    assert RMSNorm(config, hidden_size=64, eps=1e-6).weight.sequence_parallel is sp
