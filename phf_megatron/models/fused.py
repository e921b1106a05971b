"""Optional fused kernels for the Qwen3 model (GPU fast paths; eager reference elsewhere).

Each function returns ``None`` when its option is off, so callers keep the eager math.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch


def rmsnorm_fn(config) -> Optional[Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]]:
    """The fused RMSNorm to use for ``config`` (``None``: eager)."""
    if not getattr(config, "fused_rmsnorm", False):
        return None
    return None
