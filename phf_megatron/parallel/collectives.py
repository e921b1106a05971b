"""Thin wrappers over ``torch.distributed`` that take the group explicitly.

``group=None`` means "no parallelism here": every helper is then the identity, so the same code
runs single-process (tests, TP=1) without branching at the call sites. Nothing here is
differentiable; the autograd Functions that use them state their backward themselves.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def group_size(group: dist.ProcessGroup | None) -> int:
    return 1 if group is None else dist.get_world_size(group)


def group_rank(group: dist.ProcessGroup | None) -> int:
    return 0 if group is None else dist.get_rank(group)


def all_reduce_(x: torch.Tensor, group: dist.ProcessGroup | None, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """In-place all-reduce of ``x`` over ``group`` (identity for a group of one); returns ``x``."""
    if group_size(group) > 1:
        dist.all_reduce(x, op=op, group=group)
    return x
