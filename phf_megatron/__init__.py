"""phf-megatron: Privileged Hidden Flow (PHF) on-policy self-distillation on Megatron-Core."""

__version__ = "0.1.0"
