"""Fixtures: tiny Qwen3 checkpoints on disk, and engines of each backend (one per module)."""

import importlib.util

import pytest

from phf_megatron.rollout import EngineConfig, build_engine

from ..helpers.tiny_qwen3 import save_tiny_qwen3

HAS_VLLM = importlib.util.find_spec("vllm") is not None

#: Backends every contract test runs on; vLLM tests are marked and skipped without vllm.
BACKEND_PARAMS = [
    pytest.param("hf", id="hf"),
    pytest.param("vllm", id="vllm", marks=[pytest.mark.vllm,
                                           pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed")]),
]


@pytest.fixture(scope="session")
def tiny_tied_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_qwen3_tied")
    save_tiny_qwen3(str(d), tied=True)
    return str(d)


def start_engine(backend: str, model_dir: str, **overrides):
    """An fp32 engine (logprobs are compared at 1e-4)."""
    if backend == "vllm":
        pytest.importorskip("vllm")
    return build_engine(EngineConfig(model_dir=model_dir, backend=backend, dtype="float32", **overrides))
