"""The full PHF objective (Section 3.6, Eq. L_PHF)."""

from __future__ import annotations

import torch

from .config import DEFAULT_FLOW_ALPHA


def phf_objective(opsd: torch.Tensor, flow: torch.Tensor, alpha: float = DEFAULT_FLOW_ALPHA) -> torch.Tensor:
    """Eq. (L_PHF): ``L_PHF = L_OPSD + alpha * L_flow`` (paper: alpha = 0.05 at every scale).

    ``opsd``/``flow`` are the step's means (``opsd_loss``, ``hidden_flow_loss``) or a micro-batch's
    share of them (``parallel.loss``: sums over the step's global counts); either way the result is
    L_PHF or that share of it.
    """
    return opsd + alpha * flow
