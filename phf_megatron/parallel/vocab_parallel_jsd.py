"""The clipped generalized JSD of OPSD on vocabulary-sharded logits, without gathering the vocabulary.

Tensor parallelism splits the output layer by vocabulary: TP rank r holds ``z[..., V_r]`` with
``V = V_0 ∪ ... ∪ V_{tp-1}``. Every quantity of ``objectives.opsd`` is either element-wise in v
or a sum over v, so with ``s = z / tau`` and ``a = log p_S``, ``b = log p_T``:

    LSE(s)      = M + log sum_r sum_{v in V_r} exp(s_v - M),   M = max_r max_{v in V_r} s_v
    a_v         = s_v - LSE(s)                       (element-wise once LSE is known)
    D(token)    = sum_r sum_{v in V_r} clip(e_v(a_v, b_v))    (element clip, the official one)
                  or clip(sum_r sum_{v in V_r} e_v)           (token clip)

where ``e_v`` is the generalized JSD summand of ``objectives.opsd.generalized_jsd_terms``.
Three all-reduces per token chunk (max, sum of exp, the divergence) in the forward, one in the
backward. The gradient with respect to the student logits (the teacher is a constant):

    g_v          = de_v/da_v * [clip passes] * dL/dD,      de/da = -q            (beta = 0)
                                                           de/da = p (a - b + 1)  (beta = 1)
                                                           de/da = (1-beta) p (a - log m)  (else)
    dL/dz_v      = (g_v - p_v * sum_u g_u) / tau           (sum over the whole vocabulary: all-reduce)

Memory: the forward keeps no ``[N, V]`` tensor; both passes walk the tokens in chunks of
``chunk_elements / V_r`` rows in float32 (float64 for float64 logits), and the backward recomputes ``a`` and ``b`` from the
saved per-token log-normalizers. The only full-size tensor is the gradient itself, in the
logits' dtype. The local math lives in the helpers; the collectives in the Function.

Clip statistics (the per-step diagnostics of ``loss.reduce_logs``; ``return_clip_stats``): the
forward also returns ``[2, N]`` = (divergence before the clip, entries cut) per token,
``objectives.opsd.clip_statistics``. They come from the summands the forward computes anyway
(the eager loop: a sum and a compare-and-count per chunk, with the element clip only; Triton: two
register accumulators), in the same all-reduce as the divergence: no extra collective, no host
sync; no gradient flows through them. Measured cost: ``benchmarks/diagnostics_cost.md``.

``top_k`` (official ``--top_k_loss``) takes ``top_k_jsd``: a global top-k of the teacher and the
divergence over those k entries; both backends then run that path (no Triton kernel for it).

Backends: ``"torch"`` is that chunked loop (any device and dtype; the CPU machines' path and the
float64 oracle of the tests); ``"triton"`` runs the three fused passes of ``jsd_triton`` (CUDA,
float32/bf16/fp16 logits), which also carry ``sum_v de_v/da_v`` from the forward so that the
backward is one pass without collectives; ``"auto"`` takes Triton where it can run.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ..objectives.opsd import CLIP_MODES, clip_statistics, generalized_jsd_terms, mixture_log_probs
from . import jsd_triton
from .collectives import all_reduce_, group_size
from .timing import region
from .top_k_jsd import top_k_jsd

DEFAULT_CHUNK_ELEMENTS = 1 << 24  # float32 elements per [chunk, V_r] temporary: 64 MiB
JSD_BACKENDS = ("auto", "torch", "triton")  # what a caller asks for
JSD_PATHS = ("torch", "triton", "top_k")     # what runs (``resolve_backend``)


# ----------------------------------------------------------------------------- local math


def chunk_rows(num_tokens: int, vocab_local: int, chunk_elements: int) -> int:
    """Rows per chunk so that one ``[rows, V_r]`` float32 temporary holds about ``chunk_elements``."""
    return max(1, min(num_tokens, chunk_elements // max(1, vocab_local)))


def token_chunks(num_tokens: int, vocab_local: int, chunk_elements: int):
    """``(lo, hi)`` row ranges of ``chunk_rows`` rows covering ``[0, num_tokens)``."""
    rows = chunk_rows(num_tokens, vocab_local, chunk_elements)
    for lo in range(0, num_tokens, rows):
        yield lo, min(num_tokens, lo + rows)


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """float32 for half-precision logits, the logits' own dtype otherwise (float64 in tests)."""
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def scaled(rows: torch.Tensor, temperature: float) -> torch.Tensor:
    """``s = z / tau`` in the compute dtype, ``[c, V_r]``."""
    return rows.to(compute_dtype(rows)) / temperature


def sum_exp_shifted(s: torch.Tensor, global_max: torch.Tensor) -> torch.Tensor:
    """``sum_{v in V_r} exp(s_v - M)`` → ``[c]`` (this rank's share of the partition function)."""
    return torch.exp(s - global_max[:, None]).sum(-1)


def term_grad_wrt_student_lp(student_lp: torch.Tensor, teacher_lp: torch.Tensor, beta: float) -> torch.Tensor:
    """``de_v / da_v`` of the generalized JSD summand with respect to the student log-prob ``a_v``."""
    if beta == 0.0:  # e = q (b - a)
        return -teacher_lp.exp()
    p = student_lp.exp()
    if beta == 1.0:  # e = p (a - b)
        return p * (student_lp - teacher_lp + 1.0)
    # e = beta q (b - log m) + (1 - beta) p (a - log m); the d log m / da parts cancel.
    return (1.0 - beta) * p * (student_lp - mixture_log_probs(student_lp, teacher_lp, beta))


# ----------------------------------------------------------------------------- autograd


class _VocabParallelJSD(torch.autograd.Function):
    """Per-token clipped JSD ``[N]`` and clip statistics ``[2, N]`` from student logits rows (by index) and teacher rows."""

    @staticmethod
    def forward(ctx, student_logits, teacher_rows, student_index, beta, temperature, clip, clip_mode,
                tp_group, chunk_elements, with_stats):
        vocab_local = student_logits.shape[-1]
        flat = student_logits.reshape(-1, vocab_local)
        n = student_index.numel()
        element_stats = with_stats and clip is not None and clip_mode == "element"
        # rows: the clipped divergence, then (element clip) the raw divergence and the entries cut
        sums = torch.zeros(3 if element_stats else 1, n, dtype=compute_dtype(flat), device=flat.device)
        lse_s = torch.zeros_like(sums[0])
        lse_t = torch.zeros_like(sums[0])
        for lo, hi in token_chunks(n, vocab_local, chunk_elements):
            s = scaled(flat.index_select(0, student_index[lo:hi]), temperature)
            t = scaled(teacher_rows[lo:hi], temperature)
            # Global max and partition function of both distributions: 2 all-reduces for the pair.
            m = all_reduce_(torch.stack([s.max(-1).values, t.max(-1).values]), tp_group, dist.ReduceOp.MAX)
            z = all_reduce_(torch.stack([sum_exp_shifted(s, m[0]), sum_exp_shifted(t, m[1])]), tp_group)
            lse = m + z.log()
            s -= lse[0][:, None]  # in place: s becomes log p_S
            t -= lse[1][:, None]
            terms = generalized_jsd_terms(s, t, beta)
            if element_stats:  # objectives.opsd.clip_statistics; the 0/1 mask goes into the dead buffer s as
                # floats: a float sum costs a tenth of a bool reduction on CPU
                sums[1, lo:hi] = terms.sum(-1)
                sums[2, lo:hi] = torch.gt(terms, clip, out=s).sum(-1)
            if clip is not None and clip_mode == "element":
                terms = terms.clamp_(max=clip)
            sums[0, lo:hi] = terms.sum(-1)
            lse_s[lo:hi], lse_t[lo:hi] = lse[0], lse[1]
        all_reduce_(sums, tp_group)
        per_token = sums[0].clone()
        if element_stats:
            stats = sums[1:].clone()
        elif with_stats:  # no clip or the token clip: the statistics follow from the summed divergence
            stats = torch.stack(clip_statistics(per_token[:, None], clip, clip_mode))
        else:
            stats = sums.new_zeros(2, 0)
        unclipped = per_token.clone() if clip is not None and clip_mode == "token" else None
        if unclipped is not None:
            per_token = per_token.clamp(max=clip)
        ctx.save_for_backward(student_logits, teacher_rows, student_index, lse_s, lse_t, unclipped)
        ctx.options = (beta, temperature, clip, clip_mode, tp_group, chunk_elements)
        ctx.mark_non_differentiable(stats)
        return per_token, stats

    @staticmethod
    def backward(ctx, grad_per_token, _grad_stats):
        with region("jsd_bwd"):
            return _VocabParallelJSD._backward(ctx, grad_per_token)

    @staticmethod
    def _backward(ctx, grad_per_token):
        student_logits, teacher_rows, student_index, lse_s, lse_t, unclipped = ctx.saved_tensors
        beta, temperature, clip, clip_mode, tp_group, chunk_elements = ctx.options
        vocab_local = student_logits.shape[-1]
        flat = student_logits.reshape(-1, vocab_local)
        grad_flat = torch.zeros_like(flat)
        for lo, hi in token_chunks(student_index.numel(), vocab_local, chunk_elements):
            a = scaled(flat.index_select(0, student_index[lo:hi]), temperature) - lse_s[lo:hi, None]
            b = scaled(teacher_rows[lo:hi], temperature) - lse_t[lo:hi, None]
            g = term_grad_wrt_student_lp(a, b, beta)
            if clip is not None:
                clipped_at = generalized_jsd_terms(a, b, beta) if clip_mode == "element" else unclipped[lo:hi, None]
                g = torch.where(clipped_at <= clip, g, torch.zeros_like(g))  # torch.clamp passes x <= max
            g *= grad_per_token[lo:hi, None]
            g_sum = all_reduce_(g.sum(-1), tp_group)
            p = a.exp_()  # a is not needed any more
            grad_rows = (g - p * g_sum[:, None]) / temperature
            grad_flat.index_copy_(0, student_index[lo:hi], grad_rows.to(grad_flat.dtype))
        return grad_flat.view_as(student_logits), None, None, None, None, None, None, None, None, None


class _FusedVocabParallelJSD(torch.autograd.Function):
    """The same per-token divergence ``[N]`` and statistics by the Triton passes (all-reduces of ``[2, N]``, ``[2, N]``, ``[4, N]``)."""

    @staticmethod
    def forward(ctx, student_logits, teacher_rows, student_index, beta, temperature, clip, clip_mode, tp_group):
        flat = student_logits.view(-1, student_logits.shape[-1])
        stats = jsd_triton.row_stats(flat, student_index, teacher_rows, temperature)
        lse = global_log_normalizers(stats[0], stats[1], tp_group)
        element_clip = clip if clip_mode == "element" else None
        sums = all_reduce_(jsd_triton.summands(flat, student_index, teacher_rows, lse, beta, temperature,
                                               element_clip), tp_group)
        per_token, h_sum = sums[0].clone(), sums[1]
        stats = sums[2:].clone() if element_clip is not None else torch.stack(
            clip_statistics(per_token[:, None], clip, clip_mode))
        keep = None
        if clip is not None and clip_mode == "token":  # the token's own clamp gates its whole row
            keep = per_token <= clip
            per_token = per_token.clamp(max=clip)
        token_of_row = torch.full((flat.shape[0],), -1, dtype=torch.long, device=flat.device)
        token_of_row[student_index] = torch.arange(student_index.numel(), device=flat.device)
        ctx.save_for_backward(student_logits, teacher_rows, token_of_row, lse, h_sum, keep)
        ctx.options = (beta, temperature, element_clip)
        ctx.mark_non_differentiable(stats)
        return per_token, stats

    @staticmethod
    def backward(ctx, grad_per_token, _grad_stats):
        student_logits, teacher_rows, token_of_row, lse, h_sum, keep = ctx.saved_tensors
        beta, temperature, element_clip = ctx.options
        with region("jsd_bwd"):
            w = grad_per_token.float() if keep is None else torch.where(keep, grad_per_token.float(), 0.0)
            flat = student_logits.view(-1, student_logits.shape[-1])
            grad = jsd_triton.logit_grad(flat, token_of_row, teacher_rows, lse, h_sum, w.contiguous(), beta,
                                         temperature, element_clip)
        return grad.view_as(student_logits), None, None, None, None, None, None, None


def global_log_normalizers(local_max: torch.Tensor, local_sum_exp: torch.Tensor,
                           tp_group: dist.ProcessGroup | None) -> torch.Tensor:
    """``LSE`` over the whole vocabulary from each rank's ``max`` and ``sum exp(x - max)`` (any shape)."""
    if tp_group is None or dist.get_world_size(tp_group) == 1:
        return local_max + local_sum_exp.log()
    global_max = all_reduce_(local_max.clone(), tp_group, dist.ReduceOp.MAX)
    total = all_reduce_(local_sum_exp * torch.exp(local_max - global_max), tp_group)
    return global_max + total.log()


def resolve_backend(backend: str, student_logits: torch.Tensor, teacher_rows: torch.Tensor,
                    top_k: int | None = None) -> str:
    """``"torch"``, ``"triton"`` or ``"top_k"`` for these inputs; ValueError for an unknown or impossible choice.

    ``top_k`` set: ``"top_k"`` (``top_k_jsd``, eager) for ``"auto"`` and ``"torch"``; ``"triton"`` is refused.
    A path this function returned (``JSD_PATHS``) may be passed back as ``backend``: it resolves to
    itself, so a caller that decided (and logged) the path hands that decision on (``PhfStep``).
    """
    if backend not in JSD_BACKENDS + JSD_PATHS:
        raise ValueError(f"backend: expected one of {JSD_BACKENDS}, got {backend!r}")
    if top_k is not None:
        if backend == "triton":
            raise ValueError("backend: 'triton' has no top-k kernel (objective.top_k_loss); use 'auto' or 'torch'")
        return "top_k"
    if backend == "top_k":
        raise ValueError("backend: 'top_k' needs top_k (the number of teacher entries)")
    if backend == "torch":
        return "torch"
    problem = jsd_triton.unsupported(student_logits, teacher_rows)
    if problem is None:
        return "triton"
    if backend == "triton":
        raise ValueError(f"backend: 'triton' {problem}")
    return "torch"


# ----------------------------------------------------------------------------- public API


def vocab_parallel_jsd(
    student_logits: torch.Tensor,
    teacher_rows: torch.Tensor,
    student_index: torch.Tensor,
    beta: float = 0.5,
    temperature: float = 1.0,
    clip: float | None = None,
    clip_mode: str = "element",
    tp_group: dist.ProcessGroup | None = None,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    backend: str = "auto",
    top_k: int | None = None,
    return_clip_stats: bool = False,
):
    """Per-token clipped generalized JSD ``D(p_T || p_S)`` on vocabulary-sharded logits.

    Equals ``objectives.opsd.opsd_token_divergence`` on the gathered vocabulary, token by token.

    Args:
        student_logits: ``[..., V_r]`` this rank's vocabulary shard (any leading layout, e.g.
            megatron's ``[b, s, V/tp]``), contiguous; differentiable.
        teacher_rows: ``[N, V_r]`` the teacher's logits for the N scored tokens (no gradient).
        student_index: ``[N]`` long, row of each scored token in ``student_logits`` flattened to
            ``[-1, V_r]`` (``b * s_len + t`` for ``[b, s, V_r]``); token k is compared with
            ``teacher_rows[k]``.
        beta, temperature, clip, clip_mode: as in ``objectives.opsd.opsd_loss``.
        tp_group: the tensor-parallel group the vocabulary is split over (None: not split).
        chunk_elements: float32 elements per temporary of the ``"torch"`` backend; bounds its extra memory.
        backend: ``"auto"`` (Triton kernels for CUDA float32/bf16/fp16 logits when Triton is
            installed, else the chunked loop), ``"torch"`` or ``"triton"`` (see the module docstring).
        top_k: None (the whole vocabulary) or k: the divergence over the teacher's k most likely
            entries, both renormalized (``top_k_jsd``; ``"auto"`` and ``"torch"`` only).
        return_clip_stats: also return the ``[2, N]`` clip statistics (no gradient).

    Returns:
        ``[N]`` per-token divergences (float32, or float64 for float64 logits), identical on every rank of
        ``tp_group``; with ``return_clip_stats``, ``(divergences, stats)`` where ``stats[0]`` is the divergence
        before the clip and ``stats[1]`` the entries cut (element clip) or 1 where the token was cut (token clip).
    """
    if clip_mode not in CLIP_MODES:
        raise ValueError(f"clip_mode: expected one of {CLIP_MODES}, got {clip_mode!r}")
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta: must lie in [0, 1], got {beta}")
    if temperature <= 0 or not math.isfinite(temperature):
        raise ValueError(f"temperature: must be a finite number > 0, got {temperature}")
    if clip is not None and clip <= 0:
        raise ValueError(f"clip: must be > 0 or None, got {clip}")
    if teacher_rows.dim() != 2 or teacher_rows.shape != (student_index.numel(), student_logits.shape[-1]):
        raise ValueError(
            f"teacher_rows: expected [N, V_r] = [{student_index.numel()}, {student_logits.shape[-1]}], "
            f"got {tuple(teacher_rows.shape)}"
        )
    if student_index.dtype != torch.long or student_index.dim() != 1:
        raise ValueError(f"student_index: expected a 1-D long tensor, got {student_index.dtype} {tuple(student_index.shape)}")
    if top_k is not None and not 1 <= top_k <= student_logits.shape[-1] * group_size(tp_group):
        raise ValueError(f"top_k: must lie in [1, {student_logits.shape[-1] * group_size(tp_group)}] (the vocabulary), "
                         f"got {top_k}")
    with region("jsd_fwd"):
        path = resolve_backend(backend, student_logits, teacher_rows, top_k)
        if path == "top_k":
            rows = chunk_rows(student_index.numel(), student_logits.shape[-1], chunk_elements)
            per_token, stats = top_k_jsd(student_logits, teacher_rows, student_index, top_k, beta, temperature, clip,
                                         clip_mode, tp_group, rows)
        elif path == "triton":
            per_token, stats = _FusedVocabParallelJSD.apply(
                student_logits.contiguous(), teacher_rows.detach().contiguous(), student_index, beta, temperature,
                clip, clip_mode, tp_group)
        else:
            per_token, stats = _VocabParallelJSD.apply(
                student_logits.contiguous(), teacher_rows.detach(), student_index, beta, temperature, clip,
                clip_mode, tp_group, chunk_elements, return_clip_stats)
    return (per_token, stats) if return_clip_stats else per_token
