"""Qwen3 on Megatron-Core: config, layer spec and model provider.

API::

    from phf_megatron.models import Qwen3Arch, build_qwen3_model, qwen3_transformer_config
    from phf_megatron.convert.live_model import load_hf_weights, iter_hf_weights
    from phf_megatron.convert.hf_checkpoint import HFCheckpoint

    # inside phf_megatron.runtime.megatron_session(tp, pp) (or the trainer's init_distributed):
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

* ``qwen3_arch.Qwen3Arch.from_hf(config | dict | dir)``: the shapes, with checks (imports neither
  Megatron nor transformers; the converters share it).
* ``unwrap(model)``: the ``GPTModel`` inside DDP / Float16Module wrappers.
* ``choices.TRANSFORMER_IMPLS``: the layer implementations a config may name; ``choices.PACKED_ATTENTIONS``: the
  attentions of packed sequences (``models/varlen.py``: PyTorch's varlen flash attention, opt-in).

Why ``GPTModel`` rather than 0.19's ``HybridModel``: see ``provider.py``. Submodules load on first
use (``lazy_exports``): ``models.qwen3_arch`` and ``models.choices`` import without Megatron.
"""

from ..lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "choices": ("PACKED_ATTENTIONS", "TRANSFORMER_IMPLS"),
    "config": ("Qwen3TransformerConfig", "qwen3_transformer_config"),
    "provider": ("build_qwen3_model", "unwrap"),
    "qwen3_arch": ("Qwen3Arch",),
    "spec": ("qwen3_block_spec", "qwen3_layer_spec"),
})
