"""The EMA privileged teacher (Section 3.4, Eq. EMA)."""

from __future__ import annotations

from typing import Iterable

import torch

from .config import DEFAULT_EMA_DECAY


@torch.no_grad()
def ema_update(
    teacher_params: Iterable[torch.Tensor],
    student_params: Iterable[torch.Tensor],
    decay: float = DEFAULT_EMA_DECAY,
) -> None:
    """Eq. (EMA): ``theta_bar_k = rho * theta_bar_{k-1} + (1 - rho) * theta_k``, in place.

    The update runs in each teacher tensor's own dtype (keep the EMA in fp32 for
    ``rho = 0.999``: bf16 cannot represent a 0.1% step of most weights).
    """
    if not 0.0 <= decay <= 1.0:
        raise ValueError(f"decay: must lie in [0, 1], got {decay}")
    teacher_params, student_params = list(teacher_params), list(student_params)
    if len(teacher_params) != len(student_params):
        raise ValueError(
            f"teacher_params: {len(teacher_params)} tensors, but student_params has {len(student_params)}"
        )
    for i, (t, s) in enumerate(zip(teacher_params, student_params)):
        if t.shape != s.shape:
            raise ValueError(f"teacher_params[{i}]: shape {tuple(t.shape)} != student shape {tuple(s.shape)}")
        t.lerp_(s.detach().to(t.dtype), 1.0 - decay)

