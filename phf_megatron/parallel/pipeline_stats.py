"""The flow share travelling down the pipeline with the activation.

Only the last stage calls the loss function, but every stage computes a share of the flow loss.
Each stage therefore appends ``R`` extra "statistics" rows to the activation it sends:
``[s_local, b_act, H] -> [s_local + R, b_act, H]``. They hold one record per sample, the records
back to back over the ``b_act`` columns (right-padded: one sample per column; packed: every sample
of the micro-batch in the one column, so ``R`` grows with the sample count). Sample b's record is

* a *carrier*: ``C`` elements of value 0 in the pipeline dtype (``C = 3`` for bf16/fp16, 1 for
  float32), the gradient path to the cumulative share of the stages so far. The receiving stage
  adds it to the exact value below, so ``dL/dshare`` reaches every stage's share through
  Megatron's own backward p2p: split into ``C`` parts (``hi = g.to(dtype)``, then the remainders),
  whose sum the sending stage reads back as the float32 gradient (one bf16 element would round
  ``dL/dshare = alpha N_tok / N_flow`` to 8 bits, up to 2^-8 relative, for every stage but the last);
* then the exact float32 bits of ``values[b] = [share, layer values..., pair values...]`` (the
  running per-sample flow share and the per-layer values for the layer-energy logs), bit-cast
  into the pipeline dtype (two bf16/fp16 elements per float32) so that no precision is lost.

The schedule's p2p buffers must be ``R`` rows longer: pass ``pipeline_seq_length(...)`` as the
``seq_length`` of ``forward_backward_func``.
"""

from __future__ import annotations

import math

import torch


def _per_value(dtype: torch.dtype) -> int:
    """Pipeline-dtype elements per float32 value (bit-cast for 16-bit dtypes)."""
    return 2 if torch.finfo(dtype).bits == 16 else 1


def _carrier(dtype: torch.dtype) -> int:
    """Pipeline-dtype elements of the carrier: enough parts to hold a float32 gradient (3 x 8 bits for bf16)."""
    return 3 if torch.finfo(dtype).bits == 16 else 1


def _record(num_values: int, dtype: torch.dtype) -> int:
    """Pipeline-dtype elements of one sample's record: the carrier and ``num_values`` float32 values."""
    return _carrier(dtype) + _per_value(dtype) * num_values


class _SendCarrier(torch.autograd.Function):
    """``[B] -> [B, C]`` zeros in the pipeline dtype; backward: the float32 sum of the C gradient parts."""

    @staticmethod
    def forward(ctx, share, dtype):
        return torch.zeros(share.shape[0], _carrier(dtype), dtype=dtype, device=share.device)

    @staticmethod
    def backward(ctx, grad_parts):
        return grad_parts.float().sum(-1), None


class _ReceiveCarrier(torch.autograd.Function):
    """``[B, C] -> [B]`` float32 zeros; backward: the float32 gradient split into C parts of the carrier's dtype."""

    @staticmethod
    def forward(ctx, carrier):
        ctx.dtype = carrier.dtype
        return torch.zeros(carrier.shape[0], dtype=torch.float32, device=carrier.device)

    @staticmethod
    def backward(ctx, grad):
        rest, parts = grad.float(), []
        for _ in range(_carrier(ctx.dtype)):
            parts.append(rest.to(ctx.dtype))
            rest = rest - parts[-1].float()
        return torch.stack(parts, dim=-1)


def stats_rows(num_values: int, hidden_size: int, dtype: torch.dtype, samples: int = 1, columns: int = 1) -> int:
    """``R``: rows of ``columns x hidden_size`` elements holding ``samples`` records (module docstring)."""
    return math.ceil(samples * _record(num_values, dtype) / (columns * hidden_size))


def pipeline_seq_length(seq_len: int, num_stats_rows: int, tp_size: int, sequence_parallel: bool) -> int:
    """The ``seq_length`` to give ``forward_backward_func`` so its p2p buffers hold the stats rows.

    Megatron sizes them ``seq_length / tp`` (SP) or ``seq_length`` rows; we need ``s_local + R``.
    """
    return seq_len + num_stats_rows * (tp_size if sequence_parallel else 1)


def _encode(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    values = values.detach().float().contiguous()
    return values.view(dtype) if _per_value(dtype) == 2 else values.to(dtype)


def _decode(payload: torch.Tensor, num_values: int) -> torch.Tensor:
    if _per_value(payload.dtype) == 2:  # a copy: one record in place may start at an odd 16-bit offset
        return payload[:, : 2 * num_values].clone(memory_format=torch.contiguous_format).view(torch.float32)
    return payload[:, :num_values].float()


def pack_stats(share: torch.Tensor, values: torch.Tensor, hidden_size: int, dtype: torch.dtype,
               columns: int | None = None, rows: int | None = None) -> torch.Tensor:
    """``[R, columns, H]`` stats rows from the cumulative ``share [B]`` (differentiable) and ``values [B, K]``.

    ``values[:, 0]`` must equal ``share`` (it is the exact value the carrier complements). ``columns``:
    the activation's batch (default ``B``); ``rows``: ``R`` (default: the fewest that hold the records;
    a pipeline sends the step's one ``R``).
    """
    b, k = values.shape
    columns = b if columns is None else columns
    need = stats_rows(k, hidden_size, dtype, b, columns)
    rows = need if rows is None else rows
    if rows < need:
        raise ValueError(f"rows: {rows} stats rows cannot hold {b} records of {k} values (need {need})")
    carrier = _SendCarrier.apply(share, dtype)  # value 0, gradient 1 w.r.t. share (float32, in C parts)
    records = torch.cat([carrier, _encode(values, dtype)], dim=1).reshape(-1)  # [B * record]
    pad = torch.zeros(rows * columns * hidden_size - records.numel(), dtype=dtype, device=values.device)
    return torch.cat([records, pad]).view(columns, rows, hidden_size).transpose(0, 1).contiguous()


def unpack_stats(stats: torch.Tensor, num_values: int, samples: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of ``pack_stats``: ``(share [B] float32, differentiable via the carrier; values [B, K])``;
    ``samples``: ``B`` (default: the stats' columns)."""
    rows, columns, h = stats.shape
    samples = columns if samples is None else samples
    width = _record(num_values, stats.dtype)
    records = stats.transpose(0, 1).reshape(-1)[: samples * width].view(samples, width)
    carrier = _carrier(stats.dtype)
    values = _decode(records[:, carrier:].detach(), num_values)
    share = values[:, 0] + _ReceiveCarrier.apply(records[:, :carrier])
    return share, values


def split_received(received: torch.Tensor, seq_local: int, num_stats_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Split a received pipeline tensor ``[s_local + R, B, H]`` into activation and stats rows."""
    if received.shape[0] != seq_local + num_stats_rows:
        raise ValueError(
            f"received pipeline tensor has {received.shape[0]} rows, expected s_local + R = {seq_local} + "
            f"{num_stats_rows}: pass pipeline_seq_length(...) as forward_backward_func's seq_length"
        )
    return received[:seq_local], received[seq_local:]
