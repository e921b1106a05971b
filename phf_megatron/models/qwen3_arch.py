"""The numbers that define a Qwen3 dense model, read from a Hugging Face ``config.json``.

``Qwen3Arch`` is the single source of truth for shapes on both sides of the conversion (it
imports neither Megatron nor transformers). It accepts a ``transformers`` config object, the
``config.json`` dict, or a checkpoint directory, and rejects what the converters and the
Megatron model do not implement (other architectures, attention biases, RoPE scaling,
sliding windows) with a ``ValueError`` naming the field.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Any, Mapping

SUPPORTED_MODEL_TYPES = ("qwen3",)


@dataclass(frozen=True)
class Qwen3Arch:
    """Shapes of a Qwen3 dense decoder (names follow the HF config)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    max_position_embeddings: int
    initializer_range: float = 0.02
    attention_dropout: float = 0.0

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_key_value_heads: {self.num_key_value_heads} does not divide "
                f"num_attention_heads={self.num_attention_heads}")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"rms_norm_eps: expected > 0, got {self.rms_norm_eps}")
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta: expected > 0, got {self.rope_theta}")

    # ---- derived sizes -------------------------------------------------------------------
    @property
    def heads_per_group(self) -> int:
        """Query heads sharing one key/value head (GQA ratio)."""
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def check_tensor_parallel(self, tp: int) -> None:
        """Raise unless ``tp`` splits heads, query groups, the FFN and the vocabulary evenly."""
        if not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tp: expected a positive integer, got {tp!r}")
        for name, value in (("num_attention_heads", self.num_attention_heads),
                            ("num_key_value_heads (query groups)", self.num_key_value_heads),
                            ("intermediate_size", self.intermediate_size),
                            ("vocab_size", self.vocab_size)):
            if value % tp:
                raise ValueError(f"tp: tensor-parallel size {tp} does not divide {name}={value}")

    def check_pipeline_parallel(self, pp: int) -> None:
        if not isinstance(pp, int) or pp < 1:
            raise ValueError(f"pp: expected a positive integer, got {pp!r}")
        if self.num_hidden_layers % pp:
            raise ValueError(
                f"pp: pipeline-parallel size {pp} does not divide num_hidden_layers={self.num_hidden_layers}")

    def check_layout(self, tp: int, pp: int) -> None:
        """Raise (``tp: ...``, ``pp: ...``) unless the model splits over ``tp`` x ``pp`` ranks."""
        self.check_tensor_parallel(tp)
        self.check_pipeline_parallel(pp)

    def to_dict(self) -> dict:
        return asdict(self)

    # ---- construction --------------------------------------------------------------------
    @classmethod
    def from_hf(cls, config: Any) -> "Qwen3Arch":
        """From a ``transformers`` config, a ``config.json`` dict, or a directory holding one."""
        raw = _as_dict(config)
        model_type = raw.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            arch = raw.get("architectures")
            raise ValueError(
                f"model_type: expected one of {SUPPORTED_MODEL_TYPES} (a dense Qwen3), got {model_type!r}"
                f" (architectures={arch})")
        if raw.get("attention_bias"):
            raise ValueError("attention_bias: Qwen3 with attention biases is not supported")
        if raw.get("use_sliding_window"):
            raise ValueError("use_sliding_window: sliding-window attention is not supported")
        if raw.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act: expected 'silu', got {raw.get('hidden_act')!r}")
        rope_theta = _rope_theta(raw)
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads") if k not in raw]
        if missing:   # was a KeyError traceback
            raise ValueError(f"{missing[0]}: missing from the config")
        heads = raw["num_attention_heads"]
        head_dim = raw.get("head_dim") or raw["hidden_size"] // heads
        return cls(
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            max_position_embeddings=raw.get("max_position_embeddings", 32768),
            initializer_range=float(raw.get("initializer_range", 0.02)),
            attention_dropout=float(raw.get("attention_dropout", 0.0)),
        )


def _as_dict(config: Any) -> dict:
    if isinstance(config, Qwen3Arch):
        raise TypeError("config: already a Qwen3Arch")
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"config: no config.json at {path}")
        with open(path) as f:
            return json.load(f)
    if isinstance(config, Mapping):
        return dict(config)
    if hasattr(config, "to_dict"):
        return config.to_dict()
    raise TypeError(f"config: expected a transformers config, a dict or a path, got {type(config).__name__}")


def _rope_theta(raw: dict) -> float:
    """RoPE base from either config generation (``rope_theta`` or ``rope_parameters``)."""
    params = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or {}
    for source in (params, scaling):
        rope_type = source.get("rope_type", source.get("type", "default"))
        if rope_type not in (None, "default"):
            raise ValueError(f"rope_scaling: RoPE type {rope_type!r} is not supported (only 'default')")
    theta = params.get("rope_theta", raw.get("rope_theta"))
    if theta is None:
        raise ValueError("rope_theta: missing from the config (neither rope_theta nor rope_parameters)")
    return float(theta)


def arch_of(config: Any) -> Qwen3Arch:
    """``config`` if it is already a ``Qwen3Arch``, else ``Qwen3Arch.from_hf(config)``."""
    return config if isinstance(config, Qwen3Arch) else Qwen3Arch.from_hf(config)
