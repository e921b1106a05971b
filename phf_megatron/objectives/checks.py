"""Input checks shared by the objectives.

Every check raises ``ValueError`` whose message starts with the offending argument's
name, so a bad batch is traced to its source rather than to a NaN three steps later.
"""

from __future__ import annotations

import torch


def check_finite(name: str, x: torch.Tensor) -> None:
    """Raise if ``x`` holds NaN or Inf (one device sync; callers may skip it on hot paths)."""
    if not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).sum())
        raise ValueError(f"{name}: {bad} non-finite value(s) (NaN or Inf) in a tensor of shape {tuple(x.shape)}")


def check_same_shape(name_a: str, a: torch.Tensor, name_b: str, b: torch.Tensor) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{name_b}: shape {tuple(b.shape)} does not match {name_a} shape {tuple(a.shape)}")


def check_ndim(name: str, x: torch.Tensor, ndim: int, layout: str) -> None:
    if x.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dims {layout}, got shape {tuple(x.shape)}")


def check_prefix_mask(name: str, valid: torch.Tensor) -> None:
    """``valid`` must be boolean with a True prefix per row (``[T, T, F, F]``, never ``[T, F, T]``)."""
    if valid.dtype != torch.bool:
        raise ValueError(f"{name}: expected a bool tensor, got {valid.dtype}")
    # A prefix mask is non-increasing along the last axis.
    as_int = valid.to(torch.int8)
    if bool((as_int[..., 1:] > as_int[..., :-1]).any()):
        raise ValueError(f"{name}: each row must be a True prefix followed by False (got a True after a False)")
