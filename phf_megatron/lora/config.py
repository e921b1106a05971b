"""LoRA hyperparameters (paper Appendix A: r = 64, alpha = 128 on q, k, v, o, gate, up, down)."""

from __future__ import annotations

from dataclasses import dataclass

from ..config_errors import check_choice, check_positive, fail

#: HF Qwen3 projection names, as PEFT's ``target_modules`` spells them.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class LoraConfig:
    """LoRA adapters on the frozen base (paper: every run); disabled = full fine-tuning."""

    enabled: bool = True
    """Train LoRA adapters (True, paper) or every weight (False)."""
    r: int = 64
    """Adapter rank (paper: 64)."""
    alpha: float = 128.0
    """Scale numerator: the update is (alpha / r) * B A (paper: 128)."""
    dropout: float = 0.05
    """LoRA dropout (TRL ModelConfig default, which the official scripts keep); ``model.disable_dropout``
    zeroes it at train time, by default for --method=phf only (GOLDConfig; SFT and GRPO train with it)."""
    target_modules: tuple[str, ...] = LORA_TARGETS
    """HF projection names adapted (paper: q, k, v, o, gate, up, down), one adapter each as PEFT."""

    def __post_init__(self) -> None:
        self.target_modules = tuple(self.target_modules)
        check_positive("lora.r", self.r)
        check_positive("lora.alpha", self.alpha)
        if not 0.0 <= self.dropout < 1.0:
            raise fail("lora.dropout", f"must lie in [0, 1), got {self.dropout}")
        if not self.target_modules:
            raise fail("lora.target_modules", "is empty; use --lora.enabled=false for full fine-tuning")
        for name in self.target_modules:
            check_choice("lora.target_modules", name, LORA_TARGETS)
        if len(set(self.target_modules)) != len(self.target_modules):
            raise fail("lora.target_modules", f"repeats a module: {list(self.target_modules)}")

    @property
    def scaling(self) -> float:
        """alpha / r, PEFT's ``scaling`` (2.0 with the paper's values)."""
        return self.alpha / self.r
