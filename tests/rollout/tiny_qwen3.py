"""Tiny random Qwen3 checkpoints with the real Qwen3 tokenizer, for rollout and eval tests.

Shapes: vocab 151,936 (Qwen3's padded embedding), hidden 64, 2 layers, 4 query heads and 2 KV
heads (GQA) of head_dim 32 (≠ hidden / heads = 16; vLLM-CPU supports 32). About 20M
parameters, almost all in the embedding and the output head. ``initializer_range`` is raised
from Qwen3's 0.02 to 0.3 so the next-token distribution is peaked: greedy paths then have
clear margins, and vLLM and transformers pick the same tokens.
"""

from __future__ import annotations

import os

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from phf_megatron.tokenizer import QWEN3_PADDED_VOCAB, load_qwen3_tokenizer


def tiny_qwen3_config(*, tied: bool = False, head_dim: int = 32, **overrides) -> Qwen3Config:
    kw = dict(vocab_size=QWEN3_PADDED_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim, max_position_embeddings=1024,
              rms_norm_eps=1e-6, rope_theta=1_000_000.0, tie_word_embeddings=tied, initializer_range=0.3,
              bos_token_id=151643, eos_token_id=151645, pad_token_id=151643)
    kw.update(overrides)
    return Qwen3Config(**kw)


def build_tiny_qwen3(*, tied: bool = False, seed: int = 0, **overrides) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(tiny_qwen3_config(tied=tied, **overrides)).float().eval()
    return model


def save_tiny_qwen3(out_dir: str, *, tied: bool = False, seed: int = 0, **overrides) -> Qwen3ForCausalLM:
    """Write a tiny Qwen3 (fp32 safetensors) and the real Qwen3 tokenizer to ``out_dir``."""
    model = build_tiny_qwen3(tied=tied, seed=seed, **overrides)
    model.generation_config.eos_token_id = [151645, 151643]
    model.save_pretrained(out_dir)
    load_qwen3_tokenizer().save_pretrained(out_dir)
    assert os.path.isfile(os.path.join(out_dir, "model.safetensors"))
    return model


@torch.no_grad()
def perturb_(model: torch.nn.Module, *, seed: int, scale: float = 0.05, names=None) -> list[str]:
    """Add seeded noise to the named parameters (all when ``names`` is None); returns the names."""
    g = torch.Generator().manual_seed(seed)
    touched = []
    for name, p in model.named_parameters():
        if names is None or name in names:
            spread = max(float(p.std()) if p.numel() > 1 else 0.0, 0.1)   # norm weights start at 1 (std 0)
            p.add_(torch.randn(p.shape, generator=g) * scale * spread)
            touched.append(name)
    return touched
