"""Megatron-Core ``TransformerConfig`` for a Hugging Face Qwen3 config.

Qwen3 in Megatron terms: RMSNorm (eps from the config) before attention and MLP, RMS QK-norm
per head (``qk_layernorm``), SwiGLU MLP without biases (``gated_linear_unit`` + silu), RoPE
(θ from the config; passed to the model, not the config), GQA (``num_query_groups`` =
``num_key_value_heads``) and ``kv_channels = head_dim`` (Qwen3-0.6B/4B have head_dim ≠
hidden/heads). Embedding tying is a model argument (see ``provider.py``).

``Qwen3TransformerConfig`` adds our fast-path switches to Megatron's dataclass, so they travel
with the config into every module (see ``models/fused.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.transformer.transformer_config import TransformerConfig

from phf_megatron.models.choices import as_dtype
from phf_megatron.models.qwen3_arch import Qwen3Arch, arch_of
from phf_megatron.models.fused import register_rope_kernels


@dataclass
class Qwen3TransformerConfig(TransformerConfig):
    """Megatron's ``TransformerConfig`` plus the Qwen3 fast paths of this package."""

    fused_rmsnorm: bool = False
    """RMSNorm through a compiled kernel (``models/fused.py``); eager math when False."""

    fused_cross_entropy: bool = False
    """Compiled per-chunk cross entropy in ``lm_head.lm_cross_entropy`` (TP = 1 only; eager
    vocabulary-parallel math otherwise)."""

    compile_layers: bool = False
    """``torch.compile`` every decoder layer (fuses the residual adds, norms, RoPE and SwiGLU
    with the surrounding element-wise work); applied by ``build_qwen3_model``."""

    packed_attention: str = "sdpa"
    """The local spec's attention of packed sequences (THD, ``cu_seqlens``; ``models/attention.py``): sdpa (one
    causal SDPA call per sequence) | varlen (one call per layer of PyTorch's varlen flash attention,
    ``models/varlen.py``: CUDA only, no attention dropout). ``choices.PACKED_ATTENTIONS``."""


def qwen3_transformer_config(hf_config: Any, *, tp: int = 1, pp: int = 1, sp: bool = False,
                             dtype: Any = torch.bfloat16, fused: bool = False,
                             **overrides: Any) -> Qwen3TransformerConfig:
    """Build the Megatron config of a Qwen3 model for a TP/PP/SP layout.

    Args:
        hf_config: a transformers ``Qwen3Config``, a ``config.json`` dict or path, or a ``Qwen3Arch``.
        tp, pp: tensor- and pipeline-parallel sizes (must divide heads, query groups, FFN,
            vocabulary; layers).
        sp: sequence parallelism (needs ``tp > 1``).
        dtype: parameter dtype (``torch.float32`` / ``bfloat16`` / ``float16`` or 'fp32'/'bf16').
        fused: turn on the fused kernels: compiled RMSNorm and RoPE (``models/fused.py``, the
            RoPE through Megatron's own ``apply_rope_fusion`` dispatch) and Megatron's compiled
            SwiGLU (``bias_activation_fusion``); numerics stay within dtype rounding of eager.
        overrides: any other ``TransformerConfig`` field (e.g. ``recompute_granularity``).
    """
    arch: Qwen3Arch = arch_of(hf_config)
    arch.check_layout(tp, pp)
    if sp and tp == 1:
        raise ValueError("sp: sequence parallelism needs tp > 1")
    dtype = as_dtype(dtype)
    if fused or overrides.get("apply_rope_fusion"):
        register_rope_kernels()  # before the config: its __post_init__ checks they exist
    on_gpu = torch.cuda.is_available()
    fields: dict[str, Any] = dict(
        num_layers=arch.num_hidden_layers,
        hidden_size=arch.hidden_size,
        ffn_hidden_size=arch.intermediate_size,
        num_attention_heads=arch.num_attention_heads,
        num_query_groups=arch.num_key_value_heads,
        kv_channels=arch.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=arch.rms_norm_eps,
        qk_layernorm=True,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        hidden_dropout=0.0,
        attention_dropout=arch.attention_dropout,
        init_method_std=arch.initializer_range,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        sequence_parallel=sp,
        use_cpu_initialization=not on_gpu,
        bias_activation_fusion=fused,  # Megatron's compiled bias-SwiGLU (no TE/apex needed)
        apply_rope_fusion=fused,
        fused_rmsnorm=fused,
        fused_cross_entropy=fused,
    )
    fields.update(overrides)
    return Qwen3TransformerConfig(**fields)
