"""Window selection: the deterministic position set W = {w_1 < ... < w_m} of Section 3.2.

The flow term is computed over at most |W| = 128 generated (rollout) positions per sample,
"selected deterministically to cover the rollout". We take the first and the last generated
token and space the rest evenly between them by integer arithmetic, so the same rollout
always yields the same window on every rank and every run.
"""

from __future__ import annotations

import torch

from .checks import check_ndim
from .config import DEFAULT_WINDOW_BUDGET


def evenly_spaced_indices(n: int, budget: int) -> list[int]:
    """Indices ``0 <= k_0 < ... < k_{m-1} = n-1`` into ``n`` items, ``m = min(n, budget)``.

    ``k_i = floor(i * (n - 1) / (m - 1))``: the first and last items are always kept, and
    because ``(n - 1) / (m - 1) >= 1`` the indices are strictly increasing.
    """
    if n <= budget:
        return list(range(n))
    if budget == 1:
        return [n - 1]
    return [(i * (n - 1)) // (budget - 1) for i in range(budget)]


def select_window(generated: torch.Tensor, budget: int = DEFAULT_WINDOW_BUDGET) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose the flow window from a mask of generated positions.

    Args:
        generated: ``[B, T]`` bool, True where position t holds a generated (rollout) token.
        budget: the largest window, |W| (paper: 128).

    Returns:
        positions: ``[B, m]`` long, increasing positions into the T axis, ``m = min(budget,
            max_b n_b)`` where ``n_b`` is the number of generated tokens of row b. Padding
            entries repeat the row's last valid position (0 for an empty row), so they always
            index inside the sequence.
        valid: ``[B, m]`` bool, a True prefix per row marking the real window entries.
    """
    check_ndim("generated", generated, 2, "[B, T]")
    if generated.dtype != torch.bool:
        raise ValueError(f"generated: expected a bool tensor, got {generated.dtype}")
    if budget < 1:
        raise ValueError(f"budget: must be >= 1, got {budget}")
    rows = [torch.nonzero(row, as_tuple=False).flatten().tolist() for row in generated.cpu()]
    m = max(1, min(budget, max((len(r) for r in rows), default=0)))
    positions = torch.zeros(len(rows), m, dtype=torch.long)
    valid = torch.zeros(len(rows), m, dtype=torch.bool)
    for b, gen_pos in enumerate(rows):
        chosen = [gen_pos[k] for k in evenly_spaced_indices(len(gen_pos), budget)]
        if chosen:
            positions[b, : len(chosen)] = torch.tensor(chosen)
            positions[b, len(chosen):] = chosen[-1]
            valid[b, : len(chosen)] = True
    return positions.to(generated.device), valid.to(generated.device)
