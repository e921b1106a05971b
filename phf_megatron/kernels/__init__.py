"""Fused CUDA kernels (``csrc/``) behind the reference objectives, with a clean CPU fallback.

``kernels`` owns the choice between the kernels and the reference (``dispatch``): the objectives
never dispatch by themselves.
"""

from .dispatch import (FLOW_BACKENDS, check_backend, flow_backend, flow_terms, hidden_flow_loss,
                       kernel_unsupported)
from .loader import available, load_extension, require, unavailable_reason

__all__ = [
    "FLOW_BACKENDS", "available", "check_backend", "flow_backend", "flow_terms", "hidden_flow_loss",
    "kernel_unsupported", "load_extension", "require", "unavailable_reason",
]
