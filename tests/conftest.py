"""Shared test set-up: CPU-only, deterministic, float64 where the math is compared."""

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """Untied tiny Qwen3 (real vocabulary) + the real tokenizer, written once per session
    (``tests/helpers/tiny_qwen3.py``): the rollout engines' and the evaluator's model."""
    from tests.helpers.tiny_qwen3 import save_tiny_qwen3

    d = tmp_path_factory.mktemp("tiny_qwen3")
    save_tiny_qwen3(str(d))
    return str(d)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
