"""Which implementation ``hidden_flow_loss`` runs: the fused CUDA kernels or the reference.

``backend="auto"``: the kernels for CUDA float32/bfloat16/float16 inputs with ``m <= 128``
when the extension loads, the PyTorch reference otherwise (CPU tensors never trigger a
build). ``"torch"``: always the reference. ``"cuda"``: the kernels, or an error saying why not.
``pointwise_mse`` has no kernel and always runs the reference.
"""

from __future__ import annotations

import torch

BACKENDS = ("auto", "torch", "cuda")


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend: unknown value {backend!r}; choose one of {BACKENDS}")


def kernel_unsupported(student: torch.Tensor, teacher: torch.Tensor) -> str | None:
    """Why these inputs cannot run on the kernels (None when they can)."""
    from .flow_cuda import MAX_POSITIONS, SUPPORTED_DTYPES

    if not (student.is_cuda and teacher.is_cuda):
        return f"needs CUDA tensors (student on {student.device}, teacher on {teacher.device})"
    if student.dtype not in SUPPORTED_DTYPES or teacher.dtype != student.dtype:
        return f"supports float32/bfloat16/float16 inputs of one dtype (got {student.dtype}, {teacher.dtype})"
    if student.dim() == 4 and student.shape[2] > MAX_POSITIONS:
        return f"supports at most {MAX_POSITIONS} window positions (m = {student.shape[2]})"
    return None


def use_kernels(backend: str, student: torch.Tensor, teacher: torch.Tensor, variant: str) -> bool:
    """True to run the CUDA kernels; raises for ``backend="cuda"`` when they cannot run."""
    check_backend(backend)
    if backend == "torch" or variant == "pointwise_mse":
        return False
    problem = kernel_unsupported(student, teacher)
    if backend == "auto":
        if problem is not None:
            return False
        from .loader import available

        return available()
    from .loader import require

    require()  # RuntimeError naming why the extension is unavailable
    if problem is not None:
        raise ValueError(f"student: backend='cuda' {problem}")
    return True
