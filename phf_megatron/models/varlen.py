"""Packed attention in one call per layer: PyTorch's varlen flash attention (``model.packed_attention='varlen'``).

``torch.nn.attention.varlen.varlen_attn`` takes the packed ``[t, n, d]`` tensors and the ``cu_seqlens`` of the
sequences and runs block-diagonal causal attention in one flash kernel (forward and backward), where the default
packed path (``models/attention.py``) makes one SDPA call per sequence. CUDA only (its CPU dispatch has no
``_flash_attention_forward``), bfloat16 or float16 only (flash) and no dropout. Its signature changed between PyTorch
releases:

* torch 2.10 (its first): ``varlen_attn(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False,
  return_aux=None)``: no softmax scale (always ``1/sqrt(d)``) and no GQA keyword;
* torch 2.11 (the GPU image's): ``varlen_attn(..., max_k, *, return_aux=None, scale=None, window_size=(-1, -1))``,
  causal as ``window_size=(-1, 0)`` (a tuple: it is compared with one), still no GQA keyword;
* torch 2.13: the same plus ``enable_gqa=False`` (and paged-KV keywords).

``varlen_call`` maps our call (causal, GQA, scale) onto the parameters of the installed one, read once
(``varlen_parameters``); ``varlen_attend`` runs it. Errors name the setting, ``packed_attention``.
"""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass, field
from typing import Collection, Optional

import torch

#: The setting that chooses this path (``Qwen3TransformerConfig.packed_attention``, ``--model.packed_attention``).
SETTING = "packed_attention"

#: The dtypes PyTorch's flash attention takes (another fails in ``varlen_attn``'s first call, inside a step).
FLASH_DTYPES = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class VarlenCall:
    """How to call the installed ``varlen_attn`` for causal attention of ``heads`` query heads over ``heads /
    repeat_kv`` (or fewer, with ``enable_gqa``) key/value heads."""

    kwargs: dict = field(default_factory=dict)
    """Keywords after ``(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k)``."""
    repeat_kv: int = 1
    """Repeat each key/value head this many times first (a ``varlen_attn`` without ``enable_gqa``); 1: none."""


def _varlen_attn():
    """PyTorch's ``varlen_attn``, or None (a torch without it)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


@functools.lru_cache(maxsize=1)
def varlen_parameters() -> frozenset[str]:
    """The parameter names of this torch's ``varlen_attn`` (read once); a ValueError naming the setting without one."""
    function = _varlen_attn()
    if function is None:
        raise ValueError(f"{SETTING}: 'varlen' needs torch.nn.attention.varlen.varlen_attn, which torch "
                         f"{torch.__version__} has not: use 'sdpa'")
    return frozenset(inspect.signature(function).parameters)


def varlen_unavailable() -> Optional[str]:
    """Why ``'varlen'`` cannot run here (a torch without ``varlen_attn``, no CUDA device), one line naming the
    setting; None when it can."""
    try:
        varlen_parameters()
    except ValueError as err:
        return str(err)
    if not torch.cuda.is_available():
        return f"{SETTING}: 'varlen' runs on CUDA only (PyTorch's varlen_attn) and no CUDA device is visible: use 'sdpa'"
    return None


def varlen_dtype_refused(dtype: torch.dtype) -> Optional[str]:
    """Why ``'varlen'`` cannot run a model of ``dtype`` (flash takes half precision only), one line naming the
    setting; None when it can. Checked as the model is built (``varlen_call``) and at the trainer's start-up."""
    if dtype in FLASH_DTYPES:
        return None
    return (f"{SETTING}: 'varlen' runs PyTorch's flash attention, which takes bfloat16 or float16, and the model's "
            f"dtype is {str(dtype).removeprefix('torch.')}: use bfloat16, or 'sdpa'")


def varlen_call(parameters: Collection[str], heads: int, kv_heads: int, head_dim: int, scale: float,
                dropout_p: float = 0.0, dtype: torch.dtype = torch.bfloat16) -> VarlenCall:
    """Causal attention with ``heads`` query heads in ``kv_heads`` groups, softmax ``scale`` and attention
    ``dropout_p`` in ``dtype``, as keywords of a ``varlen_attn`` whose parameters are ``parameters``; a ValueError
    (one line naming the setting) for what it cannot do: a dtype other than half precision, dropout, a scale other
    than ``1/sqrt(head_dim)`` without ``scale``."""
    reason = varlen_dtype_refused(dtype)
    if reason:
        raise ValueError(reason)
    if dropout_p > 0:
        raise ValueError(f"{SETTING}: 'varlen' has no attention dropout (attention_dropout={dropout_p}): use 'sdpa' "
                         "or turn the dropout off")
    kwargs: dict = {}
    if "window_size" in parameters:
        kwargs["window_size"] = (-1, 0)
    elif "is_causal" in parameters:
        kwargs["is_causal"] = True
    else:
        raise ValueError(f"{SETTING}: this torch's varlen_attn takes neither window_size nor is_causal: use 'sdpa'")
    if "scale" in parameters:
        kwargs["scale"] = scale
    elif not math.isclose(scale, 1.0 / math.sqrt(head_dim), rel_tol=1e-6):
        raise ValueError(f"{SETTING}: this torch's varlen_attn takes no softmax scale (always 1/sqrt({head_dim})), "
                         f"the model's is {scale}: use 'sdpa'")
    repeat = 1
    if heads != kv_heads:
        if "enable_gqa" in parameters:
            kwargs["enable_gqa"] = True
        else:
            repeat = heads // kv_heads
    return VarlenCall(kwargs, repeat)


def varlen_attend(call: VarlenCall, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                  max_seqlen: int) -> torch.Tensor:
    """Block-diagonal causal attention over packed ``q [t, np, d]``, ``k``/``v [t, ng, d]`` with ``cu_seqlens``
    (int32, on their device) and its longest sequence ``max_seqlen``, in one ``varlen_attn`` call: ``[t, np, d]``."""
    if not q.is_cuda:
        raise ValueError(f"{SETTING}: 'varlen' runs on CUDA only (PyTorch's varlen_attn), the tensors are on "
                         f"{q.device}: use 'sdpa'")
    if call.repeat_kv > 1:
        k, v = k.repeat_interleave(call.repeat_kv, dim=1), v.repeat_interleave(call.repeat_kv, dim=1)
    return _varlen_attn()(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, **call.kwargs)
