"""Core attention on ``torch.nn.functional.scaled_dot_product_attention`` for Megatron-Core.

A drop-in ``core_attention`` for Megatron's ``SelfAttention`` when Transformer Engine is absent:
PyTorch picks its flash / memory-efficient / math kernel (``kernel_in_use`` names the one it takes),
instead of Megatron's local ``DotProductAttention`` that materialises [b, n, s, s] scores.

Layout (Megatron's): query [sq, b, np, d], key/value [sk, b, ng, d] with np = heads and
ng = query groups on this TP rank; query head i attends with key/value head i // (np/ng)
(the order of Megatron's fused QKV). Output [sq, b, np·d].

Masks:
* ``attention_mask=None``: causal (the model's ``attn_mask_type``); right padding needs no
  mask, since a causal model never lets a real token see a later pad token.
* an explicit ``attention_mask`` uses Megatron's convention: a bool tensor broadcastable to
  [b, np, sq, sk] with True = *masked out*; it replaces the causal mask (so it must include
  causality). A row with every key masked gives NaN.
* ``packed_seq_params`` (qkv_format 'thd': tokens of several sequences packed along s with
  b = 1; Megatron passes [t, n, d] tensors): block-diagonal causal attention from
  ``cu_seqlens_q``, computed as one causal SDPA call per sequence (a varlen attention from
  PyTorch itself: each call takes the kernel PyTorch picks (flash on CUDA and CPU, with native GQA, where
  it can: ``kernel_in_use`` names it, and the start line says it); work and memory grow
  with ``sum L_i^2``, never the dense ``[t, t]`` of a block-diagonal mask); output [t, 1, n·d].
  The sequence bounds are read to the host once per micro-batch (cached on the params object),
  not once per layer. Opt-in, ``packed_attention='varlen'`` (``Qwen3TransformerConfig``; the trainer's
  ``--model.packed_attention``): one call per layer of PyTorch's varlen flash attention from ``cu_seqlens``
  instead (``models/varlen.py``: CUDA only, bf16/fp16, no attention dropout; the start line says "varlen flash"), on the
  params' own ``cu_seqlens_q`` and ``max_seqlen_q``, with no read to the host (``packed_cu_seqlens``). It stays
  opt-in until a GPU has measured it against the per-sequence calls (``benchmarks/sdpa_plans.py``).

Every call leaves cuDNN's attention out (``SDPA_BACKENDS``): PyTorch on Hopper may try cuDNN first (with a
bundled cuDNN newer than 9.15, as torch 2.11's likely is: read in PyTorch's backend choice, not recorded on a
GPU), whose plans are built per exact sequence length (a cache keyed on ``s_q``/``s_kv``), and every step of
on-policy training brings new lengths: each packed sample, each padded micro-batch (issue 23, BENCHMARKS.md).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from megatron.core import tensor_parallel
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from torch.nn.attention import SDPBackend, sdpa_kernel

from phf_megatron.models.choices import PACKED_ATTENTIONS
from phf_megatron.models.varlen import varlen_attend, varlen_call, varlen_parameters

#: The kernels attention may take (module docstring): no cuDNN, which would build a plan for every new sequence length.
#: A list, built once: ``sdpa_kernel`` refuses a tuple.
SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

#: PyTorch's names for its SDPA kernels, as ``torch._fused_sdp_choice`` numbers them.
KERNEL_NAMES = {SDPBackend.MATH: "math", SDPBackend.FLASH_ATTENTION: "flash",
                SDPBackend.EFFICIENT_ATTENTION: "memory-efficient", SDPBackend.CUDNN_ATTENTION: "cuDNN"}


def kernel_in_use(heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
                  dropout_p: float = 0.0) -> str:
    """The SDPA kernel PyTorch picks for our attention on this rank (``"flash"``, ``"memory-efficient"``, ``"math"``):
    its own choice (``torch._fused_sdp_choice``) for a causal GQA call of this layout, dtype and training-time
    ``dropout_p`` on ``device`` (PyTorch's CPU flash takes no dropout), under ``SDPA_BACKENDS``, as every ``_attend``
    call runs. A probe of 16 tokens: the choice reads the layout, not the length."""
    q = torch.zeros(1, heads, 16, head_dim, dtype=dtype, device=device)
    kv = torch.zeros(1, kv_heads, 16, head_dim, dtype=dtype, device=device)
    with sdpa_kernel(SDPA_BACKENDS):
        choice = torch._fused_sdp_choice(q, kv, kv, dropout_p=dropout_p, is_causal=True, enable_gqa=heads != kv_heads)
    return KERNEL_NAMES.get(SDPBackend(int(choice)), f"backend {int(choice)}")


class SDPACoreAttention(MegatronModule):
    """``forward(q [sq,b,np,d], k [sk,b,ng,d], v [sk,b,ng,d], mask) -> [sq, b, np·d]``."""

    def __init__(self, config: TransformerConfig, layer_number: int, attn_mask_type: AttnMaskType,
                 attention_type: str = "self", attention_dropout: Optional[float] = None,
                 softmax_scale: Optional[float] = None, cp_comm_type: Optional[str] = None,
                 pg_collection=None, **unused):
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError("context_parallel_size: SDPACoreAttention supports only 1 (use the TE spec)")
        if getattr(config, "window_size", None) is not None:
            raise ValueError("window_size: sliding-window attention is not supported by SDPACoreAttention")
        self.layer_number = layer_number
        self.attn_mask_type = attn_mask_type
        self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(config.kv_channels)
        self.varlen = None
        """The ``varlen_attn`` call of packed sequences (``packed_attention='varlen'``); None: one SDPA call each."""
        packed = getattr(config, "packed_attention", "sdpa")
        if packed not in PACKED_ATTENTIONS:
            raise ValueError(f"packed_attention: {packed!r} is not one of {PACKED_ATTENTIONS}")
        if packed == "varlen":   # refused here (start-up) if it cannot serve this model
            tp = config.tensor_model_parallel_size
            self.varlen = varlen_call(varlen_parameters(), config.num_attention_heads // tp,
                                      (config.num_query_groups or config.num_attention_heads) // tp,
                                      config.kv_channels, self.softmax_scale, self.dropout_p, config.params_dtype)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: Optional[torch.Tensor], attn_mask_type: Optional[AttnMaskType] = None,
                attention_bias: Optional[torch.Tensor] = None, packed_seq_params=None) -> torch.Tensor:
        if attention_bias is not None:
            raise ValueError("attention_bias: not supported by SDPACoreAttention")
        if query.dim() == 3:  # packed 'thd': Megatron squeezes the batch dim -> [t, n, d]
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        sq, b, heads, d = query.shape
        if packed_seq_params is not None and self.varlen is not None:
            cu_seqlens, longest = packed_cu_seqlens(packed_seq_params, b, query.device)
            with sdpa_kernel(SDPA_BACKENDS):
                out = varlen_attend(self.varlen, query[:, 0], key[:, 0], value[:, 0], cu_seqlens, longest)
            return out.reshape(sq, b, heads * d)
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        is_causal = False
        segments = None
        if packed_seq_params is not None:
            keep, segments = None, packed_segments(packed_seq_params, sq, b)
        elif attention_mask is not None:
            keep = ~attention_mask
        else:
            keep = None
            is_causal = mask_type == AttnMaskType.causal and sq > 1

        # [s, b, n, d] -> [b, n, s, d]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        dropout_p = self.dropout_p if self.training else 0.0
        if self.config.sequence_parallel or dropout_p == 0.0:
            out = _attend(q, k, v, keep, is_causal, dropout_p, self.softmax_scale, segments)
        else:  # attention dropout differs across TP ranks, as in Megatron's DotProductAttention
            with tensor_parallel.get_cuda_rng_tracker().fork():
                out = _attend(q, k, v, keep, is_causal, dropout_p, self.softmax_scale, segments)
        # [b, np, sq, d] -> [sq, b, np·d]
        return out.permute(2, 0, 1, 3).reshape(sq, b, heads * d)


def _attend(q, k, v, keep, is_causal, dropout_p, scale, segments):
    """SDPA over ``[b, n, s, d]``; with ``segments`` (packed), causal SDPA inside each ``[lo, hi)``."""
    with sdpa_kernel(SDPA_BACKENDS):
        if segments is None:
            return _sdpa(q, k, v, keep, is_causal, dropout_p, scale)
        return torch.cat([_sdpa(q[:, :, lo:hi], k[:, :, lo:hi], v[:, :, lo:hi], None, hi - lo > 1, dropout_p, scale)
                          for lo, hi in segments], dim=2)


def _sdpa(q, k, v, keep, is_causal, dropout_p, scale):
    rep = q.shape[1] // k.shape[1]
    if rep > 1 and keep is None:
        try:  # native GQA (flash / math kernels) without materialising repeated K/V
            return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, dropout_p=dropout_p,
                                                  scale=scale, enable_gqa=True)
        except TypeError:  # torch < 2.5
            pass
    if rep > 1:  # masked kernels (memory-efficient) want equal head counts
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal=is_causal,
                                          dropout_p=dropout_p, scale=scale)


def packed_segments(params, sq: int, b: int) -> list[tuple[int, int]]:
    """The ``[lo, hi)`` bounds of the packed sequences (``cu_seqlens_q``), checked and read once per params object."""
    cached = getattr(params, "_sdpa_segments", None)
    if cached is not None and cached[0] == sq:
        return cached[1]
    cu_q = _checked_cu_seqlens(params, b)
    bounds = [int(x) for x in cu_q.tolist()]
    if bounds[-1] != sq:
        raise ValueError(f"packed_seq_params.cu_seqlens_q: ends at {bounds[-1]}, sequence length is {sq}")
    segments = [(lo, hi) for lo, hi in zip(bounds, bounds[1:]) if hi > lo]
    params._sdpa_segments = (sq, segments)
    return segments


def packed_cu_seqlens(params, b: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """The packed sequences as ``varlen_attn`` takes them, the params' own: ``cu_seqlens_q`` as int32 on ``device``
    (already so from ``SequenceLayout``: no copy) and ``max_seqlen_q``. Nothing is read to the host (no sync in any
    layer); what needs a read is taken on trust, as Megatron's THD attention takes it: ``cu_seqlens_q`` ends at the
    packed length (``SequenceLayout.pack`` makes it so; the SDPA path checks it) and an empty sequence is an empty
    block to the kernel."""
    cu_q = _checked_cu_seqlens(params, b)
    if params.max_seqlen_q is None:
        raise ValueError("packed_seq_params.max_seqlen_q: 'varlen' needs the longest packed sequence, got None")
    return cu_q.to(device=device, dtype=torch.int32), int(params.max_seqlen_q)


def _checked_cu_seqlens(params, b: int) -> torch.Tensor:
    """``params.cu_seqlens_q``, after the checks of packed self-attention (THD, batch 1, the same bounds for keys
    and unpadded); the bounds are compared on the device only when the params hold two tensors of them."""
    if getattr(params, "qkv_format", "thd") != "thd":
        raise ValueError(f"packed_seq_params.qkv_format: expected 'thd', got {params.qkv_format!r}")
    if b != 1:
        raise ValueError(f"packed_seq_params: packed sequences need batch size 1 (got {b})")
    cu_q, cu_kv = params.cu_seqlens_q, params.cu_seqlens_kv
    if not _same_bounds(cu_q, cu_kv):
        raise ValueError("packed_seq_params: cu_seqlens_q and cu_seqlens_kv differ (self-attention only)")
    if not _same_bounds(cu_q, getattr(params, "cu_seqlens_q_padded", None)):
        raise ValueError("packed_seq_params.cu_seqlens_q_padded: padded packing is not supported")
    return cu_q


def _same_bounds(cu_q: torch.Tensor, other: Optional[torch.Tensor]) -> bool:
    """``other`` is absent, the same tensor as ``cu_q`` (no device read) or equal to it."""
    return other is None or other is cu_q or torch.equal(cu_q, other)
