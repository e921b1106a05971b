"""LoRA merged into the base weights, in Megatron's own sharded layout (for the rollout sync).

``merged_weight_selector(model)`` returns ``select(param)`` for ``convert.live_model.iter_hf_weights``:
for the base weight of a LoRA-wrapped linear it returns ``W_k + (alpha / r) * ΔW_k`` for this
rank's shard ``k`` (``ΔW_k = B_k A`` column-parallel, ``B A_k`` row-parallel, fused projections
laid out as the base layer lays out its outputs), and the weight itself for every other parameter.
The exporter then gathers TP shards and maps names exactly as for an un-adapted model.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch

from .inject import lora_modules
from .layers import LoRAColumnParallelLinear


def _local_delta(module) -> torch.Tensor:
    """This rank's ``ΔW`` ``[out_local, in_local]`` of one wrapped linear (float32)."""
    if isinstance(module, LoRAColumnParallelLinear):
        in_features = module.base.weight.shape[1]
        parts = []
        for seg in module.segments:
            adapter = module.adapters[seg.name] if seg.name in module.adapters else None
            if adapter is None:
                parts.append(torch.zeros(in_features, seg.local_features, device=module.base.weight.device))
            else:  # layouts act on the output axis, last: lay out ΔW^T and transpose back
                parts.append((adapter.lora_B.float() @ adapter.lora_A.float()).T)
        return module.layout(parts).T
    (adapter,) = module.adapters.values()
    return adapter.lora_B.float() @ adapter.lora_A.float()


def merged_weight_selector(model_chunks: Iterable[torch.nn.Module]) -> Callable[[torch.nn.Parameter], torch.Tensor]:
    """``select(param)``: the merged weight for LoRA-wrapped base weights, the parameter otherwise.

    Each merged weight is computed when asked for and held by no one but the caller, so a stream
    (``iter_hf_weights``) holds about one merged tensor at a time, not a second copy of the model."""
    wrapped = {id(module.base.weight): module for chunk in model_chunks for _, module in lora_modules(chunk)
               if module.enabled}

    @torch.no_grad()
    def select(param: torch.nn.Parameter) -> torch.Tensor:
        module = wrapped.get(id(param))
        if module is None:
            return param
        w = module.base.weight
        return (w.float() + module.scaling * _local_delta(module)).to(w.dtype)

    return select
