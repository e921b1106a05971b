"""HF Qwen3 <-> Megatron-Core GPTModel names and layouts, as pure functions on full tensors.

One literal map (``LAYER_MAP``/``GLOBAL_MAP``) says which HF tensors make each Megatron tensor.
Two Megatron tensors are built from several HF ones:

* ``self_attention.linear_qkv.weight`` [(nq + 2·ng)·d, H] is interleaved per query group:
  for each of the ng groups, its nq/ng query heads, then its key head, then its value head
  (d = head_dim). This is the order Megatron's ``SelfAttention`` splits, and it keeps every
  group whole on one tensor-parallel rank.
* ``mlp.linear_fc1.weight`` [2·F, H] is ``[gate_proj; up_proj]`` (SwiGLU: silu(gate) * up).

Megatron's local spec and Transformer Engine's spec name the two pre-norms differently (TE fuses
them into the following linear); ``canonical_name`` maps both spellings to the local one and
``spec_name`` back. Names here are *full-model* names (global layer index, unsharded tensors);
tensor/pipeline sharding lives in ``sharding.py``.
"""

from __future__ import annotations

import re
from typing import Iterator, Sequence

import torch

from phf_megatron.models.qwen3_arch import Qwen3Arch

HF_LAYER = "model.layers.{i}."
MCORE_LAYER = "decoder.layers.{i}."

# Megatron suffix (within decoder.layers.{i}.) -> HF suffixes (within model.layers.{i}.)
LAYER_MAP: dict[str, tuple[str, ...]] = {
    "input_layernorm.weight": ("input_layernorm.weight",),
    "self_attention.linear_qkv.weight": (
        "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "self_attention.q_layernorm.weight": ("self_attn.q_norm.weight",),
    "self_attention.k_layernorm.weight": ("self_attn.k_norm.weight",),
    "self_attention.linear_proj.weight": ("self_attn.o_proj.weight",),
    "pre_mlp_layernorm.weight": ("post_attention_layernorm.weight",),
    "mlp.linear_fc1.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
    "mlp.linear_fc2.weight": ("mlp.down_proj.weight",),
}

GLOBAL_MAP: dict[str, tuple[str, ...]] = {
    "embedding.word_embeddings.weight": ("model.embed_tokens.weight",),
    "decoder.final_layernorm.weight": ("model.norm.weight",),
    "output_layer.weight": ("lm_head.weight",),
}

# Transformer Engine spelling -> local spelling (layer suffixes).
TE_ALIASES = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
}
_LOCAL_TO_TE = {v: k for k, v in TE_ALIASES.items()}

_LAYER_RE = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_HF_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def split_layer_name(name: str) -> tuple[int | None, str]:
    """``decoder.layers.3.mlp.linear_fc2.weight`` -> (3, ``mlp.linear_fc2.weight``); else (None, name)."""
    m = _LAYER_RE.match(name)
    return (int(m.group(1)), m.group(2)) if m else (None, name)


def canonical_name(name: str) -> str:
    """Local-spec spelling of a Megatron name (TE's fused-norm names mapped back)."""
    layer, suffix = split_layer_name(name)
    if layer is None:
        return name
    return MCORE_LAYER.format(i=layer) + TE_ALIASES.get(suffix, suffix)


def spec_name(name: str, spec: str) -> str:
    """Megatron name in the spelling of ``spec`` ('local' or 'te')."""
    if spec not in ("local", "te"):
        raise ValueError(f"spec: expected 'local' or 'te', got {spec!r}")
    layer, suffix = split_layer_name(name)
    if layer is None or spec == "local":
        return canonical_name(name)
    return MCORE_LAYER.format(i=layer) + _LOCAL_TO_TE.get(suffix, suffix)


def mcore_names(arch: Qwen3Arch) -> list[str]:
    """All Megatron tensor names of the full model (local spelling), in model order."""
    names = ["embedding.word_embeddings.weight"]
    for i in range(arch.num_hidden_layers):
        names += [MCORE_LAYER.format(i=i) + suffix for suffix in LAYER_MAP]
    names.append("decoder.final_layernorm.weight")
    if not arch.tie_word_embeddings:
        names.append("output_layer.weight")
    return names


def hf_sources(mcore_name: str, arch: Qwen3Arch) -> tuple[str, ...]:
    """HF names whose tensors make the Megatron tensor ``mcore_name``."""
    name = canonical_name(mcore_name)
    layer, suffix = split_layer_name(name)
    if layer is not None:
        if suffix not in LAYER_MAP:
            raise KeyError(f"{mcore_name}: not a Qwen3 Megatron tensor name")
        if layer >= arch.num_hidden_layers:
            raise KeyError(f"{mcore_name}: layer {layer} >= num_hidden_layers={arch.num_hidden_layers}")
        return tuple(HF_LAYER.format(i=layer) + s for s in LAYER_MAP[suffix])
    if name not in GLOBAL_MAP:
        raise KeyError(f"{mcore_name}: not a Qwen3 Megatron tensor name")
    if name == "output_layer.weight" and arch.tie_word_embeddings:
        return GLOBAL_MAP["embedding.word_embeddings.weight"]  # tied: the embedding is the head
    return GLOBAL_MAP[name]


def hf_shapes(arch: Qwen3Arch) -> dict[str, tuple[int, ...]]:
    """Expected shape of every HF tensor (``lm_head.weight`` only when untied)."""
    h, d = arch.hidden_size, arch.head_dim
    per_layer = {
        "input_layernorm.weight": (h,),
        "self_attn.q_proj.weight": (arch.q_size, h),
        "self_attn.k_proj.weight": (arch.kv_size, h),
        "self_attn.v_proj.weight": (arch.kv_size, h),
        "self_attn.q_norm.weight": (d,),
        "self_attn.k_norm.weight": (d,),
        "self_attn.o_proj.weight": (h, arch.q_size),
        "post_attention_layernorm.weight": (h,),
        "mlp.gate_proj.weight": (arch.intermediate_size, h),
        "mlp.up_proj.weight": (arch.intermediate_size, h),
        "mlp.down_proj.weight": (h, arch.intermediate_size),
    }
    shapes = {"model.embed_tokens.weight": (arch.vocab_size, h), "model.norm.weight": (h,)}
    for i in range(arch.num_hidden_layers):
        shapes.update({HF_LAYER.format(i=i) + k: v for k, v in per_layer.items()})
    if not arch.tie_word_embeddings:
        shapes["lm_head.weight"] = (arch.vocab_size, h)
    return shapes


def hf_to_mcore(mcore_name: str, hf_tensors: Sequence[torch.Tensor], arch: Qwen3Arch) -> torch.Tensor:
    """The full Megatron tensor ``mcore_name`` from its HF tensors (in ``hf_sources`` order)."""
    suffix = split_layer_name(canonical_name(mcore_name))[1]
    if suffix == "self_attention.linear_qkv.weight":
        q, k, v = hf_tensors
        g, hidden = arch.num_key_value_heads, q.shape[-1]
        q = q.reshape(g, arch.heads_per_group * arch.head_dim, hidden)
        k = k.reshape(g, arch.head_dim, hidden)
        v = v.reshape(g, arch.head_dim, hidden)
        return torch.cat([q, k, v], dim=1).reshape(-1, hidden)  # [(nq + 2·ng)·d, H]
    if suffix == "mlp.linear_fc1.weight":
        gate, up = hf_tensors
        return torch.cat([gate, up], dim=0)  # [2·F, H]
    (tensor,) = hf_tensors
    return tensor


def mcore_to_hf(mcore_name: str, tensor: torch.Tensor, arch: Qwen3Arch) -> list[tuple[str, torch.Tensor]]:
    """HF (name, tensor) pairs from the full Megatron tensor ``mcore_name`` (inverse of ``hf_to_mcore``)."""
    name = canonical_name(mcore_name)
    suffix = split_layer_name(name)[1]
    names = hf_sources(name, arch)
    if name == "output_layer.weight" and arch.tie_word_embeddings:
        return []  # tied: HF stores the head as the embedding
    if suffix == "self_attention.linear_qkv.weight":
        g, hidden, d = arch.num_key_value_heads, tensor.shape[-1], arch.head_dim
        grouped = tensor.reshape(g, (arch.heads_per_group + 2) * d, hidden)
        q, k, v = torch.split(grouped, [arch.heads_per_group * d, d, d], dim=1)
        parts = [q.reshape(-1, hidden), k.reshape(-1, hidden), v.reshape(-1, hidden)]
    elif suffix == "mlp.linear_fc1.weight":
        parts = list(torch.chunk(tensor, 2, dim=0))
    else:
        parts = [tensor]
    return [(n, p.contiguous()) for n, p in zip(names, parts)]


def hf_layer_index(hf_name: str) -> int | None:
    m = _HF_LAYER_RE.match(hf_name)
    return int(m.group(1)) if m else None


def iter_mcore_from_hf(get_hf, arch: Qwen3Arch, names: Sequence[str] | None = None
                       ) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (Megatron name, full tensor), reading each HF tensor through ``get_hf(hf_name)``.

    Tensor by tensor: at most one Megatron tensor and its HF sources are alive at a time.
    """
    for name in names if names is not None else mcore_names(arch):
        yield name, hf_to_mcore(name, [get_hf(n) for n in hf_sources(name, arch)], arch)
