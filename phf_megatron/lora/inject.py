"""Put LoRA adapters into a Megatron Qwen3 model, and walk them."""

from __future__ import annotations

import contextlib
from typing import Iterable, Iterator

import torch
from megatron.core.transformer.transformer_layer import TransformerLayer

from .config import LoraConfig
from .layers import (LoRAColumnParallelLinear, LoRARowParallelLinear, Segment, _LoRAWrapper, concat_layout, init_seed,
                     qkv_layout)


def _tp_size(linear) -> int:
    return linear.tp_group.size() if linear.tp_group is not None else 1


def _wrap_layer(layer: TransformerLayer, cfg: LoraConfig, seed: int) -> None:
    attn, mlp = layer.self_attention, layer.mlp
    tcfg = layer.config
    qkv = attn.linear_qkv
    tp = _tp_size(qkv)
    if tcfg.num_query_groups % tp:
        raise ValueError(f"num_query_groups ({tcfg.num_query_groups}) must be a multiple of TP size ({tp})")
    groups, heads, d = tcfg.num_query_groups // tp, tcfg.num_attention_heads // tp, tcfg.kv_channels
    index = layer.layer_number - 1
    seeds = {proj: init_seed(seed, f"layers.{index}.{proj}") for proj in cfg.target_modules}
    targets = cfg.target_modules
    if {"q_proj", "k_proj", "v_proj"} & set(targets):
        segments = [Segment("q_proj", heads * d), Segment("k_proj", groups * d), Segment("v_proj", groups * d)]
        attn.linear_qkv = LoRAColumnParallelLinear(qkv, segments, qkv_layout(groups), targets, cfg.r, cfg.alpha,
                                                   cfg.dropout, seeds)
    if "o_proj" in targets:
        attn.linear_proj = LoRARowParallelLinear(attn.linear_proj, "o_proj", cfg.r, cfg.alpha, cfg.dropout,
                                                 seeds["o_proj"])
    if {"gate_proj", "up_proj"} & set(targets):
        ffn_local = mlp.linear_fc1.output_size_per_partition // 2
        segments = [Segment("gate_proj", ffn_local), Segment("up_proj", ffn_local)]
        mlp.linear_fc1 = LoRAColumnParallelLinear(mlp.linear_fc1, segments, concat_layout, targets, cfg.r, cfg.alpha,
                                                  cfg.dropout, seeds)
    if "down_proj" in targets:
        mlp.linear_fc2 = LoRARowParallelLinear(mlp.linear_fc2, "down_proj", cfg.r, cfg.alpha, cfg.dropout,
                                               seeds["down_proj"])


def apply_lora(model: torch.nn.Module, cfg: LoraConfig, seed: int = 0) -> torch.nn.Module:
    """Freeze every parameter of ``model`` and add trainable adapters to each transformer layer.

    Call after the base weights are loaded. Works on one pipeline stage's model chunk; the layer
    number of an adapter is the layer's global ``layer_number`` (1-based, Megatron's). ``seed``
    fixes the adapters' initial values, identically under every TP/PP layout.
    """
    for p in model.parameters():
        p.requires_grad_(False)
    layers = [m for m in model.modules() if isinstance(m, TransformerLayer)]
    if not layers and any(True for _ in model.parameters()):
        raise ValueError("model: no Megatron TransformerLayer found to put LoRA adapters in")
    for layer in layers:
        _wrap_layer(layer, cfg, seed)
    return model


def lora_modules(model: torch.nn.Module) -> Iterator[tuple[int, _LoRAWrapper]]:
    """``(global layer index, 0-based; wrapper)`` for every LoRA-wrapped linear of this chunk."""
    for layer in (m for m in model.modules() if isinstance(m, TransformerLayer)):
        for module in layer.modules():
            if isinstance(module, _LoRAWrapper):
                yield layer.layer_number - 1, module


def adapter_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """``(stable name, parameter)`` of every adapter tensor, in a fixed order (EMA, checkpoints)."""
    out = []
    for layer_idx, module in lora_modules(model):
        for proj, adapter in module.adapters.items():
            out.append((f"layers.{layer_idx}.{proj}.lora_A", adapter.lora_A))
            out.append((f"layers.{layer_idx}.{proj}.lora_B", adapter.lora_B))
    return out


def set_adapters_enabled(model: torch.nn.Module, enabled: bool) -> None:
    for _, module in lora_modules(model):
        module.enabled = enabled


@contextlib.contextmanager
def adapters_off(chunks: Iterable[torch.nn.Module]):
    """The base model: every LoRA adapter of ``chunks`` switched off for the enclosed pass, on again after."""
    chunks = list(chunks)
    for chunk in chunks:
        set_adapters_enabled(chunk, False)
    try:
        yield
    finally:
        for chunk in chunks:
            set_adapters_enabled(chunk, True)
