"""Fixtures of the trainer tests: the tiny model directory and toy data set, made once per session."""

import pytest

from ..helpers.tiny_qwen3 import make_tiny_hf
from ..helpers.tiny_run import make_toy_jsonl


@pytest.fixture(scope="session")
def tiny_inputs(tmp_path_factory):
    """``(hf_dir, data_path)``: a tiny random Qwen3 with the real tokenizer, and a toy math JSONL."""
    root = tmp_path_factory.mktemp("tiny")
    return make_tiny_hf(str(root / "hf")), make_toy_jsonl(str(root / "toy.jsonl"))
