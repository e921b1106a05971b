"""Triton kernels of the vocabulary-parallel JSD: three passes over the scored logit rows, fp32 math.

The eager chunked loop of ``vocab_parallel_jsd`` launches ~25 element-wise kernels per chunk
in each direction, each one a full read (and often a write) of a ``[c, V_r]`` float32
temporary. Here every pass reads the bf16 rows straight from the logits and keeps everything
else in registers (one program per token row, a loop over ``BLOCK``-wide vocabulary tiles):

1. ``row_stats``: per token, this rank's ``max`` and ``sum exp(x - max)`` of ``s = z_S / tau``
   and ``t = z_T / tau`` (an online softmax per lane: one read of both rows);
2. ``summands``: with the global log-normalizers ``lse``, ``a = s - lse_S``, ``b = t - lse_T``,
   the divergence ``D = sum_v clip(e_v(a_v, b_v))`` and ``H = sum_v h_v`` where
   ``h_v = de_v/da_v * [e_v <= clip]`` (element clip; no mask otherwise), and the clip
   statistics ``sum_v e_v`` (before the clip) and ``#{v : e_v > clip}`` (two more accumulators
   in registers: the diagnostics cost no extra pass);
3. ``logit_grad``: ``dL/dz_v = w (h_v - p_v H) / tau`` for every row of the student logits
   (``w = dL/dD`` of the row's token; rows that score no token get zeros), written once in the
   logits' dtype. ``H`` from the forward replaces the eager backward's all-reduce: ``sum_v g_v``
   factors as ``w * H`` because ``dL/dD`` is constant along a token's row.

The summand ``e_v`` and its derivative are those of ``objectives.opsd`` (beta = 0: forward KL,
beta = 1: reverse KL, else the mixture with ``log m`` by a log-add-exp), including the
``p > 0`` guards of ``kl_terms``. No ``[N, V]`` temporary exists in any pass.

``available()`` is False without Triton (the CPU machines): callers keep the eager path. With
``TRITON_INTERPRET=1`` set before import the kernels run on CPU tensors (the tests).
"""

from __future__ import annotations

import math
import os

import torch

try:  # Triton ships with CUDA builds of torch; the CPU machines have none
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = None

MAX_BLOCK = 2048  # vocabulary entries per tile: 8 per thread at 8 warps (16-byte bf16 loads)
NUM_WARPS = 8
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def available() -> bool:
    return triton is not None


def interpreted() -> bool:
    """True when Triton runs its CPU interpreter (``TRITON_INTERPRET=1``): CPU tensors are accepted."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def unsupported(student_logits: torch.Tensor, teacher_rows: torch.Tensor) -> str | None:
    """Why these inputs cannot take the kernels (None when they can)."""
    if triton is None:
        return "Triton is not installed"
    if not (student_logits.is_cuda or interpreted()):
        return f"needs CUDA tensors (logits on {student_logits.device})"
    if student_logits.dtype not in SUPPORTED_DTYPES or teacher_rows.dtype not in SUPPORTED_DTYPES:
        return f"supports float32/bfloat16/float16 logits (got {student_logits.dtype}, {teacher_rows.dtype})"
    return None


def _scalars(beta: float, temperature: float, clip: float | None) -> dict:
    """Kernel scalars: beta mode (0: KL(T||S), 1: KL(S||T), 2: mixture), log-weights of the mixture."""
    mode = 0 if beta == 0.0 else 1 if beta == 1.0 else 2
    log_w_s = math.log1p(-beta) if mode == 2 else 0.0
    log_w_t = math.log(beta) if mode == 2 else 0.0
    return dict(tau=float(temperature), beta=float(beta), log_w_s=log_w_s, log_w_t=log_w_t,
                clip=float(clip) if clip is not None else 0.0, MODE=mode, CLIP=clip is not None)


def _block(vocab: int) -> int:
    return min(MAX_BLOCK, triton.next_power_of_2(max(vocab, 16)))


if triton is not None:

    @triton.jit
    def _summand(a, b, beta, log_w_s, log_w_t, MODE: tl.constexpr):
        """(e_v, de_v/da_v) of the generalized JSD at student/teacher log-probs a, b (fp32)."""
        if MODE == 0:  # KL(T || S): e = q (b - a)
            q = tl.exp(b)
            e = tl.where(q > 0, q * (b - a), 0.0)
            h = -q
        elif MODE == 1:  # KL(S || T): e = p (a - b)
            p = tl.exp(a)
            e = tl.where(p > 0, p * (a - b), 0.0)
            h = p * (a - b + 1.0)
        else:  # beta q (b - log m) + (1 - beta) p (a - log m), log m = logaddexp(a + log(1-beta), b + log beta)
            p = tl.exp(a)
            q = tl.exp(b)
            x = a + log_w_s
            y = b + log_w_t
            hi = tl.maximum(x, y)
            log_m = hi + tl.log(1.0 + tl.exp(tl.minimum(x, y) - hi))
            e = beta * tl.where(q > 0, q * (b - log_m), 0.0) + (1.0 - beta) * tl.where(p > 0, p * (a - log_m), 0.0)
            h = (1.0 - beta) * p * (a - log_m)
        return e, h

    @triton.jit
    def _tile(s_row, t_row, cols, inside, tau, lse_s, lse_t, beta, log_w_s, log_w_t, clip, MODE: tl.constexpr,
              CLIP: tl.constexpr):
        """One vocabulary tile of a token: (a, clipped e, h, raw e) with h = 0 where the element clip is active."""
        a = tl.load(s_row + cols, mask=inside, other=0.0).to(tl.float32) / tau - lse_s
        b = tl.load(t_row + cols, mask=inside, other=0.0).to(tl.float32) / tau - lse_t
        raw, h = _summand(a, b, beta, log_w_s, log_w_t, MODE)
        e = raw
        if CLIP:  # torch.clamp(max=clip) passes the gradient where e <= clip
            h = tl.where(raw <= clip, h, 0.0)
            e = tl.minimum(raw, clip)
        return a, e, h, raw

    @triton.jit
    def _row_stats_kernel(s_ptr, s_index_ptr, t_ptr, out_ptr, n_tokens, vocab, tau, BLOCK: tl.constexpr):
        tok = tl.program_id(0)
        s_row = s_ptr + tl.load(s_index_ptr + tok).to(tl.int64) * vocab
        t_row = t_ptr + tok.to(tl.int64) * vocab
        m_s = tl.full([BLOCK], -1e30, tl.float32)
        m_t = tl.full([BLOCK], -1e30, tl.float32)
        z_s = tl.zeros([BLOCK], tl.float32)
        z_t = tl.zeros([BLOCK], tl.float32)
        for start in range(0, vocab, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            inside = cols < vocab
            s = tl.where(inside, tl.load(s_row + cols, mask=inside, other=0.0).to(tl.float32) / tau, -1e30)
            t = tl.where(inside, tl.load(t_row + cols, mask=inside, other=0.0).to(tl.float32) / tau, -1e30)
            new_s = tl.maximum(m_s, s)
            new_t = tl.maximum(m_t, t)
            z_s = z_s * tl.exp(m_s - new_s) + tl.where(inside, tl.exp(s - new_s), 0.0)
            z_t = z_t * tl.exp(m_t - new_t) + tl.where(inside, tl.exp(t - new_t), 0.0)
            m_s = new_s
            m_t = new_t
        max_s = tl.max(m_s, 0)
        max_t = tl.max(m_t, 0)
        tl.store(out_ptr + tok, max_s)
        tl.store(out_ptr + n_tokens + tok, max_t)
        tl.store(out_ptr + 2 * n_tokens + tok, tl.sum(z_s * tl.exp(m_s - max_s), 0))
        tl.store(out_ptr + 3 * n_tokens + tok, tl.sum(z_t * tl.exp(m_t - max_t), 0))

    @triton.jit
    def _summands_kernel(s_ptr, s_index_ptr, t_ptr, lse_ptr, out_ptr, n_tokens, vocab, tau, beta, log_w_s, log_w_t,
                         clip, MODE: tl.constexpr, CLIP: tl.constexpr, BLOCK: tl.constexpr):
        tok = tl.program_id(0)
        s_row = s_ptr + tl.load(s_index_ptr + tok).to(tl.int64) * vocab
        t_row = t_ptr + tok.to(tl.int64) * vocab
        lse_s = tl.load(lse_ptr + tok)
        lse_t = tl.load(lse_ptr + n_tokens + tok)
        acc_e = tl.zeros([BLOCK], tl.float32)
        acc_h = tl.zeros([BLOCK], tl.float32)
        acc_raw = tl.zeros([BLOCK], tl.float32)
        acc_cut = tl.zeros([BLOCK], tl.float32)
        for start in range(0, vocab, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            inside = cols < vocab
            _, e, h, raw = _tile(s_row, t_row, cols, inside, tau, lse_s, lse_t, beta, log_w_s, log_w_t, clip, MODE,
                                 CLIP)
            acc_e += tl.where(inside, e, 0.0)
            acc_h += tl.where(inside, h, 0.0)
            acc_raw += tl.where(inside, raw, 0.0)
            if CLIP:
                acc_cut += tl.where(inside & (raw > clip), 1.0, 0.0)
        tl.store(out_ptr + tok, tl.sum(acc_e, 0))
        tl.store(out_ptr + n_tokens + tok, tl.sum(acc_h, 0))
        tl.store(out_ptr + 2 * n_tokens + tok, tl.sum(acc_raw, 0))
        tl.store(out_ptr + 3 * n_tokens + tok, tl.sum(acc_cut, 0))

    @triton.jit
    def _logit_grad_kernel(s_ptr, token_of_row_ptr, t_ptr, lse_ptr, h_sum_ptr, w_ptr, g_ptr, n_tokens, vocab, tau,
                           beta, log_w_s, log_w_t, clip, MODE: tl.constexpr, CLIP: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        tok = tl.load(token_of_row_ptr + row)
        g_row = g_ptr + row * vocab
        if tok < 0:  # a row that scores no token (prompt, padding): zero gradient
            for start in range(0, vocab, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                tl.store(g_row + cols, tl.zeros([BLOCK], tl.float32).to(g_ptr.dtype.element_ty), mask=cols < vocab)
        else:
            s_row = s_ptr + row * vocab
            t_row = t_ptr + tok * vocab
            lse_s = tl.load(lse_ptr + tok)
            lse_t = tl.load(lse_ptr + n_tokens + tok)
            h_sum = tl.load(h_sum_ptr + tok)
            w = tl.load(w_ptr + tok)
            for start in range(0, vocab, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                inside = cols < vocab
                a, _, h, _ = _tile(s_row, t_row, cols, inside, tau, lse_s, lse_t, beta, log_w_s, log_w_t, clip, MODE,
                                   CLIP)
                g = w * (h - tl.exp(a) * h_sum) / tau
                tl.store(g_row + cols, g.to(g_ptr.dtype.element_ty), mask=inside)


# ----------------------------------------------------------------------------- launchers


def row_stats(flat: torch.Tensor, student_index: torch.Tensor, teacher_rows: torch.Tensor,
              temperature: float) -> torch.Tensor:
    """``[2, 2, N]`` float32: ``[0]`` this rank's max of (s, t) per token, ``[1]`` its sum of exp(x - max)."""
    n, vocab = student_index.numel(), flat.shape[1]
    out = torch.empty(2, 2, n, dtype=torch.float32, device=flat.device)
    if n:
        _row_stats_kernel[(n,)](flat, student_index, teacher_rows, out, n, vocab, float(temperature),
                                BLOCK=_block(vocab), num_warps=NUM_WARPS)
    return out


def summands(flat: torch.Tensor, student_index: torch.Tensor, teacher_rows: torch.Tensor, lse: torch.Tensor,
             beta: float, temperature: float, element_clip: float | None) -> torch.Tensor:
    """``[4, N]`` float32: this rank's share of ``D`` (element-clipped), of ``H``, of ``sum_v e_v`` (before
    the clip) and of the count of entries with ``e_v > clip`` (0 without an element clip), per token."""
    n, vocab = student_index.numel(), flat.shape[1]
    out = torch.empty(4, n, dtype=torch.float32, device=flat.device)
    if n:
        _summands_kernel[(n,)](flat, student_index, teacher_rows, lse, out, n, vocab,
                               **_scalars(beta, temperature, element_clip), BLOCK=_block(vocab), num_warps=NUM_WARPS)
    return out


def logit_grad(flat: torch.Tensor, token_of_row: torch.Tensor, teacher_rows: torch.Tensor, lse: torch.Tensor,
               h_sum: torch.Tensor, token_grad: torch.Tensor, beta: float, temperature: float,
               element_clip: float | None) -> torch.Tensor:
    """``[R, V_r]`` gradient of ``sum_k w_k D_k`` w.r.t. the student logits rows, in their dtype.

    ``token_of_row [R]`` long: the token a row scores, -1 for none. ``token_grad [N]`` float32: ``w``.
    """
    rows, vocab = flat.shape
    grad = torch.empty_like(flat)
    if rows:
        _logit_grad_kernel[(rows,)](flat, token_of_row, teacher_rows, lse, h_sum, token_grad, grad,
                                    teacher_rows.shape[0], vocab, **_scalars(beta, temperature, element_clip),
                                    BLOCK=_block(vocab), num_warps=NUM_WARPS)
    return grad
