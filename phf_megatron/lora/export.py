"""Adapters out of Megatron: full (unsharded) tensors under HF names, PEFT directories.

A column-parallel adapter's ``B`` and a row-parallel adapter's ``A`` are gathered over the
tensor-parallel group (query groups, and the gate/up halves, are contiguous per rank, so the
concatenation in rank order is the HF row order); the replicated halves are taken as they are.
Pipeline stages each hold their own layers; ``export_peft_adapter`` collects them on rank 0.
"""

from __future__ import annotations

import os
from typing import Iterable

import torch
import torch.distributed as dist

from ..errors import NonFiniteError
from ..output_files import atomic_dir, first_nonfinite, write_json
from .config import LoraConfig
from .inject import lora_modules
from .layers import LoRAColumnParallelLinear

ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


def hf_module_name(layer_idx: int, proj: str) -> str:
    """``model.layers.{i}.self_attn.q_proj`` / ``model.layers.{i}.mlp.down_proj`` (0-based layer)."""
    block = "self_attn" if proj in ATTENTION_PROJECTIONS else "mlp"
    return f"model.layers.{layer_idx}.{block}.{proj}"


def _all_gather_cat(t: torch.Tensor, dim: int, group) -> torch.Tensor:
    if group is None or group.size() == 1:
        return t.detach().clone()
    parts = [torch.empty_like(t) for _ in range(group.size())]
    dist.all_gather(parts, t.detach().contiguous(), group=group)
    return torch.cat(parts, dim=dim)


def full_adapters(model_chunks: Iterable[torch.nn.Module], select=None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{hf_module_name: (A [r, in], B [out, r])}`` for this pipeline stage's layers (a TP collective).

    ``select(param)`` picks what to gather of each adapter tensor (default: the values; e.g.
    ``lambda p: p.main_grad`` for gradients in the same layout).
    """
    select = select or (lambda p: p)
    out = {}
    for chunk in model_chunks:
        for layer_idx, module in lora_modules(chunk):
            column = isinstance(module, LoRAColumnParallelLinear)
            for proj, adapter in module.adapters.items():
                a, b = select(adapter.lora_A).detach(), select(adapter.lora_B).detach()
                if column:
                    b = _all_gather_cat(b, 0, module.tp_group)
                else:
                    a = _all_gather_cat(a, 1, module.tp_group)
                out[hf_module_name(layer_idx, proj)] = (a.clone(), b.clone())
    return out


def _gather_to_rank0(local: dict) -> dict | None:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return local
    from megatron.core import parallel_state

    # one copy of each stage's adapters: the (dp=0, tp=0) rank of each stage sends to rank 0.
    sender = parallel_state.get_data_parallel_rank() == 0 and parallel_state.get_tensor_model_parallel_rank() == 0
    payload = {k: (a.cpu(), b.cpu()) for k, (a, b) in local.items()} if sender else {}
    gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(payload, gathered, dst=0)
    if dist.get_rank() != 0:
        return None
    merged = {}
    for part in gathered:
        merged.update(part)
    return merged


def peft_adapter_config(cfg: LoraConfig, base_model_name_or_path: str | None) -> dict:
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "r": cfg.r,
        "lora_alpha": cfg.alpha,
        "lora_dropout": cfg.dropout,
        "target_modules": sorted(cfg.target_modules),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
    }


def export_peft_adapter(model_chunks, out_dir: str, cfg: LoraConfig, base_model_name_or_path: str | None = None,
                        dtype: torch.dtype | None = None) -> None:
    """Write a PEFT LoRA directory (``adapter_config.json`` + ``adapter_model.safetensors``), its
    tensors in ``dtype`` (default: the adapters' own).

    A collective: every rank calls it; rank 0 writes, atomically (a temp dir renamed into place).
    ``peft.PeftModel.from_pretrained(hf_model, out_dir)`` then reproduces the trained student.
    """
    from safetensors.torch import save_file

    adapters = _gather_to_rank0(full_adapters(model_chunks))
    if adapters is None:
        return
    tensors = {}
    for name, (a, b) in adapters.items():
        tensors[f"base_model.model.{name}.lora_A.weight"] = a.to(dtype or a.dtype).contiguous()
        tensors[f"base_model.model.{name}.lora_B.weight"] = b.to(dtype or b.dtype).contiguous()
    if (found := first_nonfinite(tensors.items())) is not None:
        raise NonFiniteError.not_written(out_dir, found)
    with atomic_dir(out_dir) as tmp:
        save_file(tensors, os.path.join(tmp, "adapter_model.safetensors"), metadata={"format": "pt"})
        write_json(os.path.join(tmp, "adapter_config.json"), peft_adapter_config(cfg, base_model_name_or_path), indent=2)


@torch.no_grad()
def load_full_adapters(model_chunks: Iterable[torch.nn.Module], adapters: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Inverse of ``full_adapters``: copy full ``(A, B)`` tensors into this rank's adapter shards."""
    for chunk in model_chunks:
        for layer_idx, module in lora_modules(chunk):
            column = isinstance(module, LoRAColumnParallelLinear)
            tp = module.tp_group.size() if module.tp_group is not None else 1
            k = module.tp_group.rank() if module.tp_group is not None else 0
            for proj, adapter in module.adapters.items():
                name = hf_module_name(layer_idx, proj)
                if name not in adapters:
                    raise KeyError(f"{name}: no adapter tensors given for this projection")
                a, b = adapters[name]
                if column:
                    b = b.chunk(tp, dim=0)[k]
                else:
                    a = a.chunk(tp, dim=1)[k]
                for dst, src, which in ((adapter.lora_A, a, "lora_A"), (adapter.lora_B, b, "lora_B")):
                    if dst.shape != src.shape:
                        raise ValueError(f"{name}.{which}: shard shape {tuple(src.shape)} != {tuple(dst.shape)}")
                    dst.copy_(src)
