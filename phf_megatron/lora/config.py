"""LoRA hyperparameters (paper Appendix A: r = 64, alpha = 128 on q, k, v, o, gate, up, down)."""

from __future__ import annotations

from dataclasses import dataclass

#: HF Qwen3 projection names, as PEFT's ``target_modules`` spells them.
ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class LoRAConfig:
    enabled: bool = True
    """False = full fine-tuning of every parameter."""
    rank: int = 64
    """r (paper: 64)."""
    alpha: float = 128.0
    """alpha; the update is scaled by alpha / r (paper: 128)."""
    dropout: float = 0.05
    """dropout on the adapter input (TRL ModelConfig default, used by the official OPSD code)."""
    targets: tuple[str, ...] = ALL_TARGETS
    """which HF projections get an adapter."""

    def __post_init__(self) -> None:
        self.targets = tuple(self.targets)
        if self.rank < 1:
            raise ValueError(f"lora.rank: must be >= 1, got {self.rank}")
        if self.alpha <= 0:
            raise ValueError(f"lora.alpha: must be > 0, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora.dropout: must lie in [0, 1), got {self.dropout}")
        unknown = sorted(set(self.targets) - set(ALL_TARGETS))
        if unknown or not self.targets:
            raise ValueError(f"lora.targets: {unknown or 'empty'}; choose from {ALL_TARGETS}")

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank
