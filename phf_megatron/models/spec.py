"""Layer and block specs for Qwen3 on Megatron-Core.

* ``backend="te"``: Transformer Engine's GPT layer spec (fused norm+linear, TE attention, TE
  RMSNorm for QK-norm and the final norm). Used when ``transformer_engine`` imports.
* ``backend="local"``: Megatron's local layer spec (its own tensor-parallel linears, MLP, bias-
  dropout-add) with two modules of ours: ``SDPACoreAttention`` for the core attention and the
  SP-safe ``RMSNorm`` for the input, pre-MLP, Q/K and final norms.

Both spellings of the parameter names are handled by the converters; Megatron's dist
checkpoints use TE's names for both (the local spec maps its norm names), so a checkpoint
loads under either backend.
"""

from __future__ import annotations

import dataclasses

from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build
from megatron.core.transformer.transformer_config import TransformerConfig

from phf_megatron.models.attention import SDPACoreAttention
from phf_megatron.models.choices import TRANSFORMER_IMPLS
from phf_megatron.models.norm import RMSNorm


def have_transformer_engine() -> bool:
    try:
        import transformer_engine  # noqa: F401
        from megatron.core.extensions.transformer_engine import TENorm  # noqa: F401
    except Exception:  # ImportError, or a TE build that fails at import
        return False
    return True


def resolve_backend(backend: str) -> str:
    if backend not in TRANSFORMER_IMPLS:
        raise ValueError(f"backend: expected one of {TRANSFORMER_IMPLS}, got {backend!r}")
    if backend == "auto":
        return "te" if have_transformer_engine() else "local"
    if backend == "te" and not have_transformer_engine():
        raise ValueError("backend: 'te' requested but transformer_engine does not import")
    return backend


def qwen3_layer_spec(backend: str = "auto") -> ModuleSpec:
    """The ``TransformerLayer`` spec of one Qwen3 decoder layer."""
    if resolve_backend(backend) == "te":
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

        return get_gpt_layer_with_transformer_engine_spec(qk_layernorm=True)
    spec = get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")
    attention = spec.submodules.self_attention
    attention_sub = dataclasses.replace(attention.submodules, core_attention=SDPACoreAttention,
                                        q_layernorm=RMSNorm, k_layernorm=RMSNorm)
    layer_sub = dataclasses.replace(
        spec.submodules,
        input_layernorm=RMSNorm,
        pre_mlp_layernorm=RMSNorm,
        self_attention=dataclasses.replace(attention, submodules=attention_sub),
    )
    return dataclasses.replace(spec, submodules=layer_sub)


def qwen3_block_spec(config: TransformerConfig, backend: str = "auto",
                     vp_stage: int | None = None, pp_rank: int | None = None) -> TransformerBlockSubmodules:
    """The decoder block of this pipeline stage: its layers and the final norm."""
    backend = resolve_backend(backend)
    layer = qwen3_layer_spec(backend)
    if backend == "te":
        from megatron.core.extensions.transformer_engine import TENorm as final_norm
    else:
        final_norm = RMSNorm
    num_layers = get_num_layers_to_build(config, vp_stage=vp_stage, pp_rank=pp_rank)
    return TransformerBlockSubmodules(layer_specs=[layer] * num_layers, layer_norm=final_norm)
