"""A spawned vLLM engine that hangs (alive, answering nothing: SIGSTOP) past the call's timeout.

The generate raises ``GenerationTimeoutError``; then ``close`` kills the engine and fails the call
still waiting on it. Before, that call's thread waited forever, and Python joins a pool's threads
at exit: the trainer saved its checkpoint, printed the error and never exited (its engine alive).
"""

from __future__ import annotations

import os
import subprocess

import pytest

from ..helpers import run_python

#: A process that starts a spawned engine, hangs it, times a generate (``sys.argv[2]``) or a weight push out,
#: closes it and exits.
_HUNG_ENGINE = """
import os, signal, sys, torch
from phf_megatron.rollout import EngineConfig, GenerationTimeoutError, SamplingParams, build_engine
engine = build_engine(EngineConfig(model_dir=sys.argv[1], backend="vllm", dtype="float32", separate_process=True,
                                   enforce_eager=True, timeout_s=float(sys.argv[3])))
print("engine pid", engine.pid, flush=True)
os.kill(engine.pid, signal.SIGSTOP)
try:
    if sys.argv[2] == "generate":
        engine.generate([[1, 2, 3]], SamplingParams(max_tokens=4), timeout_s=2)
    else:
        name, shape = next((n, s) for n, s in engine.spec.shapes.items() if n.endswith("norm.weight"))
        engine.update_weights([(name, torch.ones(shape))])
except GenerationTimeoutError as err:
    print(err, flush=True)
engine.close(wait_s=1)
print("closed", flush=True)
"""


@pytest.mark.vllm
@pytest.mark.parametrize("call", ["generate", "update_weights"])
def test_a_hung_spawned_engine_times_out_and_the_process_still_exits(tiny_dir, call):
    """A generate, and a weight push (which had no timeout: a hung engine hung the trainer's sync)."""
    pytest.importorskip("vllm")
    try:
        proc = run_python(["-c", _HUNG_ENGINE, tiny_dir, call, "2" if call == "update_weights" else "600"], timeout=150)
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"the process did not exit after closing its hung engine:\n{(err.stdout or b'')[-2000:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"VLLMEngine.{call} did not finish within 2 s" in proc.stdout and "closed" in proc.stdout, proc.stdout
    pid = int(proc.stdout.split("engine pid ", 1)[1].split()[0])
    assert not os.path.exists(f"/proc/{pid}"), f"the engine process {pid} outlived its trainer"
