"""benchmarks/shapes.py: the released Qwen3 sizes have the parameter counts of their model cards."""

import pytest
import torch

from benchmarks.shapes import QWEN3_SIZES, qwen3_config, qwen3_shape

#: Qwen/Qwen3-*'s model cards: "Number of Parameters" and "Number of Parameters (Non-Embedding)", in
#: billions, as printed (so each is exact to half a unit of its last digit).
MODEL_CARDS = {"0.6b": ("0.6", "0.44"), "1.7b": ("1.7", "1.4"), "4b": ("4.0", "3.6"), "8b": ("8.2", "6.95")}


def _agrees(count: int, printed: str) -> bool:
    decimals = len(printed.split(".")[1])
    return abs(count / 1e9 - float(printed)) <= 0.5 * 10 ** -decimals


@pytest.mark.parametrize("name", sorted(MODEL_CARDS))
def test_released_shapes_have_the_model_cards_parameter_counts(name):
    from transformers import Qwen3ForCausalLM

    with torch.device("meta"):
        model = Qwen3ForCausalLM(qwen3_config(name))
    total = sum(p.numel() for p in model.parameters())
    embeddings = model.model.embed_tokens.weight.numel() * (1 if model.config.tie_word_embeddings else 2)
    card_total, card_non_embedding = MODEL_CARDS[name]
    assert _agrees(total, card_total) and _agrees(total - embeddings, card_non_embedding), (name, total, embeddings)


def test_shapes_are_complete_and_overridable():
    assert set(MODEL_CARDS) | {"tiny"} == set(QWEN3_SIZES)
    assert qwen3_shape("1.7b", vocab_size=512)["vocab_size"] == 512 and qwen3_shape("1.7b")["vocab_size"] == 151_936
    with pytest.raises(ValueError, match="shape: '2b' is not one of"):
        qwen3_shape("2b")
