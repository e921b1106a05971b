"""Thin wrappers over ``torch.distributed`` that take the group explicitly.

``group=None`` means "no parallelism here": every helper is then the identity, so the same code
runs single-process (tests, TP=1) without branching at the call sites. Nothing here is
differentiable except ``AllReduceSum``, whose backward is stated; the other autograd Functions
that use these helpers state their backward themselves.
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


def all_gather(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """``[world, *x.shape]``: ``x`` of every rank of ``group`` in rank order (``x[None]`` for a group of one)."""
    if group_size(group) == 1:
        return x[None]
    parts = [torch.empty_like(x) for _ in range(group_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.stack(parts)


class AllReduceSum(torch.autograd.Function):
    """Forward: the sum over ``group``; backward: the identity (Megatron's ``reduce_from_tensor_model_parallel_region``).

    For a tensor each rank fills with its own disjoint share (zeros elsewhere) whose sum every
    rank then uses identically: each rank's share receives the whole gradient.
    """

    @staticmethod
    def forward(ctx, x, group):
        return all_reduce_(x.clone(), group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None
