"""Model provider: the Qwen3 ``GPTModel`` of this rank's pipeline stage.

Why ``GPTModel`` and not ``HybridModel`` (GPTModel logs a deprecation in Megatron-Core 0.19):
* the CPU CI runs megatron-core 0.16.1 (the newest installing on Python 3.11), which has no
  ``HybridModel``; the GPU image carries 0.19.2. ``GPTModel`` is the one class in both, with the
  same constructor, parameter names and dist-checkpoint keys, so one provider, one converter
  and one checkpoint format serve both;
* ``HybridModel`` splits each decoder layer into separate attention and MLP layers (pattern
  ``*-*-``) with different names; the per-layer hidden-state capture of PHF and the HF mapping
  are per Qwen3 decoder layer, which is exactly ``TransformerLayer`` in ``GPTModel``;
* 0.19 keeps ``GPTModel`` for critical fixes; moving to ``HybridModel`` is a contained change
  here (provider + names in ``convert/qwen3_mapping.py``) once CI can run a version that has it.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import torch
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel

from phf_megatron.models.qwen3_arch import Qwen3Arch, arch_of
from phf_megatron.models import fused as fused_kernels
from phf_megatron.models.compile import compile_decoder_layers
from phf_megatron.models.config import qwen3_transformer_config
from phf_megatron.models.spec import qwen3_block_spec


def build_qwen3_model(hf_config: Any, *, sp: bool = False, dtype: Any = torch.bfloat16,
                      backend: str = "auto", fused: bool = False,
                      pre_process: Optional[bool] = None, post_process: Optional[bool] = None,
                      vp_stage: Optional[int] = None, parallel_output: bool = True,
                      config=None, **config_overrides: Any) -> GPTModel:
    """Build this rank's Qwen3 ``GPTModel`` (random init; load weights with ``convert``).

    The TP/PP sizes come from ``megatron.core.parallel_state`` (``initialize_model_parallel``
    must have run, and ``model_parallel_cuda_manual_seed``). ``pre_process``/``post_process``
    default to whether this is the first/last pipeline stage.

    Args:
        hf_config: transformers ``Qwen3Config``, ``config.json`` dict/path, or ``Qwen3Arch``.
        sp: sequence parallelism (activations split along the sequence over TP).
        dtype: parameter dtype. ``fused``: compiled RMSNorm/RoPE/SwiGLU fast paths
            (``compile_layers=True`` in the overrides compiles whole decoder layers).
        backend: 'auto' (TE if importable, else local + SDPA), 'te' or 'local'.
        parallel_output: keep logits vocab-sharded over TP ([b, s, V/tp]); False gathers them.
        config: a ready ``Qwen3TransformerConfig`` (then sp/dtype/fused/overrides are ignored).
        config_overrides: extra ``TransformerConfig`` fields (recompute options, ...).

    Returns a ``GPTModel`` whose forward is ``model(input_ids [b, s], position_ids [b, s],
    attention_mask=None) -> logits [b, s, V/tp]`` on the last stage, hidden [s/tp?, b, h] before.
    RoPE positions are 0..s-1 (``position_ids`` are not used by RoPE): pad on the right.
    """
    arch: Qwen3Arch = arch_of(hf_config)
    tp = parallel_state.get_tensor_model_parallel_world_size()
    pp = parallel_state.get_pipeline_model_parallel_world_size()
    if config is None:
        config = qwen3_transformer_config(arch, tp=tp, pp=pp, sp=sp, dtype=dtype, fused=fused,
                                          **config_overrides)
    elif (config.tensor_model_parallel_size, config.pipeline_model_parallel_size) != (tp, pp):
        raise ValueError(
            f"config: built for tp={config.tensor_model_parallel_size}, pp={config.pipeline_model_parallel_size}"
            f" but parallel_state has tp={tp}, pp={pp}")
    if pre_process is None:
        pre_process = parallel_state.is_pipeline_first_stage(ignore_virtual=vp_stage is None, vp_stage=vp_stage)
    if post_process is None:
        post_process = parallel_state.is_pipeline_last_stage(ignore_virtual=vp_stage is None, vp_stage=vp_stage)
    _quiet_gpt_deprecation()
    model = GPTModel(
        config=config,
        transformer_layer_spec=qwen3_block_spec(config, backend, vp_stage=vp_stage),
        vocab_size=arch.vocab_size,
        max_sequence_length=arch.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=parallel_output,
        share_embeddings_and_output_weights=arch.tie_word_embeddings,
        position_embedding_type="rope",
        rotary_base=arch.rope_theta,
        vp_stage=vp_stage,
    )
    if getattr(config, "compile_layers", False):
        compile_decoder_layers(model, backend=fused_kernels.compile_backend())
    model.qwen3_arch = arch  # converters and weight sync read the shapes from here
    return model


def unwrap(model):
    """The ``GPTModel`` inside DDP / Float16Module wrappers."""
    while hasattr(model, "module"):
        model = model.module
    return model


def _quiet_gpt_deprecation() -> None:
    """Megatron 0.19 logs 'GPTModel IS DEPRECATED' per construction; the choice is documented above."""
    logging.getLogger("megatron.core.models.gpt.gpt_model").setLevel(logging.ERROR)
