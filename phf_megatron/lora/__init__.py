"""Tensor-parallel LoRA for Megatron Qwen3 (PEFT-compatible adapters), and the EMA teacher."""

from .config import LORA_TARGETS, LoraConfig
from .inject import adapter_parameters, apply_lora, lora_modules, set_adapters_enabled
from .layers import LoRAColumnParallelLinear, LoRARowParallelLinear
from .merge import merged_weight_selector

__all__ = ["LORA_TARGETS", "LoraConfig", "LoRAColumnParallelLinear", "LoRARowParallelLinear", "adapter_parameters",
           "apply_lora", "lora_modules", "merged_weight_selector", "set_adapters_enabled"]
