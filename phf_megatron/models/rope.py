"""Fused rotary position embedding for the Qwen3 model (GPU fast path; see ``fused.py``)."""

from __future__ import annotations


def install_fused_rope(model) -> None:
    """Route this model's RoPE through the compiled kernel (no-op until implemented)."""
    return None
