"""SFT, the paper's supervised baseline: teacher-forced cross-entropy (a reference, not a paper equation).

The student is trained on ``chat(problem) ; reference solution``: every scored token ``y_t`` of
the sequence is predicted from the tokens before it, and

    l_t = -log softmax(z_t)[y_t]          L = sum_t m_t l_t / N

with ``m_t`` the scored tokens (the response only, our default; or the prompt too, as the
official baseline's TRL ``SFTTrainer`` on a plain ``text`` data set) and ``N`` their number in the
batch, or a count given from outside (``num_items``). HF transformers' causal-LM loss is the same
(``ForCausalLMLoss``: labels -100 on the unscored tokens, shifted by one inside; ``reduction="mean"``,
or ``sum / num_items_in_batch`` under gradient accumulation, where the Trainer passes the token
count of the whole accumulated batch so that the step is one token mean, not a mean of
micro-batch means). Logits are at temperature 1.
"""

from __future__ import annotations

import torch

from .checks import check_ndim
from .opsd import masked_token_mean
from .sampled_token import token_log_probs


def sft_loss(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
             num_items: float | None = None) -> torch.Tensor:
    """``sum_t m_t (-log softmax(z_t)[y_t]) / N``.

    Args:
        logits: ``[B, T, V]``, position t predicting ``targets[:, t]`` (already shifted: for a
            sequence ``x``, ``logits[:, :-1]`` of the model on ``x`` and ``targets = x[:, 1:]``).
        targets: ``[B, T]`` long, valid ids everywhere (e.g. the pad id where ``mask`` is False).
        mask: ``[B, T]`` bool, the scored targets.
        num_items: ``N``; None: the number of True entries of ``mask`` (0 scored tokens: loss 0).
    """
    check_ndim("logits", logits, 3, "[B, T, V]")
    if targets.shape != logits.shape[:2] or mask.shape != targets.shape:
        raise ValueError(f"targets: shape {tuple(targets.shape)} (mask {tuple(mask.shape)}) does not match "
                         f"[B, T] = {list(logits.shape[:2])}")
    if mask.dtype != torch.bool:
        raise ValueError(f"mask: expected a bool tensor, got {mask.dtype}")
    nll = -token_log_probs(logits, targets, 1.0)
    if num_items is None:
        return masked_token_mean(nll, mask)
    if num_items <= 0:
        raise ValueError(f"num_items: must be > 0, got {num_items}")
    return (nll * mask.to(nll.dtype)).sum() / num_items
