"""Rows of Megatron activations at the flow window, under sequence parallelism.

Megatron keeps activations as ``[s, b, H]``; with sequence parallelism TP rank r holds the
rows ``[r * s/tp, (r + 1) * s/tp)`` of every sample. The flow needs, per sample b, the rows at
its window positions ``positions[b, i]`` (global sequence indices) — a handful of rows spread
over the TP ranks in any pattern. Each rank copies the rows it owns into a zero ``[B, m, H]``
buffer and one all-reduce over TP completes them: ``rows = sum_r local_r``.

Every TP rank then evaluates the same flow loss on the same rows (the loss is replicated, not
split), so the backward of that all-reduce is the identity: rank r takes ``dL/drows`` for the
rows it owns and scatters them into its shard's gradient. Summing the ranks' gradients there
(a reduce-scatter, as for split losses) would count the loss tp times.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .collectives import all_reduce_, group_rank, group_size


def local_seq_range(seq_local: int, tp_group: dist.ProcessGroup | None, sequence_parallel: bool) -> tuple[int, int]:
    """``[start, stop)`` of the global sequence rows this rank holds (all of them without SP)."""
    start = group_rank(tp_group) * seq_local if sequence_parallel else 0
    return start, start + seq_local


def check_positions(name: str, positions: torch.Tensor, seq_len: int) -> None:
    """Window positions must be a ``[B, m]`` long tensor of indices into a sequence of ``seq_len``."""
    if positions.dim() != 2 or positions.dtype != torch.long:
        raise ValueError(f"{name}: expected a [B, m] long tensor, got {positions.dtype} {tuple(positions.shape)}")
    if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= seq_len):
        raise ValueError(
            f"{name}: window positions must lie in [0, {seq_len}) (the sequence length), "
            f"got min {int(positions.min())} max {int(positions.max())}"
        )


@dataclass(frozen=True)
class WindowIndex:
    """Where the window rows of one micro-batch sit in this rank's ``[s_local, B, H]`` activations.

    Built once per micro-batch and stage (a handful of small kernels), then every layer's rows
    cost one ``index_select`` forward and one ``index_add`` backward, with no host sync.

    ``index [B*m]``: row of window entry ``(b, i)`` in the activation viewed as ``[s_local*B, H]``
    (``local_position * B + b``, clamped into range); ``owned [B*m]`` bool: whether this rank
    holds that row (None when it holds every row: no sequence parallelism).
    """

    index: torch.Tensor
    owned: torch.Tensor | None

    @staticmethod
    def build(positions: torch.Tensor, start: int, seq_local: int, sharded: bool = True) -> "WindowIndex":
        """From ``positions [B, m]`` (global sequence positions per sample)."""
        batch = torch.arange(positions.shape[0], device=positions.device)[:, None].expand_as(positions)
        return WindowIndex.of_entries(positions.reshape(-1), batch.reshape(-1), positions.shape[0], start, seq_local,
                                      sharded)

    @staticmethod
    def of_entries(seq_pos: torch.Tensor, batch: torch.Tensor, batch_size: int, start: int, seq_local: int,
                   sharded: bool = True) -> "WindowIndex":
        """From flat entries: global sequence position ``seq_pos [K]`` of sample ``batch [K]``."""
        local = seq_pos - start
        index = local.clamp(0, seq_local - 1) * batch_size + batch
        owned = ((local >= 0) & (local < seq_local)) if sharded else None
        return WindowIndex(index, owned)

    def take(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The ``[B*m, H]`` rows of ``hidden [s_local, B, H]`` (into ``out`` if given); not masked."""
        flat = hidden.reshape(-1, hidden.shape[-1])
        return torch.index_select(flat, 0, self.index, out=out) if out is not None else flat.index_select(0, self.index)

    def mask(self, rows: torch.Tensor) -> torch.Tensor:
        """``rows [..., B*m, H]`` with the entries another rank owns set to zero (as is without SP)."""
        if self.owned is None:
            return rows
        return torch.where(self.owned[:, None], rows, torch.zeros((), dtype=rows.dtype, device=rows.device))

    def add_grad(self, grad_hidden: torch.Tensor, grad_rows: torch.Tensor) -> torch.Tensor:
        """``grad_hidden`` plus the (masked) ``grad_rows [B*m, H]`` at the window rows, out of place.

        Entries another rank owns must be zero in ``grad_rows`` (``mask``): they add zero at a
        clamped index instead of being filtered out (no boolean indexing, so no host sync).
        """
        flat = grad_hidden.reshape(-1, grad_hidden.shape[-1])
        return flat.index_add(0, self.index, grad_rows.to(grad_hidden.dtype)).view_as(grad_hidden)


def local_window_rows(hidden: torch.Tensor, positions: torch.Tensor, start: int) -> torch.Tensor:
    """This rank's share of the window rows: ``[B, m, H]``, zero where another rank owns the row.

    ``hidden`` is ``[s_local, B, H]``, its first row being global row ``start``.
    """
    where = WindowIndex.build(positions, start, hidden.shape[0])
    return where.mask(where.take(hidden)).view(*positions.shape, hidden.shape[-1])


def add_window_grad(grad_hidden: torch.Tensor, grad_rows: torch.Tensor, positions: torch.Tensor, start: int) -> torch.Tensor:
    """``grad_hidden`` plus ``grad_rows [B, m, H]`` scattered to the owned window rows (out of place)."""
    where = WindowIndex.build(positions, start, grad_hidden.shape[0])
    return where.add_grad(grad_hidden, where.mask(grad_rows.reshape(-1, grad_rows.shape[-1])))


class _GatherWindowRows(torch.autograd.Function):
    """Forward: local rows + all-reduce over TP. Backward: scatter into the local shard (no reduce)."""

    @staticmethod
    def forward(ctx, hidden, positions, tp_group, sequence_parallel):
        start, _ = local_seq_range(hidden.shape[0], tp_group, sequence_parallel)
        rows = local_window_rows(hidden, positions, start)
        if sequence_parallel:
            all_reduce_(rows, tp_group)
        ctx.save_for_backward(positions)
        ctx.start, ctx.shape = start, hidden.shape
        return rows

    @staticmethod
    def backward(ctx, grad_rows):
        (positions,) = ctx.saved_tensors
        grad_hidden = torch.zeros(ctx.shape, dtype=grad_rows.dtype, device=grad_rows.device)
        return add_window_grad(grad_hidden, grad_rows, positions, ctx.start), None, None, None


def gather_window_rows(
    hidden: torch.Tensor,
    positions: torch.Tensor,
    tp_group: dist.ProcessGroup | None = None,
    sequence_parallel: bool = False,
) -> torch.Tensor:
    """The full window rows ``[B, m, H]`` of a Megatron activation, differentiably.

    Args:
        hidden: ``[s_local, B, H]``: this rank's sequence shard under SP (``s_local = s / tp``),
            the whole sequence otherwise.
        positions: ``[B, m]`` long, global sequence positions (into ``[0, s)``).
        tp_group: the tensor-parallel group (None: no TP).
        sequence_parallel: whether ``hidden`` is sharded along the sequence over ``tp_group``.

    Returns ``[B, m, H]`` rows, identical on all TP ranks. The consumer must compute the same
    (replicated) loss on every TP rank: the backward gives each rank the gradient of its own rows.
    """
    seq_len = hidden.shape[0] * (group_size(tp_group) if sequence_parallel else 1)
    check_positions("positions", positions, seq_len)
    if positions.shape[0] != hidden.shape[1]:
        raise ValueError(f"positions: {positions.shape[0]} samples, but hidden has batch {hidden.shape[1]}")
    return _GatherWindowRows.apply(hidden, positions, tp_group, sequence_parallel)
