"""Tensor-parallel LoRA for Megatron Qwen3 (PEFT-compatible adapters), and the EMA teacher."""

from .config import ALL_TARGETS, LoRAConfig
from .inject import adapter_parameters, apply_lora, lora_modules, set_adapters_enabled
from .layers import LoRAColumnParallelLinear, LoRARowParallelLinear

__all__ = ["ALL_TARGETS", "LoRAConfig", "LoRAColumnParallelLinear", "LoRARowParallelLinear", "adapter_parameters",
           "apply_lora", "lora_modules", "set_adapters_enabled"]
