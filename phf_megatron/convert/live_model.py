"""HF weights into and out of a live, sharded Megatron Qwen3 model, tensor by tensor.

* ``load_hf_weights(model, get_hf, arch)``: fill this rank's parameters (its pipeline stage,
  its TP shard) from HF tensors read through ``get_hf(hf_name)`` (e.g. ``HFCheckpoint.get``).
* ``iter_hf_weights(model, arch, tp_group=, pp_group=)``: yield ``(hf_name, full_tensor)`` from
  the sharded model, gathering the TP shards of one tensor at a time (the weight sync of the
  rollout engine, and the Megatron -> HF export).

Collective contract of ``iter_hf_weights``: every rank of ``tp_group`` must iterate it to the
end together (each tensor is one ``all_gather`` over TP, in the same order on every TP rank,
since TP ranks of one stage hold the same parameter names). Without ``pp_group`` a rank yields
only its own stage's tensors; with it, every rank of ``pp_group`` yields the whole model, each
tensor broadcast from the stage that owns it, stage by stage (all PP ranks must iterate).
With tied embeddings the head is the embedding, yielded once as ``model.embed_tokens.weight``.
Yielded tensors may alias parameters (unsplit, unsharded ones): copy before modifying them.
LoRA-wrapped linears (``phf_megatron.lora``) are read through: their base weight appears under
the base layer's own name and the adapter tensors are skipped; to export the merged weights pass
``select=phf_megatron.lora.merged_weight_selector(model)``. Any other parameter outside the Qwen3
map raises ``KeyError`` naming it.
"""

from __future__ import annotations

from typing import Callable, Iterator, Optional

import torch
import torch.distributed as dist

from phf_megatron.convert.qwen3_mapping import (MCORE_LAYER, canonical_name, hf_shapes, hf_sources,
                                                hf_to_mcore, mcore_to_hf, split_layer_name)
from phf_megatron.convert.sharding import REPLICATED, tp_kind, tp_merge, tp_shard
from phf_megatron.models.provider import unwrap
from phf_megatron.models.qwen3_arch import Qwen3Arch


def global_name(model, local_name: str) -> str:
    """Full-model Megatron name of a parameter of this (pipeline-stage) model, local spelling."""
    layer, suffix = split_layer_name(local_name)
    if layer is None:
        return canonical_name(local_name)
    index = unwrap(model).decoder.layers[layer].layer_number - 1  # layer_number: global, 1-based
    return canonical_name(MCORE_LAYER.format(i=index) + suffix)


def _tp_rank_size(tp_group) -> tuple[int, int]:
    if tp_group is None:
        from megatron.core import parallel_state

        return (parallel_state.get_tensor_model_parallel_rank(),
                parallel_state.get_tensor_model_parallel_world_size())
    return dist.get_rank(tp_group), dist.get_world_size(tp_group)


def _named_weights(model) -> Iterator[tuple[str, torch.nn.Parameter]]:
    """Base-model parameters under their Megatron names (LoRA wrappers read through)."""
    for name, param in unwrap(model).named_parameters():
        if ".adapters." in name:
            continue  # a LoRA adapter tensor: not part of the base model
        yield name.replace(".base.", "."), param


def load_hf_weights(model, get_hf: Callable[[str], torch.Tensor], arch: Qwen3Arch,
                    tp_group: Optional[dist.ProcessGroup] = None,
                    on_tensor: Optional[Callable[[str], None]] = None) -> None:
    """Copy HF weights into this rank's shard of ``model`` (one Megatron tensor at a time).

    ``get_hf(hf_name)`` returns a full HF tensor (``HFCheckpoint.get`` or ``state_dict.__getitem__``);
    ``on_tensor(name)`` is called after each parameter (progress bars).
    """
    tp_rank, tp_size = _tp_rank_size(tp_group)
    with torch.no_grad():
        for name, param in _named_weights(model):
            full_name = global_name(model, name)
            try:
                sources = hf_sources(full_name, arch)
            except KeyError as e:
                raise KeyError(f"{name}: no HF source for this Megatron parameter") from e
            full = hf_to_mcore(full_name, [get_hf(n) for n in sources], arch)
            shard = tp_shard(full_name, full, tp_size, tp_rank)
            if shard.shape != param.shape:
                raise ValueError(f"{full_name}: HF gives shard shape {tuple(shard.shape)}, "
                                 f"model parameter has {tuple(param.shape)}")
            param.copy_(shard)
            if on_tensor is not None:
                on_tensor(name)


def iter_hf_weights(model, arch: Qwen3Arch, *, tp_group: Optional[dist.ProcessGroup] = None,
                    pp_group: Optional[dist.ProcessGroup] = None,
                    dtype: Optional[torch.dtype] = None,
                    select: Optional[Callable[[torch.nn.Parameter], torch.Tensor]] = None,
                    ) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, full tensor)`` for the model (see the module docstring for who yields what).

    ``tp_group`` defaults to Megatron's TP group. ``dtype`` casts the yielded tensors.
    ``select(param)`` picks what to export of each parameter: the weight by default, or e.g.
    ``lambda p: p.main_grad`` to read gradients in HF names and layouts.
    """
    if tp_group is None:
        from megatron.core import parallel_state

        tp_group = parallel_state.get_tensor_model_parallel_group()
    local = _iter_stage(model, arch, tp_group, dtype, select)
    if pp_group is None or dist.get_world_size(pp_group) == 1:
        yield from local
        return
    yield from _broadcast_stages(model, arch, local, pp_group, dtype)


def _iter_stage(model, arch, tp_group, dtype, select):
    tp_size = dist.get_world_size(tp_group)
    for name, param in _named_weights(model):
        full_name = global_name(model, name)
        if full_name == "output_layer.weight" and arch.tie_word_embeddings:
            continue  # the last stage's copy of the tied embedding
        shard = (param if select is None else select(param)).detach()
        # the layout says what is split, not the parameter's ``tensor_model_parallel`` attribute:
        # Megatron sets that only when it initializes the weights (not under perform_initialization=False)
        if tp_size > 1 and tp_kind(full_name) != REPLICATED:
            shards = [torch.empty_like(shard) for _ in range(tp_size)]
            dist.all_gather(shards, shard.contiguous(), group=tp_group)
            shard = tp_merge(full_name, shards)
        for hf_name, tensor in mcore_to_hf(full_name, shard, arch):
            yield hf_name, tensor if dtype is None else tensor.to(dtype)


def _stage_meta(model, arch, dtype) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """(hf_name, shape, dtype) of what ``_iter_stage`` yields on this stage, without gathering."""
    shapes = hf_shapes(arch)
    meta = []
    for name, param in _named_weights(model):
        full_name = global_name(model, name)
        if full_name == "output_layer.weight" and arch.tie_word_embeddings:
            continue
        for hf_name in hf_sources(full_name, arch):
            meta.append((hf_name, shapes[hf_name], dtype or param.dtype))
    return meta


def _broadcast_stages(model, arch, local, pp_group, dtype):
    """Every PP rank yields every stage's tensors: names/shapes first, then one broadcast each."""
    pp_rank, pp_size = dist.get_rank(pp_group), dist.get_world_size(pp_group)
    metas = [None] * pp_size
    dist.all_gather_object(metas, _stage_meta(model, arch, dtype), group=pp_group)
    device = next(unwrap(model).parameters()).device
    for stage, meta in enumerate(metas):
        src = dist.get_global_rank(pp_group, stage)
        for name, shape, dt in meta:
            if stage == pp_rank:
                own_name, buf = next(local)
                assert own_name == name, (own_name, name)
                buf = buf.contiguous()
            else:
                buf = torch.empty(shape, dtype=dt, device=device)
            dist.broadcast(buf, src=src, group=pp_group)
            yield name, buf
