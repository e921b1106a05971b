"""The one place that decides which implementation evaluates the flow terms: the fused CUDA
kernels or the reference equations of ``objectives.flow``.

``backend="auto"``: the kernels for CUDA float32/bfloat16/float16 inputs with ``m <= 128``
when the extension loads, the PyTorch reference otherwise (CPU tensors never trigger a
build). ``"torch"``: always the reference. ``"cuda"``: the kernels, or an error saying why not.
``pointwise_mse`` has no kernel and always runs the reference.

* ``flow_backend(backend, student, teacher, variant)``: the decision, ``"cuda"`` or ``"torch"``;
* ``flow_terms(backend)``: the terms function of a backend (``objectives.flow.TermsFunction``),
  what ``objectives.hidden_flow_loss(..., terms=)`` and the stage flow of ``parallel`` run;
* ``hidden_flow_loss(..., backend="auto")``: ``objectives.hidden_flow_loss`` on that terms function.
"""

from __future__ import annotations

from functools import partial
from typing import Sequence

import torch

from ..objectives import flow as reference
from ..objectives.flow import FlowTerms, LayerPlan, TermsFunction

FLOW_BACKENDS = ("auto", "torch", "cuda")


def check_backend(backend: str) -> None:
    if backend not in FLOW_BACKENDS:
        raise ValueError(f"backend: unknown value {backend!r}; choose one of {FLOW_BACKENDS}")


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


def flow_backend(backend: str, student: torch.Tensor, teacher: torch.Tensor, variant: str) -> str:
    """``"cuda"`` to run the fused kernels on these inputs, ``"torch"`` for the reference equations.

    Raises ``ValueError`` for an unknown backend, and for ``backend="cuda"`` when the kernels cannot
    run (``RuntimeError`` naming why when the extension is unavailable).
    """
    check_backend(backend)
    if backend == "torch" or variant == "pointwise_mse":
        return "torch"
    problem = kernel_unsupported(student, teacher)
    if backend == "auto":
        if problem is not None:
            return "torch"
        from .loader import available

        return "cuda" if available() else "torch"
    from .loader import require

    require()  # RuntimeError naming why the extension is unavailable
    if problem is not None:
        raise ValueError(f"student: backend='cuda' {problem}")
    return "cuda"


def _decided_terms(backend: str, student: torch.Tensor, teacher: torch.Tensor, valid: torch.Tensor,
                   plan: LayerPlan, variant: str, eps: float) -> FlowTerms:
    """The terms on the implementation ``flow_backend`` picks for these inputs."""
    if flow_backend(backend, student, teacher, variant) == "cuda":
        from . import flow_cuda

        return flow_cuda.flow_terms_cuda(student, teacher, valid, plan, variant, eps)
    return reference.flow_terms(student, teacher, valid, plan, variant, eps)


def flow_terms(backend: str = "auto") -> TermsFunction:
    """The terms function of ``backend``: ``objectives.flow.flow_terms`` itself for ``"torch"``; for
    ``"auto"``/``"cuda"`` one that decides per call (``flow_backend``) and runs that implementation."""
    check_backend(backend)
    if backend == "torch":
        return reference.flow_terms
    return partial(_decided_terms, backend)


def hidden_flow_loss(
    student: torch.Tensor,
    teacher: torch.Tensor,
    valid: torch.Tensor | None = None,
    variant: str = "phf",
    eps: float = 1e-6,
    layers: Sequence[int] | None = None,
    check_inputs: bool = True,
    backend: str = "auto",
) -> torch.Tensor:
    """``objectives.hidden_flow_loss`` (Eq. L_flow) with the terms of ``backend``: ``"auto"`` (the fused
    CUDA kernels of ``csrc/`` for CUDA inputs when the extension loads, else the reference),
    ``"torch"`` (always the reference) or ``"cuda"`` (the kernels, or an error saying why not);
    ``pointwise_mse`` always runs the reference. Other arguments as there."""
    return reference.hidden_flow_loss(student, teacher, valid, variant, eps, layers, check_inputs,
                                      terms=flow_terms(backend))
