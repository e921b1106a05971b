"""Closing an in-process vLLM engine gives back what it held, and only that.

Its device memory (the model runner, the layers vLLM's reload records kept, the KV cache) is free
when ``close()`` returns, and the process group it joined (the trainer's) survives it: vLLM ends its
shutdown by destroying the default process group. A spawned engine's ZMQ sockets go with it too.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from phf_megatron.rollout import sync_weights

from .conftest import HAS_VLLM, another_process_s_socket, start_engine, unix_sockets


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="no vllm")
@pytest.mark.parametrize("refit", [False, True], ids=["fresh", "refit"])
def test_close_frees_the_in_process_engines_model_runner_at_once(tiny_dir, refit):
    """Seen on an H200 (2026-11-26): the in-process engine's model runner (weights + KV cache, 69 GiB
    at gpu_memory_utilization 0.5) sat in reference cycles after close(), and the next engine in the
    process ran out of memory. Then on an H100: after a weight sync (vLLM's layer-wise reload) the
    layers stayed alive in vLLM's reload records, an attention layer holding its KV cache. close()
    frees both: no gc here, the runner, a weight and an attention layer must be gone on return."""
    import weakref

    from transformers import AutoModelForCausalLM

    engine = start_engine("vllm", tiny_dir)
    assert engine.in_process
    allocated = torch.cuda.memory_allocated() if torch.cuda.is_available() else None
    worker = engine.llm.llm_engine.engine_core.engine_core.model_executor.driver_worker
    runner = getattr(worker, "worker", worker).model_runner
    attention = next(m for m in runner.model.modules() if type(m).__name__ == "Attention")
    gone = {"runner": weakref.ref(runner), "weight": weakref.ref(next(runner.model.parameters())),
            "attention": weakref.ref(attention)}
    del worker, runner, attention
    if refit:
        model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
        sync_weights(engine, model.state_dict().items())
    engine.close()
    assert [name for name, ref in gone.items() if ref() is not None] == []
    if allocated is not None:   # GPU: the KV cache and the weights are back (a few MiB of vLLM's own buffers may stay)
        assert torch.cuda.memory_allocated() < 0.1 * allocated


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="no vllm")
@pytest.mark.parametrize("trainer_group", [True, False], ids=["trainer-group", "no-group"])
def test_close_leaves_the_trainers_process_group_and_ends_vllms_own(tiny_dir, trainer_group):
    """vLLM 0.24-0.32 end an in-process engine's shutdown with ``destroy_process_group()``: the trainer's
    default group, which the engine joined, went with it (any later collective failed). It stays now, and
    works; a group vLLM started itself (no trainer's) still ends with the engine."""
    import torch.distributed as dist

    from phf_megatron.runtime.process_group import join_default_group

    if trainer_group:
        join_default_group()
    try:
        engine = start_engine("vllm", tiny_dir)
        assert engine.in_process and dist.is_initialized()
        engine.close()
        assert dist.is_initialized() == trainer_group
        if trainer_group:
            # the trainer's group is NCCL-only on a GPU (join_default_group): a CPU tensor would raise there
            t = torch.ones(2, device="cuda" if dist.get_backend() == "nccl" else "cpu")
            dist.all_reduce(t)
            assert t.tolist() == [1.0, 1.0]
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="no vllm")
def test_a_closed_spawned_engine_leaves_none_of_its_sockets_in_the_temporary_directory(tiny_dir, short_tmp,
                                                                                       monkeypatch):
    """A spawned engine's ZMQ sockets (vLLM 0.32: seven ``<temporary directory>/<uuid4>`` files) were left behind
    by every engine closed (and every failed start), piling up in /tmp; now they are in a directory of the engine's
    own, gone with it, and another process's socket in the temporary directory stays."""
    import tempfile

    from phf_megatron.rollout.vllm_engine import VLLMEngine

    monkeypatch.setattr(tempfile, "tempdir", str(short_tmp))
    monkeypatch.setenv("TMPDIR", str(short_tmp))   # (the engine's processes' temporary directory)
    other = another_process_s_socket(short_tmp)
    engine = VLLMEngine(tiny_dir, dtype="float32", separate_process=True)
    try:
        assert len(unix_sockets(short_tmp)) > 1   # (the engine's, while it runs)
    finally:
        engine.close()
    assert unix_sockets(short_tmp) == [other]


_KILLED_OWNER = """
import sys, time
from phf_megatron.rollout.vllm_engine import VLLMEngine
engine = VLLMEngine(sys.argv[1], dtype="float32", separate_process=True)
print("ENGINE", engine.pid, engine._socket_dir, flush=True)
time.sleep(120)
"""


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="no vllm")
def test_a_sigkilled_owner_s_engine_goes_and_its_socket_directory_with_it(tiny_dir, short_tmp):
    """A SIGKILLed trainer runs no ``close()``: its reaper stopped the spawned engine, but the engine's socket
    directory (seven sockets) stayed in the temporary directory; the reaper removes it too."""
    import signal
    import subprocess
    import sys
    import time

    from tests.helpers import REPO, python_env

    env = {**python_env(), "TMPDIR": str(short_tmp)}
    owner = subprocess.Popen([sys.executable, "-c", _KILLED_OWNER, tiny_dir], cwd=REPO, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        said = next(line for line in owner.stdout if line.startswith("ENGINE ") or owner.poll() is not None)
        _, pid, sockets = said.split()   # (vLLM logs to stdout before it)
        assert os.path.dirname(sockets) == str(short_tmp) and len(unix_sockets(Path(sockets))) > 1
    finally:
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
    deadline = time.monotonic() + 30
    while (os.path.exists(sockets) or os.path.exists(f"/proc/{pid}")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}") and not os.path.exists(sockets)


def test_a_user_s_socket_base_is_kept_and_a_too_long_temporary_directory_gives_one_under_tmp(tmp_path, monkeypatch):
    """The engine's socket directory is not made when the user set ``VLLM_RPC_BASE_PATH``; in a temporary directory
    so long that a socket in it would pass a Unix socket's 107 bytes it is made under /tmp (it was left to vLLM's
    default, that same directory, where the engine could not bind and did not start)."""
    import tempfile

    from phf_megatron.rollout.vllm_environ import new_socket_dir

    assert new_socket_dir(environ={"VLLM_RPC_BASE_PATH": "/mine"}) is None
    long = tmp_path / ("d" * max(1, 70 - len(str(tmp_path))))   # vLLM's own <tmp>/<uuid4>: 107 bytes at most
    long.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long))
    moved = new_socket_dir(environ={})
    try:
        assert moved is not None and os.path.dirname(moved) == "/tmp" and not list(long.iterdir())
    finally:
        os.rmdir(moved)
    monkeypatch.setattr(tempfile, "tempdir", "/tmp")
    short = new_socket_dir(environ={})
    try:
        assert short is not None and os.path.dirname(short) == "/tmp"
    finally:
        os.rmdir(short)
