"""Fixtures for the data tests: the real Qwen3 tokenizer (loaded once per session)."""

import pytest

from phf_megatron.data import load_qwen3_tokenizer


@pytest.fixture(scope="session")
def qwen3_tokenizer():
    return load_qwen3_tokenizer()
