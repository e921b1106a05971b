"""Tensor- and pipeline-parallel layouts of the Qwen3 Megatron tensors (pure functions).

Tensor parallelism (TP = t ranks), following Megatron-Core's parallel layers:

* column-parallel (output rows split in t contiguous chunks): ``linear_qkv`` (whole query
  groups per rank, thanks to the per-group interleave), ``word_embeddings`` and
  ``output_layer`` (vocabulary ranges);
* GLU column-parallel: ``linear_fc1`` = [gate; up]; rank r holds [gate_r; up_r], *not* the
  r-th contiguous chunk of the full tensor;
* row-parallel (input columns split): ``linear_proj``, ``linear_fc2``;
* replicated: every norm weight.

Pipeline parallelism (PP = p stages, even split): stage s holds global layers
[s·L/p, (s+1)·L/p) under local indices 0..L/p-1; the embedding is on the first stage, the
final norm and output layer on the last.
"""

from __future__ import annotations

from typing import Sequence

import torch

from phf_megatron.convert.qwen3_mapping import MCORE_LAYER, canonical_name, split_layer_name

COLUMN, GLU, ROW, REPLICATED = "column", "glu", "row", "replicated"

_KIND = {
    "self_attention.linear_qkv.weight": COLUMN,
    "embedding.word_embeddings.weight": COLUMN,
    "output_layer.weight": COLUMN,
    "mlp.linear_fc1.weight": GLU,
    "self_attention.linear_proj.weight": ROW,
    "mlp.linear_fc2.weight": ROW,
}


def tp_kind(mcore_name: str) -> str:
    """How ``mcore_name`` is split over TP ranks: column, glu, row or replicated."""
    return _KIND.get(split_layer_name(canonical_name(mcore_name))[1], REPLICATED)


def tp_shard(mcore_name: str, full: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s shard of the full tensor (a view where possible)."""
    kind = tp_kind(mcore_name)
    if tp == 1 or kind == REPLICATED:
        return full
    if kind == COLUMN:
        return _chunk(mcore_name, full, tp, 0)[rank]
    if kind == ROW:
        return _chunk(mcore_name, full, tp, 1)[rank]
    gate, up = _chunk(mcore_name, full, 2, 0)
    return torch.cat([_chunk(mcore_name, gate, tp, 0)[rank], _chunk(mcore_name, up, tp, 0)[rank]], 0)


def tp_merge(mcore_name: str, shards: Sequence[torch.Tensor]) -> torch.Tensor:
    """The full tensor from the shards of all TP ranks, in rank order (inverse of ``tp_shard``)."""
    kind = tp_kind(mcore_name)
    if len(shards) == 1 or kind == REPLICATED:
        return shards[0]
    if kind == COLUMN:
        return torch.cat(list(shards), 0)
    if kind == ROW:
        return torch.cat(list(shards), 1)
    halves = [torch.chunk(s, 2, 0) for s in shards]
    return torch.cat([h[0] for h in halves] + [h[1] for h in halves], 0)


def _chunk(name: str, t: torch.Tensor, n: int, dim: int) -> tuple[torch.Tensor, ...]:
    if t.shape[dim] % n:
        raise ValueError(f"{name}: dim {dim} of shape {tuple(t.shape)} does not split into {n} equal parts")
    return torch.chunk(t, n, dim)


# ---- pipeline parallelism ---------------------------------------------------------------

def pp_layer_range(num_layers: int, pp: int, stage: int) -> range:
    """Global layer indices held by pipeline stage ``stage`` (even split)."""
    if num_layers % pp:
        raise ValueError(f"pp: {pp} stages do not divide num_layers={num_layers}")
    if not 0 <= stage < pp:
        raise ValueError(f"stage: expected 0 <= stage < {pp}, got {stage}")
    per = num_layers // pp
    return range(stage * per, (stage + 1) * per)


def to_global_name(local_name: str, layer_offset: int) -> str:
    """Stage-local Megatron name -> full-model name (layer index shifted by ``layer_offset``)."""
    layer, suffix = split_layer_name(local_name)
    return local_name if layer is None else MCORE_LAYER.format(i=layer + layer_offset) + suffix


def to_local_name(global_name: str, layer_offset: int) -> str:
    layer, suffix = split_layer_name(global_name)
    return global_name if layer is None else MCORE_LAYER.format(i=layer - layer_offset) + suffix


def stage_holds(global_name: str, num_layers: int, pp: int, stage: int, tied: bool) -> bool:
    """Whether stage ``stage`` holds ``global_name`` (with tied embeddings the last stage holds a
    copy of the word embeddings as its ``output_layer.weight``)."""
    layer, _ = split_layer_name(canonical_name(global_name))
    if layer is not None:
        return layer in pp_layer_range(num_layers, pp, stage)
    if global_name == "embedding.word_embeddings.weight":
        return stage == 0
    if global_name == "output_layer.weight":
        return stage == pp - 1 and (not tied or pp > 1)
    return stage == pp - 1  # final norm
