"""Tensor-parallel LoRA for Megatron Qwen3 (PEFT-compatible adapters), PEFT export, merged weights.

Submodules load on first use (``lazy_exports``): ``lora.config`` imports without Megatron.
"""

from ..lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "config": ("LORA_TARGETS", "LoraConfig"),
    "inject": ("adapter_parameters", "adapters_off", "apply_lora", "lora_modules", "set_adapters_enabled"),
    "layers": ("LoRAColumnParallelLinear", "LoRARowParallelLinear"),
    "merge": ("merged_weight_selector",),
})
