"""Logits of the scored positions only: the last stage stops at the final norm, then projects N rows.

OPSD scores the N rollout tokens of a micro-batch, fewer than its ``B * T`` positions (prompts
and padding score nothing: 3,712 of the student's 5,120 and of the teacher's 7,168 positions in
the Qwen3-1.7B benchmark). Megatron's output layer would project every position and return
``[B, T, V/tp]`` logits (a transposed copy of ``[T, B, V/tp]``), whose unscored rows the loss
then drops. Here the last stage returns the hidden states after the final norm
(``models.lm_head.final_hidden_states``), ``scored_rows`` picks the N scored ones and
``scored_logits`` projects them with the output weight: the output layer's FLOPs, the logits
tensor, its transposed copies and its gradient shrink to the scored rows.

Tensor parallelism: the output weight holds ``V/tp`` vocabulary rows per TP rank, so every rank
needs all N hidden rows (as Megatron's own output layer needs the whole sequence). Under
sequence parallelism each rank holds ``T/tp`` positions: it copies the scored rows it owns into
a zero ``[N, H]`` buffer and one all-reduce completes them (N rows travel, not ``T * B``). The
loss is split over the vocabulary, so each rank's gradient w.r.t. the rows is partial: the
backward sums it over TP (all-reduce; Megatron's ``copy_to_tensor_model_parallel_region`` does
the same without SP) and scatters the rows this rank owns into its shard's gradient.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .collectives import all_reduce_, group_size
from .window_rows import WindowIndex, local_seq_range


def score_entries(score_index: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(position, sample)`` of each scored row from the flat ``b * T + t`` index."""
    return score_index % seq_len, torch.div(score_index, seq_len, rounding_mode="floor")


class _ScoredRows(torch.autograd.Function):
    """``[s_local, B, H]`` -> ``[N, H]`` complete on every TP rank; backward: TP sum, then scatter."""

    @staticmethod
    def forward(ctx, hidden, where, tp_group, sequence_parallel):
        rows = where.mask(where.take(hidden))
        if sequence_parallel:
            all_reduce_(rows, tp_group)
        ctx.where, ctx.shape, ctx.tp_group = where, hidden.shape, tp_group
        return rows

    @staticmethod
    def backward(ctx, grad_rows):
        grad_rows = all_reduce_(grad_rows.clone(), ctx.tp_group)  # the vocabulary shards' partial gradients
        grad = torch.zeros(ctx.shape, dtype=grad_rows.dtype, device=grad_rows.device)
        return ctx.where.add_grad(grad, ctx.where.mask(grad_rows)), None, None, None


def scored_rows(hidden: torch.Tensor, score_index: torch.Tensor, seq_len: int, tp_group: dist.ProcessGroup | None,
                sequence_parallel: bool) -> torch.Tensor:
    """The hidden rows ``[N, H]`` of the scored positions, differentiably (see the module docstring).

    Args:
        hidden: ``[s_local, B, H]`` final-norm output (``s_local = T / tp`` under SP).
        score_index: ``[N]`` long, flat ``b * T + t`` of each scored position (``PhfMicroBatch``).
        seq_len: ``T``, the full sequence length.
    """
    start, _ = local_seq_range(hidden.shape[0], tp_group, sequence_parallel)
    position, sample = score_entries(score_index, seq_len)
    where = WindowIndex.of_entries(position, sample, hidden.shape[1], start, hidden.shape[0], sequence_parallel)
    if group_size(tp_group) == 1:
        return where.take(hidden)  # autograd's own index_select backward
    return _ScoredRows.apply(hidden, where, tp_group, sequence_parallel)


def scored_logits(model, hidden: torch.Tensor, score_index: torch.Tensor, seq_len: int,
                  tp_group: dist.ProcessGroup | None, sequence_parallel: bool) -> torch.Tensor:
    """``[N, V/tp]`` logits of the scored positions: ``scored_rows @ W^T`` with the model's output weight."""
    from ..models.lm_head import output_weight

    return scored_rows(hidden, score_index, seq_len, tp_group, sequence_parallel) @ output_weight(model).t()
