"""``packed_attention='varlen'`` (``models/varlen.py``): PyTorch's varlen flash attention, one call per layer.

On CPU: the call built for the installed ``varlen_attn`` and for torch 2.11's and 2.10's signatures (plain functions
of those signatures, inspected as the installed one is) binds to that signature and asks causal attention, GQA and
the scale the way each takes them; what none can do (dropout, float32, a scale torch 2.10 cannot take, a CPU
tensor, a torch without it) is one line naming the setting. On a GPU (``pytest -m gpu``): varlen's output and
gradients equal the per-sequence SDPA calls' (bf16, Qwen3-1.7B's 16 / 8 heads of 128, lengths 1 to a few hundred),
and a packed model forward with it gives the padded forward's logits.
"""

import inspect
import math

import pytest
import torch
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType

from phf_megatron.models import varlen
from phf_megatron.models.attention import SDPACoreAttention
from phf_megatron.models.config import qwen3_transformer_config
from phf_megatron.models.varlen import VarlenCall, varlen_call, varlen_parameters

from ..helpers.tiny_qwen3 import tiny_config


def varlen_attn_2_10(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
    """torch 2.10's ``torch.nn.attention.varlen.varlen_attn`` signature (its first), body left out."""


def varlen_attn_2_11(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                     window_size=(-1, -1)):
    """torch 2.11's (the GPU image's; read in its wheel): a scale and a window, no ``enable_gqa``; body left out."""


INSTALLED = inspect.signature(varlen._varlen_attn()) if varlen._varlen_attn() else None
needs_varlen = pytest.mark.skipif(INSTALLED is None, reason=f"torch {torch.__version__} has no varlen_attn")
OLD = inspect.signature(varlen_attn_2_10)
GPU_IMAGE = inspect.signature(varlen_attn_2_11)
SIGNATURES = dict(argvalues=[INSTALLED, GPU_IMAGE, OLD], ids=["installed", "2.11", "2.10"])
D = 128
SCALE = 1 / math.sqrt(D)


def _binds(signature, call: VarlenCall) -> dict:
    """The arguments ``signature`` receives for ``call`` (a TypeError if it takes them not)."""
    args = signature.bind("q", "k", "v", "cu", "cu", 7, 7, **call.kwargs)
    args.apply_defaults()
    return dict(args.arguments)


@needs_varlen
def test_installed_signature_gets_causal_window_gqa_and_scale():
    assert frozenset(INSTALLED.parameters) == varlen_parameters()   # what the model reads is the installed one
    call = varlen_call(INSTALLED.parameters, 16, 8, D, SCALE)
    args = _binds(INSTALLED, call)
    gqa = "enable_gqa" in INSTALLED.parameters   # torch 2.13's; 2.11 (the GPU image's) repeats the K/V heads
    assert args["window_size"] == (-1, 0) and args["scale"] == SCALE and args.get("enable_gqa") is (gqa or None)
    assert call.repeat_kv == (1 if gqa else 2)
    mha = _binds(INSTALLED, varlen_call(INSTALLED.parameters, 8, 8, D, 0.5))
    assert mha.get("enable_gqa", False) is False and mha["scale"] == 0.5 and mha["window_size"] == (-1, 0)


def test_torch_2_11_signature_gets_the_causal_window_the_scale_and_repeated_kv_heads():
    call = varlen_call(GPU_IMAGE.parameters, 16, 8, D, 0.5)
    args = _binds(GPU_IMAGE, call)
    assert args["window_size"] == (-1, 0) and args["scale"] == 0.5 and "enable_gqa" not in call.kwargs
    assert call.repeat_kv == 2   # no enable_gqa: each K/V head repeated for its 2 query heads
    assert varlen_call(GPU_IMAGE.parameters, 16, 16, D, SCALE).repeat_kv == 1


def test_torch_2_10_signature_gets_is_causal_and_repeated_kv_heads():
    call = varlen_call(OLD.parameters, 16, 8, D, SCALE)
    args = _binds(OLD, call)
    assert args["is_causal"] is True
    assert call.repeat_kv == 2   # no enable_gqa: each K/V head repeated for its 2 query heads
    assert varlen_call(OLD.parameters, 16, 16, D, SCALE).repeat_kv == 1


def test_torch_2_10_refuses_a_scale_it_cannot_take_in_one_line():
    with pytest.raises(ValueError) as err:
        varlen_call(OLD.parameters, 16, 8, D, 0.5)
    assert str(err.value) == ("packed_attention: this torch's varlen_attn takes no softmax scale (always "
                              "1/sqrt(128)), the model's is 0.5: use 'sdpa'")


@pytest.mark.parametrize("signature", **SIGNATURES)
def test_attention_dropout_is_refused_in_one_line(signature):
    if signature is None:
        pytest.skip(f"torch {torch.__version__} has no varlen_attn")
    with pytest.raises(ValueError, match=r"^packed_attention: 'varlen' has no attention dropout \(attention_dropout="
                                         r"0\.1\): use 'sdpa' or turn the dropout off$"):
        varlen_call(signature.parameters, 16, 8, D, SCALE, dropout_p=0.1)


@pytest.mark.parametrize("signature", **SIGNATURES)
def test_a_dtype_flash_does_not_take_is_refused_in_one_line(signature):
    if signature is None:
        pytest.skip(f"torch {torch.__version__} has no varlen_attn")
    with pytest.raises(ValueError) as err:
        varlen_call(signature.parameters, 16, 8, D, SCALE, dtype=torch.float32)
    assert str(err.value) == ("packed_attention: 'varlen' runs PyTorch's flash attention, which takes bfloat16 or "
                              "float16, and the model's dtype is float32: use bfloat16, or 'sdpa'")
    for dtype in (torch.bfloat16, torch.float16):
        varlen_call(signature.parameters, 16, 8, D, SCALE, dtype=dtype)


def _config(dtype=torch.bfloat16, **kw):
    return qwen3_transformer_config(tiny_config("gqa", num_layers=2), dtype=dtype, **kw)


@needs_varlen
def test_the_model_refuses_varlen_with_attention_dropout_or_in_float32_as_it_is_built():
    config = _config(packed_attention="varlen", attention_dropout=0.1)
    with pytest.raises(ValueError, match="^packed_attention: 'varlen' has no attention dropout"):
        SDPACoreAttention(config, layer_number=1, attn_mask_type=AttnMaskType.causal)
    with pytest.raises(ValueError, match=r"^packed_attention: 'varlen' runs PyTorch's flash attention, which takes "
                                         r"bfloat16 or float16, and the model's dtype is float32: use bfloat16"):
        SDPACoreAttention(_config(torch.float32, packed_attention="varlen"), layer_number=1,
                          attn_mask_type=AttnMaskType.causal)
    with pytest.raises(ValueError, match=r"^packed_attention: 'Varlen' is not one of \('sdpa', 'varlen'\)$"):
        SDPACoreAttention(_config(packed_attention="Varlen"), layer_number=1, attn_mask_type=AttnMaskType.causal)


def test_a_torch_without_varlen_attn_is_one_line(monkeypatch):
    monkeypatch.setattr(varlen, "_varlen_attn", lambda: None)
    varlen.varlen_parameters.cache_clear()
    try:
        reason = varlen.varlen_unavailable()
        with pytest.raises(ValueError) as err:
            SDPACoreAttention(_config(packed_attention="varlen"), layer_number=1, attn_mask_type=AttnMaskType.causal)
    finally:
        varlen.varlen_parameters.cache_clear()
    assert reason == str(err.value) == (f"packed_attention: 'varlen' needs torch.nn.attention.varlen.varlen_attn, "
                                        f"which torch {torch.__version__} has not: use 'sdpa'")


@needs_varlen
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU refusal")
def test_on_cpu_varlen_is_refused_in_one_line_not_run():
    assert varlen.varlen_unavailable() == ("packed_attention: 'varlen' runs on CUDA only (PyTorch's varlen_attn) "
                                           "and no CUDA device is visible: use 'sdpa'")
    attend = SDPACoreAttention(_config(packed_attention="varlen"), layer_number=1, attn_mask_type=AttnMaskType.causal)
    q, kv = torch.randn(12, 4, 32), torch.randn(12, 2, 32)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=7, max_seqlen_kv=7)
    with pytest.raises(ValueError, match=r"^packed_attention: 'varlen' runs on CUDA only \(PyTorch's varlen_attn\), "
                                         r"the tensors are on cpu: use 'sdpa'$"):
        attend(q, kv, kv, None, packed_seq_params=params)


@needs_varlen
def test_varlen_takes_the_params_own_bounds_without_reading_them_to_the_host(monkeypatch):
    from phf_megatron.models import attention

    calls = []
    monkeypatch.setattr(attention, "varlen_attend", lambda call, q, k, v, cu, longest: calls.append((cu, longest)) or q)
    for read in ("tolist", "item", "__bool__", "__int__"):   # what a host read of the bounds goes through
        monkeypatch.setattr(torch.Tensor, read, lambda *a, **k: pytest.fail("a host read of the packed bounds"))
    attend = SDPACoreAttention(_config(packed_attention="varlen"), layer_number=1, attn_mask_type=AttnMaskType.causal)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=7, max_seqlen_kv=7)
    q, kv = torch.randn(12, 4, 32), torch.randn(12, 2, 32)
    for _ in range(2):   # two layers
        assert attend(q, kv, kv, None, packed_seq_params=params).shape == (12, 1, 4 * 32)
    assert [(c is cu, longest) for c, longest in calls] == [(True, 7), (True, 7)]   # no copy, no rebuilt bounds
    with pytest.raises(ValueError, match=r"^packed_seq_params.max_seqlen_q: 'varlen' needs the longest packed "):
        attend(q, kv, kv, None, packed_seq_params=PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu))


# ----------------------------------------------------------------------------- on a GPU

LENGTHS = [1, 300, 7, 1, 513, 64, 2]


def _bf16_close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Within bf16 rounding of two kernels' (flash, other tile orders): 2 % of the tensor's largest magnitude."""
    err = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
    assert err <= 2e-2, (what, err)


@pytest.mark.gpu
def test_varlen_output_and_gradients_equal_the_per_sequence_sdpa_calls():
    torch.manual_seed(0)
    overrides = dict(num_attention_heads=16, num_key_value_heads=8, head_dim=D)
    config = lambda packed: qwen3_transformer_config(tiny_config("gqa", num_layers=2, **overrides),  # noqa: E731
                                                     dtype=torch.bfloat16, packed_attention=packed)
    t = sum(LENGTHS)
    cu = torch.tensor([0, *LENGTHS], device="cuda").cumsum(0).to(torch.int32)
    params = lambda: PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu,  # noqa: E731
                                     max_seqlen_q=max(LENGTHS), max_seqlen_kv=max(LENGTHS))
    q = torch.randn(t, 16, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(t, 8, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    grad_out = torch.randn(t, 1, 16 * D, device="cuda", dtype=torch.bfloat16)
    results = {}
    for packed in ("sdpa", "varlen"):
        attend = SDPACoreAttention(config(packed), layer_number=1, attn_mask_type=AttnMaskType.causal).train()
        assert (attend.varlen is not None) == (packed == "varlen")
        inputs = [x.clone().requires_grad_(True) for x in (q, k, v)]
        out = attend(*inputs, None, packed_seq_params=params())
        out.backward(grad_out)
        results[packed] = (out, *(x.grad for x in inputs))
    for what, got, want in zip(("out", "dq", "dk", "dv"), results["varlen"], results["sdpa"]):
        _bf16_close(got, want, what)


@pytest.mark.gpu
def test_a_packed_model_forward_with_varlen_gives_the_padded_logits():
    from phf_megatron.convert.live_model import load_hf_weights
    from phf_megatron.models import build_qwen3_model
    from phf_megatron.models.qwen3_arch import Qwen3Arch
    from phf_megatron.parallel.layout import SequenceLayout
    from phf_megatron.runtime.megatron_session import megatron_session

    from ..helpers.tiny_qwen3 import tiny_hf_model

    hf = tiny_hf_model("gqa")
    lengths = torch.tensor([1, 37, 5, 90, 2])
    tokens = torch.randint(0, 256, (len(lengths), int(lengths.max())), generator=torch.Generator().manual_seed(0))
    logits = {}
    with megatron_session(1, 1):
        for packed in ("sdpa", "varlen"):
            model = build_qwen3_model(hf.config, dtype=torch.bfloat16, backend="local", packed_attention=packed)
            load_hf_weights(model, hf.state_dict().__getitem__, Qwen3Arch.from_hf(hf.config))
            model.cuda().eval()
            with torch.no_grad():
                for name, layout in (("padded", SequenceLayout.pad(tokens, lengths)),
                                     ("packed", SequenceLayout.pack(tokens, lengths)),
                                     # 135 tokens and a pad segment of 1 (tensor parallelism's multiple)
                                     ("packed_pad", SequenceLayout.pack(tokens, lengths, pad_multiple=8))):
                    layout = layout.to("cuda")
                    out = model(layout.tokens, **layout.forward_kwargs())
                    logits[packed, name] = layout.take(out.float())   # [B, max L], per sample
    keep = torch.arange(int(lengths.max()))[None] < lengths[:, None]
    padded = logits["sdpa", "padded"][keep.cuda()]
    _bf16_close(logits["varlen", "packed"][keep.cuda()], padded, "varlen packed vs padded")
    _bf16_close(logits["varlen", "packed_pad"][keep.cuda()], padded, "varlen packed with a pad segment vs padded")
    # as close as the per-sequence SDPA calls' packed forward (the same bf16 model, other kernels and GEMM shapes)
    err = lambda x: (x[keep.cuda()] - padded).abs().max().item()  # noqa: E731
    assert err(logits["varlen", "packed"]) <= 2 * err(logits["sdpa", "packed"]) + 1e-2 * padded.abs().max().item()
