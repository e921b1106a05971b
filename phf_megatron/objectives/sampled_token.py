"""The sampled-token OPSD loss (official ``--use_tinker_loss``): a policy gradient on the rollout token.

Instead of a divergence over the vocabulary, each rollout token ``y_t`` is scored by the two
log-probabilities of that token alone, at the divergence temperature tau:

    a_t = log p_S(y_t) = log softmax(z_S / tau)[y_t]        (student, differentiable)
    b_t = log p_T(y_t) = log softmax(z_T / tau)[y_t]        (teacher, a constant)
    A_t = sg[b_t - a_t]                                      (the advantage, detached)
    l_t = -A_t * a_t          L = mean over response tokens of l_t

so ``dL/dz_S = -A_t (onehot(y_t) - p_S) / tau`` per token: the per-token reverse KL's
REINFORCE estimator (Thinking Machines, "On-Policy Distillation"). No clip applies.

Official code (commit ``7448751``, ``opsd_trainer.py``): the log-probs at lines 647-652 and
691-695, the loss at lines 705-726 (``-(advantage * student_log_probs_sampled_masked).mean()``
over the tokens whose label is not -100); the flag at ``opsd_train.py`` lines 28-34 and 276.
"""

from __future__ import annotations

import torch

from .checks import check_ndim
from .opsd import log_probs, masked_token_mean


def token_log_probs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """``log softmax(z / tau)[y]``: ``[..., V]`` logits and ``[...]`` token ids → ``[...]``."""
    return log_probs(logits, temperature).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def sampled_token_terms(student_token_lp: torch.Tensor, teacher_token_lp: torch.Tensor) -> torch.Tensor:
    """``l_t = -sg[b_t - a_t] * a_t`` per token (the advantage is detached: only ``a_t`` carries gradient)."""
    advantage = (teacher_token_lp - student_token_lp).detach()
    return -(advantage * student_token_lp)


def sampled_token_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    tokens: torch.Tensor,
    mask: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """``L = mean_t l_t`` over the True entries of ``mask``.

    Args:
        student_logits, teacher_logits: ``[B, T, V]``, position t of both predicting ``tokens[:, t]``.
        tokens: ``[B, T]`` long, the rollout tokens y.
        mask: ``[B, T]`` bool, the scored tokens.
        temperature: tau (official: the rollout temperature).
    """
    check_ndim("student_logits", student_logits, 3, "[B, T, V]")
    if tokens.shape != student_logits.shape[:2] or mask.shape != tokens.shape:
        raise ValueError(f"tokens: shape {tuple(tokens.shape)} (mask {tuple(mask.shape)}) does not match "
                         f"[B, T] = {list(student_logits.shape[:2])}")
    if temperature <= 0:
        raise ValueError(f"temperature: must be > 0, got {temperature}")
    a = token_log_probs(student_logits, tokens, temperature)
    b = token_log_probs(teacher_logits.detach(), tokens, temperature)
    return masked_token_mean(sampled_token_terms(a, b), mask)
