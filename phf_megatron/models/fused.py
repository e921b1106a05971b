"""Fused kernels for the Qwen3 model: ``torch.compile``'d RMSNorm and RoPE (Triton on GPU).

Eager PyTorch runs RMSNorm as ~8 kernels forward and more backward, with float32 copies of
the activations saved for backward (113 norm calls per Qwen3-1.7B forward, Q/K norms
included); RoPE as ~6. Compiled, each is one fused kernel each way that saves only its input.
SwiGLU uses Megatron's own compiled ``bias_swiglu_impl`` (``bias_activation_fusion``).

* ``rmsnorm_fn(config)``: the compiled ``rms_norm`` when ``config.fused_rmsnorm``, else None.
* ``cross_entropy_chunk_fn(config)``: one fused kernel pair per chunk of the chunked linear
  cross entropy (``lm_head.py``) when the vocabulary is not TP-split.
* ``register_rope_kernels()``: installs our compiled RoPE as Megatron's
  ``fused_apply_rotary_pos_emb`` (+ ``_thd`` for packed sequences) when Transformer Engine
  does not provide them, so Megatron's own ``apply_rope_fusion=True`` dispatch uses it.

The math is the eager formula of each op (same rounding points in fp32; in bf16 the compiled
kernel may round once less). ``set_compile_backend("aot_eager")`` traces the same graphs
without code generation (CPU tests).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

_backend = "inductor"


def set_compile_backend(name: str) -> None:
    """Backend for the kernels compiled after this call ('inductor' on GPU; 'aot_eager' in CPU tests)."""
    global _backend
    _backend = name
    _COMPILED.clear()


def compile_backend() -> str:
    return _backend


_COMPILED: dict[str, Callable] = {}


def _compiled(name: str) -> Callable:
    if not _COMPILED:  # all at once: the dict never changes under a compiled caller (no recompiles)
        _COMPILED.update({n: torch.compile(f, backend=_backend, dynamic=None) for n, f in _EAGER.items()})
    return _COMPILED[name]


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * y.to(x.dtype)


def _rope(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """t [s, b, n, d] (or broadcastable), freqs [s, 1, 1, d] angles: t·cos + rotate_half(t)·sin."""
    cos, sin = freqs.cos().to(t.dtype), freqs.sin().to(t.dtype)
    x1, x2 = t.chunk(2, dim=-1)
    return t * cos + torch.cat((-x2, x1), dim=-1) * sin


def _cross_entropy_chunk(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor):
    """One chunk on one TP rank holding the whole vocabulary: (Σ w·CE, d(Σ w·CE)/d logits).

    logits [c, V] (any float dtype; math in ``weights.dtype``), labels [c], weights [c].
    Compiled, this reads the chunk's logits once and writes their gradient once.
    """
    z = logits.to(weights.dtype)
    lse = torch.logsumexp(z, dim=-1)
    target = z.gather(1, labels[:, None]).squeeze(1)
    loss = (weights * (lse - target)).sum()
    grad = torch.exp(z - lse[:, None]) * weights[:, None]
    grad = grad.scatter_add(1, labels[:, None], -weights[:, None])
    return loss, grad.to(logits.dtype)


_EAGER = {"rms_norm": _rms_norm, "rope": _rope, "cross_entropy_chunk": _cross_entropy_chunk}


def cross_entropy_chunk_fn(config) -> Optional[Callable]:
    """The compiled single-rank cross-entropy chunk (``None``: the eager vocab-parallel path)."""
    return _compiled("cross_entropy_chunk") if getattr(config, "fused_cross_entropy", False) else None


def rmsnorm_fn(config) -> Optional[Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]]:
    """The compiled RMSNorm for ``config`` (``None``: use the eager one)."""
    return _compiled("rms_norm") if getattr(config, "fused_rmsnorm", False) else None


def fused_rope_bshd(t: torch.Tensor, freqs: torch.Tensor, transpose_output_memory: bool = False,
                    interleaved: bool = False) -> torch.Tensor:
    """Megatron's ``fused_apply_rotary_pos_emb`` contract: t [s, b, n, d], freqs [s, 1, 1, d']."""
    if interleaved:
        raise ValueError("rotary_interleaved: not supported by the compiled RoPE")
    rot = freqs.shape[-1]
    if rot == t.shape[-1]:
        return _compiled("rope")(t, freqs)
    return torch.cat((_compiled("rope")(t[..., :rot], freqs), t[..., rot:]), dim=-1)


def fused_rope_thd(t: torch.Tensor, cu_seqlens: torch.Tensor, freqs: torch.Tensor, cp_size: int = 1,
                   cp_rank: int = 0, interleaved: bool = False) -> torch.Tensor:
    """Packed sequences: t [T, n, d]; positions restart at 0 at every ``cu_seqlens`` boundary."""
    if cp_size != 1:
        raise ValueError("context parallelism: not supported by the compiled RoPE")
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    starts = torch.repeat_interleave(cu_seqlens[:-1], lengths)
    positions = torch.arange(t.shape[0], device=t.device) - starts.to(t.device)
    return fused_rope_bshd(t.unsqueeze(1), freqs[positions.long()], interleaved=interleaved).squeeze(1)


def register_rope_kernels() -> bool:
    """Make Megatron's ``apply_rope_fusion`` use our kernels where TE gives none. Idempotent."""
    from megatron.core.models.common.embeddings import rope_utils

    if getattr(rope_utils, "fused_apply_rotary_pos_emb", None) is None:
        rope_utils.fused_apply_rotary_pos_emb = fused_rope_bshd
    if getattr(rope_utils, "fused_apply_rotary_pos_emb_thd", None) is None:
        rope_utils.fused_apply_rotary_pos_emb_thd = fused_rope_thd
    return True
