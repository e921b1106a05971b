"""The OPSD output loss (paper Section 3.1): a clipped generalized Jensen-Shannon divergence.

Follows the official OPSD code (``siyan-zhao/OPSD``, ``generalized_jsd_loss``):

* log-probabilities at a temperature: ``log p = log_softmax(z / tau)``;
* ``beta = 0``: forward KL(T || S); ``beta = 1``: reverse KL(S || T); otherwise the mixture
  form ``beta KL(T || M) + (1 - beta) KL(S || M)`` with ``M = beta T + (1 - beta) S``;
* the official clip caps each *vocabulary entry's* summand, ``clamp(max=clip)`` on the
  ``[B, T, V]`` terms, before the sum over the vocabulary (``clip_mode="element"``);
  ``clip_mode="token"`` caps each token's summed divergence instead;
* the mean over response tokens (``mask``), each token weighted equally;
* ``top_k`` (official ``--top_k_loss K``): both distributions restricted to the teacher's k
  most likely entries and renormalized over them before the divergence (``top_k_indices``).

Citations are to the official code at its newest commit, ``7448751`` (2026-05-09, forks
``louieworth/OPSD`` / ``shx2005/OPSD``), ``opsd_trainer.py``: ``generalized_jsd_loss`` lines
381-479 (top-k 430-435, mixture 445-460, clip 462-464, masked mean 466-473).
"""

from __future__ import annotations

import torch

from .checks import check_finite, check_ndim, check_same_shape
from .config import CLIP_MODES


def log_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``log softmax(z / tau)`` over the vocabulary, in float32 or wider."""
    dtype = torch.float32 if logits.dtype in (torch.float16, torch.bfloat16) else logits.dtype
    return torch.log_softmax(logits.to(dtype) / temperature, dim=-1)


def kl_terms(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """Summands of ``KL(p || q) = sum_v p_v (log p_v - log q_v)``, element-wise ``[..., V]``.

    A zero-probability entry of p contributes 0 (as ``F.kl_div`` does), even where q is 0 too.
    """
    p = log_p.exp()
    return torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p))


def mixture_log_probs(student_lp: torch.Tensor, teacher_lp: torch.Tensor, beta: float) -> torch.Tensor:
    """``log M = log(beta p_T + (1 - beta) p_S)``, computed in log space."""
    return torch.logaddexp(student_lp + torch.log1p(torch.tensor(-beta, dtype=student_lp.dtype)),
                           teacher_lp + torch.log(torch.tensor(beta, dtype=student_lp.dtype)))


def generalized_jsd_terms(student_lp: torch.Tensor, teacher_lp: torch.Tensor, beta: float) -> torch.Tensor:
    """Element-wise summands ``[..., V]`` of the generalized JSD (Eq. L_OPSD), before any clip."""
    if beta == 0.0:
        return kl_terms(teacher_lp, student_lp)  # KL(T || S)
    if beta == 1.0:
        return kl_terms(student_lp, teacher_lp)  # KL(S || T)
    log_m = mixture_log_probs(student_lp, teacher_lp, beta)
    return beta * kl_terms(teacher_lp, log_m) + (1.0 - beta) * kl_terms(student_lp, log_m)


def top_k_indices(teacher_logits: torch.Tensor, k: int) -> torch.Tensor:
    """``I = top-k(z_T)``: the k vocabulary entries with the largest teacher logits, ``[..., k]`` long.

    The official code takes ``torch.topk`` of ``z_T / tau`` (lines 430-433; the same set as of
    ``z_T``). ``torch.topk`` leaves ties at the k-th value to the implementation; here they go to
    the lower vocabulary index, so every tensor-parallel layout selects the same set. The
    entries come in ascending vocabulary order.
    """
    vocab = teacher_logits.shape[-1]
    if not 1 <= k <= vocab:
        raise ValueError(f"top_k: must lie in [1, {vocab}] (the vocabulary), got {k}")
    kth = teacher_logits.topk(k, dim=-1, sorted=False).values.amin(-1, keepdim=True)
    above = teacher_logits > kth
    tied = teacher_logits == kth
    room = k - above.sum(-1, keepdim=True)
    take = above | (tied & (tied.cumsum(-1) <= room))  # exactly k per row
    return take.to(torch.int8).topk(k, dim=-1, sorted=False).indices.sort(-1).values


def restrict_to_top_k(student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                      k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(z_S[I], z_T[I])`` over ``I = top_k_indices(z_T, k)``, ``[..., k]`` each (lines 430-435).

    ``log_probs`` of the result renormalizes both distributions over I:
    ``p_I(v) = exp(z_v / tau) / sum_{u in I} exp(z_u / tau)``. The gradient reaches the student's
    logits at I only.
    """
    index = top_k_indices(teacher_logits, k)
    return student_logits.gather(-1, index), teacher_logits.gather(-1, index)


def clip_statistics(terms: torch.Tensor, clip: float | None, clip_mode: str = "element") -> tuple[torch.Tensor, torch.Tensor]:
    """What the clip removed, per token: ``(D_raw, n_cut)``, both ``[...]`` (diagnostics, no gradient).

    ``D_raw = sum_v e_v`` is the divergence before the clip. ``n_cut`` counts the vocabulary
    entries with ``e_v > clip`` (element clip), or is 1 where ``D_raw > clip`` (token clip);
    0 without a clip. ``torch.clamp(max=clip)`` changes exactly these entries.
    """
    raw = terms.sum(-1)
    if clip is None:
        return raw, torch.zeros_like(raw)
    if clip_mode == "element":
        return raw, (terms > clip).sum(-1).to(raw.dtype)
    return raw, (raw > clip).to(raw.dtype)


def clipped_token_divergence(terms: torch.Tensor, clip: float | None, clip_mode: str = "element") -> torch.Tensor:
    """Sum the ``[..., V]`` summands over the vocabulary after the chosen clip → ``[...]``."""
    if clip is None:
        return terms.sum(-1)
    if clip_mode == "element":
        return terms.clamp(max=clip).sum(-1)
    if clip_mode == "token":
        return terms.sum(-1).clamp(max=clip)
    raise ValueError(f"clip_mode: expected one of {CLIP_MODES}, got {clip_mode!r}")


def masked_token_mean(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the True entries of ``mask``; 0 (with a zero gradient) when there are none."""
    weights = mask.to(per_token.dtype)
    return (per_token * weights).sum() / weights.sum().clamp(min=1)


def _validate(student_logits, teacher_logits, mask, beta, temperature, clip, clip_mode, top_k, check_inputs):
    check_ndim("student_logits", student_logits, 3, "[B, T, V]")
    check_same_shape("student_logits", student_logits, "teacher_logits", teacher_logits)
    if mask.shape != student_logits.shape[:2]:
        raise ValueError(f"mask: shape {tuple(mask.shape)} does not match [B, T] = {list(student_logits.shape[:2])}")
    if mask.dtype != torch.bool:
        raise ValueError(f"mask: expected a bool tensor, got {mask.dtype}")
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta: must lie in [0, 1], got {beta}")
    if temperature <= 0:
        raise ValueError(f"temperature: must be > 0, got {temperature}")
    if clip is not None and clip <= 0:
        raise ValueError(f"clip: must be > 0 or None, got {clip}")
    if clip_mode not in CLIP_MODES:
        raise ValueError(f"clip_mode: expected one of {CLIP_MODES}, got {clip_mode!r}")
    if top_k is not None and not 1 <= top_k <= student_logits.shape[-1]:
        raise ValueError(f"top_k: must lie in [1, {student_logits.shape[-1]}] (the vocabulary) or be None, got {top_k}")
    if check_inputs:
        check_finite("student_logits", student_logits)
        check_finite("teacher_logits", teacher_logits)


def opsd_token_divergence(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    beta: float = 0.5,
    temperature: float = 1.0,
    clip: float | None = None,
    clip_mode: str = "element",
    top_k: int | None = None,
) -> torch.Tensor:
    """Per-token clipped divergence ``[B, T]`` (no masking, no validation); over the teacher's
    top-k entries when ``top_k`` is set."""
    if top_k is not None:
        student_logits, teacher_logits = restrict_to_top_k(student_logits, teacher_logits.detach(), top_k)
    student_lp = log_probs(student_logits, temperature)
    teacher_lp = log_probs(teacher_logits.detach(), temperature)
    return clipped_token_divergence(generalized_jsd_terms(student_lp, teacher_lp, beta), clip, clip_mode)


def opsd_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    mask: torch.Tensor,
    beta: float = 0.5,
    temperature: float = 1.0,
    clip: float | None = None,
    clip_mode: str = "element",
    top_k: int | None = None,
    check_inputs: bool = True,
) -> torch.Tensor:
    """``L_OPSD``: the masked mean over response tokens of the clipped generalized JSD.

    Args:
        student_logits, teacher_logits: ``[B, T, V]``, aligned so that position t of both
            predicts the same rollout token. The teacher is detached.
        mask: ``[B, T]`` bool, True on response tokens that enter the loss.
        beta: 0 → KL(T || S), 1 → KL(S || T), otherwise the generalized JSD.
        temperature: softmax temperature (the official code uses the rollout temperature).
        clip: the cap (paper: 0.05 for 1.7B/4B, 0.06 for 8B), or None for no clip.
        clip_mode: ``"element"`` (official: per vocabulary entry) or ``"token"``.
        top_k: None (the whole vocabulary) or k: both distributions restricted to the teacher's
            k most likely entries and renormalized over them (official ``--top_k_loss``).
    """
    _validate(student_logits, teacher_logits, mask, beta, temperature, clip, clip_mode, top_k, check_inputs)
    per_token = opsd_token_divergence(student_logits, teacher_logits, beta, temperature, clip, clip_mode, top_k)
    return masked_token_mean(per_token, mask)
