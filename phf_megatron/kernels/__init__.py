"""Fused CUDA kernels (``csrc/``) behind the reference objectives, with a clean CPU fallback."""

from .dispatch import BACKENDS, check_backend, kernel_unsupported, use_kernels
from .loader import available, load_extension, require, unavailable_reason

__all__ = [
    "BACKENDS", "available", "check_backend", "kernel_unsupported", "load_extension", "require",
    "unavailable_reason", "use_kernels",
]
