"""An engine process killed while vLLM starts it: the start error names its pid and exit code
(vLLM's own text said ``Failed core proc(s): {}``)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from phf_megatron.rollout import EngineStartError


def _kill_the_spawned_engine(pids: list[int], stop: threading.Event) -> None:
    import psutil

    me = psutil.Process()
    while not stop.is_set():
        for child in me.children():
            try:
                spawned = "multiprocessing.spawn" in " ".join(child.cmdline())   # not the resource tracker
            except psutil.Error:
                continue
            if spawned:
                pids.append(child.pid)
                os.kill(child.pid, signal.SIGKILL)
                return
        time.sleep(0.005)


@pytest.mark.vllm
def test_an_engine_killed_during_start_up_is_named_with_pid_and_exit_code(tiny_dir):
    pytest.importorskip("vllm")
    pytest.importorskip("psutil")
    from phf_megatron.rollout.vllm_engine import VLLMEngine

    pids, stop = [], threading.Event()
    killer = threading.Thread(target=_kill_the_spawned_engine, args=(pids, stop), daemon=True)
    killer.start()
    try:
        with pytest.raises(EngineStartError) as err:
            VLLMEngine(tiny_dir, dtype="float32", separate_process=True).close()
    finally:
        stop.set()
        killer.join()
    [pid] = pids
    assert f"pid {pid} exit code -9 (SIGKILL)" in str(err.value), str(err.value)
