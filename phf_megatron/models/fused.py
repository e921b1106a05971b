"""Fused kernels for the Qwen3 model: ``torch.compile``'d RMSNorm and RoPE (Triton on GPU).

Eager PyTorch runs RMSNorm as ~8 kernels forward and more backward, with float32 copies of
the activations saved for backward (113 norm calls per Qwen3-1.7B forward, Q/K norms
included); RoPE as ~6. Compiled, each is one fused kernel each way that saves only its input.
SwiGLU uses Megatron's own compiled ``bias_swiglu_impl`` (``bias_activation_fusion``).

* ``rmsnorm_fn(config)``: ``compiled_rms_norm`` when ``config.fused_rmsnorm``, else None. The norm and
  RoPE are autograd functions over compiled forward and backward kernels (one graph per hidden size,
  whatever the length, layout or grad mode: ``_dynamic``).
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


def _dynamic(t: torch.Tensor, *dims: int) -> torch.Tensor:
    """Mark ``dims`` of ``t`` (token counts: what changes from one micro-batch to the next) dynamic before
    the first compile, so that one graph serves every length. Otherwise each new length, packed row or
    padded batch recompiles; with the grad-mode and requires-grad variants that passed dynamo's limit of
    8 graphs per function in the first training step, and the kernel fell back to eager for good (H100
    lease, 2026-11-26). A size-1 dimension stays specialized (dynamo's rule). Inside a compiled decoder
    layer (``compile_layers``) the kernel is traced into the layer's graph: nothing to mark."""
    if torch.compiler.is_compiling():
        return t
    for d in dims:
        if t.shape[d] > 1:
            torch._dynamo.maybe_mark_dynamic(t, d)
    return t


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The HF Qwen3 RMSNorm over the last dim, eager: y = w ⊙ cast(x / sqrt(mean(x², -1) + eps)), statistics
    in float32; any leading shape ([s, b, h] or [s, b, n, d])."""
    return _rms_norm_forward(x, weight, eps)[0]


def _rms_norm_forward(x: torch.Tensor, weight: torch.Tensor, eps: float):
    """``rms_norm`` of x [..., h] and its float32 ``rstd`` [..., 1] (saved for the backward)."""
    x32 = x.float()
    rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * (x32 * rstd).to(x.dtype), rstd


def _rms_norm_backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor):
    """(dx, dweight) of ``rms_norm`` as eager autograd forms them: with n = x·rstd (float32),
    dweight = Σ_rows dy·cast(n); g = float(dy·w); dx = cast(rstd·g − x·rstd³·mean(g·x))."""
    x32 = x.float()
    dw = (dy * (x32 * rstd).to(x.dtype)).sum(0, dtype=torch.float32).to(weight.dtype)
    g = (dy * weight).float()
    dx = rstd * g - x32 * rstd.pow(3) * (g * x32).mean(-1, keepdim=True)
    return dx.to(x.dtype), dw


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


def _rope_backward(dy: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """d _rope / dt (RoPE is linear in t): dy·cos + Rᵀ(dy·sin), Rᵀ(u) = cat(u₂, −u₁) the transpose of rotate_half."""
    cos, sin = freqs.cos().to(dy.dtype), freqs.sin().to(dy.dtype)
    u1, u2 = (dy * sin).chunk(2, dim=-1)
    return dy * cos + torch.cat((u2, -u1), dim=-1)


_EAGER = {"rms_norm_forward": _rms_norm_forward, "rms_norm_backward": _rms_norm_backward,
          "rope": _rope, "rope_backward": _rope_backward, "cross_entropy_chunk": _cross_entropy_chunk}


def cross_entropy_chunk_fn(config) -> Optional[Callable]:
    """The compiled single-rank cross-entropy chunk (``None``: the eager vocab-parallel path)."""
    return _compiled_cross_entropy_chunk if getattr(config, "fused_cross_entropy", False) else None


def _compiled_cross_entropy_chunk(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor):
    """The compiled chunk, its token count dynamic (the last chunk of a micro-batch is shorter)."""
    return _compiled("cross_entropy_chunk")(_dynamic(logits, 0), _dynamic(labels, 0), _dynamic(weights, 0))


def rmsnorm_fn(config) -> Optional[Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]]:
    """The compiled RMSNorm for ``config`` (``None``: use the eager one)."""
    return compiled_rms_norm if getattr(config, "fused_rmsnorm", False) else None


def fused_rope_bshd(t: torch.Tensor, freqs: torch.Tensor, transpose_output_memory: bool = False,
                    interleaved: bool = False) -> torch.Tensor:
    """Megatron's ``fused_apply_rotary_pos_emb`` contract: t [s, b, n, d], freqs [s, 1, 1, d']."""
    if interleaved:
        raise ValueError("rotary_interleaved: not supported by the compiled RoPE")
    rot = freqs.shape[-1]
    if rot == t.shape[-1]:
        return _rope_3d(t, freqs)
    return torch.cat((_rope_3d(t[..., :rot], freqs), t[..., rot:]), dim=-1)


def _rope_3d(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """RoPE by two compiled kernels (``_rope``/``_rope_backward``) that see only detached ``[s, b·n, d]``
    tensors with grad off: one graph each for every length, batch, head count and grad mode (inside a
    compiled decoder layer: the eager formula, fused by the layer's graph)."""
    if torch.compiler.is_compiling():
        return _rope(t, freqs)
    return _RoPE.apply(t, freqs)


def _detached_rows(t: torch.Tensor, *shape: int) -> torch.Tensor:
    """``t`` reshaped and detached, not a view (dynamo guards a view's base too), dims 0 and 1 dynamic."""
    return _dynamic(t.reshape(*shape).detach(), *range(min(2, len(shape) - 1)))


class _RoPE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, freqs):
        angles = _detached_rows(freqs, freqs.shape[0], 1, freqs.shape[-1])
        ctx.save_for_backward(angles)
        return _compiled("rope")(_detached_rows(t, t.shape[0], -1, t.shape[-1]), angles).view(t.shape)

    @staticmethod
    def backward(ctx, dy):
        (angles,) = ctx.saved_tensors
        return _compiled("rope_backward")(_detached_rows(dy, dy.shape[0], -1, dy.shape[-1]), angles).view(dy.shape), None


def fused_rope_thd(t: torch.Tensor, cu_seqlens: torch.Tensor, freqs: torch.Tensor, cp_size: int = 1,
                   cp_rank: int = 0, interleaved: bool = False) -> torch.Tensor:
    """Packed sequences: t [T, n, d]; positions restart at 0 at every ``cu_seqlens`` boundary."""
    if cp_size != 1:
        raise ValueError("context parallelism: not supported by the compiled RoPE")
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    starts = torch.repeat_interleave(cu_seqlens[:-1], lengths, output_size=t.shape[0])   # no host sync
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


def compiled_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``rms_norm`` by two compiled kernels (``_rms_norm_forward``/``_rms_norm_backward``) that see only
    detached ``[rows, hidden]`` tensors with grad off: one graph each per hidden size, whatever the
    sequence, batch, head layout, grad mode or ``requires_grad`` of the call (see ``_dynamic``). Inside a
    compiled decoder layer (``compile_layers``) the eager formula, which the layer's graph fuses."""
    if torch.compiler.is_compiling():
        return rms_norm(x, weight, eps)
    return _RMSNorm.apply(x, weight, eps)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        rows = _detached_rows(x, -1, x.shape[-1])
        y, rstd = _compiled("rms_norm_forward")(rows, weight.detach(), eps)
        ctx.save_for_backward(rows, weight, rstd)
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        rows, weight, rstd = ctx.saved_tensors
        dx, dw = _compiled("rms_norm_backward")(_detached_rows(dy, -1, dy.shape[-1]), rows, weight.detach(), rstd)
        return dx.view(dy.shape), (dw if ctx.needs_input_grad[1] else None), None
