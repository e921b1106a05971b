"""The model shapes every benchmark uses: Qwen3's released sizes and the tiny CPU smoke-run shape.

    from benchmarks.shapes import qwen3_config, qwen3_shape
    qwen3_shape("1.7b")                          # HF Qwen3Config fields (+ model_type), for build_qwen3_model
    qwen3_config("8b", tie_word_embeddings=True) # a transformers.Qwen3Config (random-init benchmarks)
    hf_config(shape)                             # the same from a shape's fields

The released sizes are the layer shapes of ``Qwen/Qwen3-{0.6B,1.7B,4B,8B}/config.json`` (the
weights are random in every benchmark: only the shapes matter). Run the benchmarks from the
repository root as modules (``python -m benchmarks.phf_step ...``), so this module imports.
"""

from __future__ import annotations

from typing import Any

#: Qwen3's vocabulary (the padded embedding of every released size; the real tokenizer's ids fit).
QWEN3_VOCAB = 151_936

#: Fields the released Qwen3 configs share.
QWEN3_COMMON = dict(model_type="qwen3", vocab_size=QWEN3_VOCAB, rope_theta=1e6, max_position_embeddings=40_960,
                    rms_norm_eps=1e-6)


def layer_shape(hidden: int, layers: int, heads: int, kv_heads: int, head_dim: int, ffn: int, tied: bool) -> dict[str, Any]:
    return dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                head_dim=head_dim, intermediate_size=ffn, tie_word_embeddings=tied)


#: name -> the layer shape (hidden, layers, query heads, KV heads, head_dim, FFN, tied embeddings).
QWEN3_SIZES = {
    "0.6b": layer_shape(1024, 28, 16, 8, 128, 3072, tied=True),
    "1.7b": layer_shape(2048, 28, 16, 8, 128, 6144, tied=True),
    "4b": layer_shape(2560, 36, 32, 8, 128, 9728, tied=True),
    "8b": layer_shape(4096, 36, 32, 8, 128, 12288, tied=False),
    # the CPU smoke runs of the GPU benchmarks: 4 layers (first, middle and last stages all occur)
    "tiny": dict(layer_shape(64, 4, 4, 2, 16, 128, tied=True), vocab_size=512, max_position_embeddings=512),
}


def qwen3_shape(name: str, **overrides) -> dict[str, Any]:
    """The HF config fields of shape ``name`` (``QWEN3_SIZES``), with ``overrides``."""
    if name not in QWEN3_SIZES:
        raise ValueError(f"shape: {name!r} is not one of {tuple(QWEN3_SIZES)}")
    return {**QWEN3_COMMON, **QWEN3_SIZES[name], **overrides}


def hf_config(shape: dict[str, Any]):
    """``transformers.Qwen3Config`` from the fields of a shape (``qwen3_shape``)."""
    from transformers import Qwen3Config

    return Qwen3Config(**{k: v for k, v in shape.items() if k != "model_type"})


def qwen3_config(name: str, **overrides):
    """``transformers.Qwen3Config`` of shape ``name`` with ``overrides``."""
    return hf_config(qwen3_shape(name, **overrides))
