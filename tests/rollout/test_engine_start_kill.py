"""An engine process killed while vLLM starts it: the start error names its pid and exit code
(vLLM's own text said ``Failed core proc(s): {}``). And the exit code of an engine that another
thread reaped first."""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time

import pytest

from phf_megatron.rollout import EngineStartError
from phf_megatron.runtime.children import exit_code


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


def test_the_exit_code_waits_for_the_thread_that_reaped_the_process():
    """vLLM's monitor thread polls its engine core too. When its ``waitpid`` reaps the process, ours
    reads None (ECHILD) until that thread stores the code; the death message then named only the pid
    (CI, test_engine_groups). ``exit_code`` waits for the stored code."""
    proc = multiprocessing.get_context("spawn").Process(target=sys.exit, args=(3,))
    proc.start()
    multiprocessing.connection.wait([proc.sentinel])
    _, status = os.waitpid(proc.pid, 0)       # the other thread reaps it ...
    assert proc.exitcode is None              # ... so one poll here reads nothing
    store = threading.Timer(0.3, setattr, (proc._popen, "returncode", os.waitstatus_to_exitcode(status)))
    store.start()                             # ... and it stores the code a moment later (Popen.poll)
    try:
        assert exit_code(proc) == 3
    finally:
        store.join()


def test_the_exit_code_of_a_running_process_is_none_after_the_timeout():
    """Every poll is non-blocking: a live child never holds the caller past the timeout."""
    proc = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(60,))
    proc.start()
    try:
        start = time.monotonic()
        assert exit_code(proc, timeout=0.3) is None
        assert time.monotonic() - start < 5
    finally:
        proc.kill()
        proc.join()
    assert exit_code(proc) == -signal.SIGKILL

