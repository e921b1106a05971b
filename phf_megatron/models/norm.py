"""RMSNorm for Qwen3 inside Megatron-Core, safe under sequence parallelism.

    y = w ⊙ cast(x / sqrt(mean(x², -1) + eps))        (statistics in float32, as HF Qwen3)

The norm is token-wise, so under sequence parallelism (each TP rank holds a slice of the
sequence) every rank computes its own tokens exactly; only the weight gradient is partial. The
weight therefore carries ``sequence_parallel = config.sequence_parallel``, the attribute
Megatron's ``finalize_model_grads`` reads to all-reduce it over the TP group. (Megatron's own
torch-norm fallback, ``WrappedTorchNorm``, asserts ``not sequence_parallel``.) The q/k norms
are all-reduced over TP by Megatron by name (``q_layernorm``/``k_layernorm``).

The builder signature (``config=, hidden_size=, eps=``) is what Megatron-Core 0.16 and 0.19
pass to norm modules. ``config.fused_rmsnorm`` (see ``models/fused.py``) selects the
compiled kernel on GPU; the eager ``fused.rms_norm`` is the reference.
"""

from __future__ import annotations

import torch
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig

from phf_megatron.models import fused
from phf_megatron.models.fused import rms_norm  # the eager reference


class RMSNorm(MegatronModule):
    """Token-wise RMSNorm with an SP-aware weight; ``forward(x[..., hidden]) -> same shape``."""

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-6, **unused):
        super().__init__(config=config)
        self.eps = eps
        device = "cpu" if config.use_cpu_initialization else torch.cuda.current_device()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype, device=device))
        # Read by Megatron's finalize_model_grads: all-reduce this grad over TP under SP.
        setattr(self.weight, "sequence_parallel", config.sequence_parallel)
        self._fused = fused.rmsnorm_fn(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._fused is not None:
            return self._fused(x, self.weight, self.eps)
        return rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}"
