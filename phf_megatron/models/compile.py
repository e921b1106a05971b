"""``torch.compile`` of whole decoder layers (``compile_layers=True``).

Compiling each ``TransformerLayer.forward`` lets inductor fuse the residual adds, norms, RoPE
and SwiGLU with their neighbours. The layers share one graph (they differ only in parameters,
which dynamo treats as inputs), so the cache limits are raised above the layer count.

A graph break inside a layer is expensive in Megatron-Core 0.19: the layer body runs under
activation-offloading context managers that dynamo cannot resume inside, so one break sends
the rest of the layer to eager. The one break we meet is Megatron's own deprecation warning
in ``get_tensor_model_parallel_group_if_none`` (``RowParallelLinear`` passes ``tp_group=None``
on every call); ``_quiet_megatron_group_lookup`` replaces it, in the modules that call it per
step, with the same lookup minus the warning.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _group_if_none(tp_group, is_expert=False, check_initialized=True):
    """``megatron.core.utils.get_tensor_model_parallel_group_if_none`` without the warning."""
    from megatron.core import parallel_state

    if not dist.is_initialized():
        return None
    if not parallel_state.is_initialized() or tp_group is not None:
        return tp_group
    if is_expert:
        return parallel_state.get_expert_tensor_parallel_group(check_initialized=check_initialized)
    return parallel_state.get_tensor_model_parallel_group(check_initialized=check_initialized)


def _quiet_megatron_group_lookup() -> None:
    from megatron.core.tensor_parallel import layers, mappings

    for module in (layers, mappings):
        if hasattr(module, "get_tensor_model_parallel_group_if_none"):
            module.get_tensor_model_parallel_group_if_none = _group_if_none


def compile_decoder_layers(model, backend: str = "inductor") -> None:
    """``torch.compile`` each ``TransformerLayer`` of this pipeline stage, in place."""
    import torch._dynamo

    _quiet_megatron_group_lookup()
    layers = model.decoder.layers
    limit = max(64, 8 * len(layers))
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, limit)
    if hasattr(torch._dynamo.config, "accumulated_cache_size_limit"):
        torch._dynamo.config.accumulated_cache_size_limit = max(
            torch._dynamo.config.accumulated_cache_size_limit, 4 * limit)
    for layer in layers:
        layer.forward = torch.compile(layer.forward, backend=backend, dynamic=None)
