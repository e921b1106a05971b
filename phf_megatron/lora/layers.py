"""Tensor-parallel LoRA around Megatron's column- and row-parallel linears.

LoRA (PEFT semantics): ``y = W x + (alpha / r) * B A dropout(x)`` with one adapter pair per HF
projection — q, k, v inside the fused ``linear_qkv``, gate and up inside ``linear_fc1``, o in
``linear_proj``, down in ``linear_fc2`` — so a trained adapter exports to a PEFT directory as is.

Sharding follows the base weight, ``p`` = tensor-parallel size:

* column-parallel ``W = [W_1; ...; W_p]`` (split on outputs): ``A`` ``[r, in]`` is replicated,
  ``B = [B_1; ...; B_p]`` is split on outputs like ``W``. Each rank computes ``B_k A x`` for its
  output shard. ``x`` is gathered across the sequence-parallel region (or copied, without SP)
  exactly as the base layer gathers it, so the partial input gradients sum up correctly; ``A``
  enters the product through ``copy_to_tensor_model_parallel_region`` (identity forward,
  all-reduce backward), so ``dA = sum_k dA_k`` is identical on every rank.
* row-parallel ``W = [W_1, ..., W_p]`` (split on inputs): ``A = [A_1, ..., A_p]`` is split on
  inputs, ``B`` ``[out, r]`` is replicated. ``a = sum_k A_k x_k`` is all-reduced (or
  reduce-scattered along the sequence with SP — an r-wide tensor, cheap), then ``B a`` is added
  to the base output. With SP each rank holds a sequence slice, so ``B`` is also wrapped in
  ``copy_to_tensor_model_parallel_region`` to sum its gradient over the slices.

LoRA dropout (training only): a column-parallel input is whole on every rank, so its masks (one per HF
projection) come from the default generator, equal on every TP rank; a row-parallel input is a feature shard,
so each rank draws its shard's mask from Megatron's model-parallel RNG tracker (else every shard got one mask).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes
from megatron.core.tensor_parallel.random import get_cuda_rng_tracker
from megatron.core.tensor_parallel.mappings import (
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
)


@dataclass(frozen=True)
class Segment:
    """One HF projection inside a (possibly fused) Megatron linear: its name and local width."""

    name: str
    local_features: int


def concat_layout(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """``[gate_k ; up_k]``: Megatron's per-rank layout of the SwiGLU ``linear_fc1``."""
    return torch.cat(list(parts), dim=-1)


def qkv_layout(num_local_groups: int) -> Callable[[Sequence[torch.Tensor]], torch.Tensor]:
    """Megatron's per-rank ``linear_qkv`` layout: per query group ``[q (heads/groups × d), k (d), v (d)]``."""

    def interleave(parts: Sequence[torch.Tensor]) -> torch.Tensor:
        q, k, v = parts
        lead = q.shape[:-1]
        grouped = [t.reshape(*lead, num_local_groups, t.shape[-1] // num_local_groups) for t in (q, k, v)]
        return torch.cat(grouped, dim=-1).reshape(*lead, -1)

    return interleave


def init_seed(base_seed: int, name: str) -> int:
    """A per-adapter seed that depends on the adapter's global name only (not on the layout)."""
    return (base_seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63


class LoRAAdapter(torch.nn.Module):
    """One ``(A, B)`` pair. ``A``: ``[r, in_local]``, ``B``: ``[out_local, r]``.

    PEFT's init: ``B = 0`` and ``A`` kaiming-uniform (``U(-1/sqrt(in), 1/sqrt(in))`` over the *full*
    input width). ``A`` is drawn whole from a generator seeded by the adapter's name and then
    sliced to this rank's input shard (``in_shard``), so every TP/PP layout starts from the same
    adapters and runs the same update.
    """

    def __init__(self, in_features: int, out_features: int, rank: int, dtype: torch.dtype, device=None, *,
                 seed: int = 0, in_shard: slice | None = None):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        bound = 1.0 / math.sqrt(in_features)
        full_a = torch.empty(rank, in_features, dtype=torch.float32).uniform_(-bound, bound, generator=gen)
        a = full_a[:, in_shard] if in_shard is not None else full_a
        self.lora_A = torch.nn.Parameter(a.to(dtype=dtype, device=device).contiguous())
        self.lora_B = torch.nn.Parameter(torch.zeros(out_features, rank, dtype=dtype, device=device))


class _LoRAWrapper(torch.nn.Module):
    """Common state: the frozen base layer, named adapters, scale, dropout, on/off switch."""

    def __init__(self, base: torch.nn.Module, rank: int, alpha: float, dropout: float):
        super().__init__()
        self.base = base
        self.rank = rank
        self.scaling = alpha / rank
        self.dropout = torch.nn.Dropout(dropout) if dropout > 0 else torch.nn.Identity()
        self.adapters = torch.nn.ModuleDict()
        self.enabled = True  # False runs the base layer alone (the "fixed teacher")
        self.tp_group = base.tp_group
        self.sequence_parallel = base.sequence_parallel
        for p in base.parameters():
            p.requires_grad_(False)

    def __getattr__(self, name):
        """Attributes Megatron reads off a linear (``weight``, ``config``, sizes) come from the base."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["base"], name)

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        """Checkpoint only the base layer's tensors under its own names (adapters are saved apart)."""
        return self.base.sharded_state_dict(prefix, sharded_offsets, metadata)


class LoRAColumnParallelLinear(_LoRAWrapper):
    """LoRA around a ``ColumnParallelLinear`` holding one or more HF projections (``segments``)."""

    def __init__(self, base, segments: Sequence[Segment], layout, targets: Sequence[str], rank: int,
                 alpha: float, dropout: float, seeds: dict[str, int] | None = None):
        super().__init__(base, rank, alpha, dropout)
        self.layout = layout
        self.segments = tuple(segments)
        dtype, device = base.weight.dtype, base.weight.device
        for seg in segments:
            if seg.name in targets:
                adapter = LoRAAdapter(base.input_size, seg.local_features, rank, dtype, device,
                                      seed=(seeds or {}).get(seg.name, 0))
                set_tensor_model_parallel_attributes(adapter.lora_B, True, 0, 1)
                self.adapters[seg.name] = adapter
        if sum(s.local_features for s in segments) != base.output_size_per_partition:
            raise ValueError(
                f"segments: local widths {[s.local_features for s in segments]} do not add up to the base "
                f"layer's {base.output_size_per_partition} output features per rank"
            )

    def forward(self, x: torch.Tensor, *args, **kwargs):
        out, bias = self.base(x, *args, **kwargs)
        if not self.enabled:
            return out, bias
        if self.sequence_parallel:
            x_full = gather_from_sequence_parallel_region(x, group=self.tp_group)
        else:
            x_full = copy_to_tensor_model_parallel_region(x, group=self.tp_group)
        parts = []
        for seg in self.segments:
            if seg.name not in self.adapters:  # an untargeted projection of a fused layer
                parts.append(x_full.new_zeros(*x_full.shape[:-1], seg.local_features))
                continue
            adapter = self.adapters[seg.name]
            # a dropout mask per HF projection, as PEFT (q, k, v, gate, up are separate modules there)
            lora_a = copy_to_tensor_model_parallel_region(adapter.lora_A, group=self.tp_group)
            a = F.linear(self.dropout(x_full), lora_a)
            parts.append(F.linear(a, adapter.lora_B))
        return out + self.scaling * self.layout(parts), bias


class LoRARowParallelLinear(_LoRAWrapper):
    """LoRA around a ``RowParallelLinear`` (one HF projection: o_proj or down_proj)."""

    def __init__(self, base, name: str, rank: int, alpha: float, dropout: float, seed: int = 0):
        super().__init__(base, rank, alpha, dropout)
        dtype, device = base.weight.dtype, base.weight.device
        k, width = (base.tp_group.rank() if base.tp_group is not None else 0), base.input_size_per_partition
        adapter = LoRAAdapter(base.input_size, base.output_size, rank, dtype, device, seed=seed,
                              in_shard=slice(k * width, (k + 1) * width))
        set_tensor_model_parallel_attributes(adapter.lora_A, True, 1, 1)
        self.adapters[name] = adapter

    def forward(self, x: torch.Tensor, *args, **kwargs):
        out, bias = self.base(x, *args, **kwargs)
        if not self.enabled:
            return out, bias
        (adapter,) = self.adapters.values()
        if self.training and isinstance(self.dropout, torch.nn.Dropout) and self.tp_group is not None \
                and self.tp_group.size() > 1:
            # x is this rank's shard of the features: its own mask (the model-parallel RNG, as Megatron's dropout
            # in TP regions), not the default generator's, which is equal on every TP rank (one mask for all shards)
            with get_cuda_rng_tracker().fork():
                x = self.dropout(x)
        else:
            x = self.dropout(x)
        a_partial = F.linear(x, adapter.lora_A)  # [s, b, r], this rank's input shard
        if self.sequence_parallel:
            a = reduce_scatter_to_sequence_parallel_region(a_partial, group=self.tp_group)
            lora_b = copy_to_tensor_model_parallel_region(adapter.lora_B, group=self.tp_group)
        else:
            a = reduce_from_tensor_model_parallel_region(a_partial, group=self.tp_group)
            lora_b = adapter.lora_B
        return out + self.scaling * F.linear(a, lora_b), bias
