"""Qwen3 on Megatron-Core: config, layer spec and model provider.

API::

    from phf_megatron.models import build_qwen3_model, qwen3_transformer_config
    from phf_megatron.convert.live_model import load_hf_weights, iter_hf_weights
    from phf_megatron.convert.hf_checkpoint import HFCheckpoint

    # after dist.init_process_group, (CPU: cpu_shims.apply()), initialize_model_parallel(tp, pp)
    # and model_parallel_cuda_manual_seed(seed):
    model = build_qwen3_model(hf_config, sp=True, dtype=torch.bfloat16)   # this rank's GPTModel
    load_hf_weights(model, state_dict.__getitem__, Qwen3Arch.from_hf(hf_config))
    logits = model(input_ids, position_ids, attention_mask=None)  # [b, s, V/tp] on the last stage

* ``qwen3_transformer_config(hf_config, tp=, pp=, sp=, dtype=, fused=, **overrides)`` ->
  ``Qwen3TransformerConfig`` (Megatron's ``TransformerConfig`` + our fast-path switches).
* ``qwen3_layer_spec(backend)`` / ``qwen3_block_spec(config, backend)``: Transformer Engine's
  spec when TE imports, else Megatron's local spec with ``SDPACoreAttention``
  (``models/attention.py``) and the SP-safe ``RMSNorm`` (``models/norm.py``).
* ``build_qwen3_model(hf_config, sp=, dtype=, backend=, fused=, pre_process=, post_process=,
  vp_stage=, parallel_output=, config=, **overrides)``: TP/PP sizes from ``parallel_state``;
  pre/post-process default to first/last pipeline stage. ``model.qwen3_arch`` holds the shapes.

Why ``GPTModel`` rather than 0.19's ``HybridModel``: see ``provider.py``.
"""

from phf_megatron.models.config import Qwen3TransformerConfig, qwen3_transformer_config
from phf_megatron.models.provider import build_qwen3_model
from phf_megatron.models.spec import qwen3_block_spec, qwen3_layer_spec

__all__ = ["Qwen3TransformerConfig", "qwen3_transformer_config", "build_qwen3_model",
           "qwen3_layer_spec", "qwen3_block_spec"]
