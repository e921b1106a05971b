"""The trainer's stop signal (``--checkpoint.exit_signal``) stays its own across a real vLLM engine's start.

vLLM installs SIGTERM and SIGINT handlers only in the processes it spawns: the engine core
(``EngineCoreProc.run_engine_core``: vllm 0.32 ``v1/engine/core.py:1469``, 0.24 ``:1221``) and the ``mp``
executor's workers (``WorkerProc.worker_main``: 0.32 ``v1/executor/multiproc_executor.py:881``, 0.24 ``:826``),
never in the process that builds ``LLM(...)``: the in-process engine (``InprocClient``, ``uni`` executor)
installs none. So the handler ``stopping_at_once`` (and after it ``StopSignal``) put in the trainer's
process before the engines start is still the one there once they run, and after their close.
"""

from __future__ import annotations

import signal

import pytest

from phf_megatron.training.config_sections import EXIT_SIGNALS

from .conftest import HAS_VLLM


def _caught(pid: int) -> set[str]:
    """The signals process ``pid`` has a handler for (``SigCgt`` of ``/proc/PID/status``)."""
    with open(f"/proc/{pid}/status") as f:
        mask = int(next(line for line in f if line.startswith("SigCgt:")).split()[1], 16)
    return {s.name for s in signal.Signals if mask >> (s.value - 1) & 1}


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="no vllm")
@pytest.mark.parametrize("separate_process", [False, True], ids=["in-process", "spawned"])
def test_the_engine_leaves_the_trainers_signal_handlers_alone(tiny_dir, separate_process):
    from phf_megatron.rollout.vllm_engine import VLLMEngine

    names = sorted(set(EXIT_SIGNALS) | {"SIGINT"})
    ours = {name: (lambda signum, frame: None) for name in names}
    before = {name: signal.signal(getattr(signal, name), handler) for name, handler in ours.items()}
    try:
        engine = VLLMEngine(tiny_dir, dtype="float32", separate_process=separate_process)
        try:
            assert {n: signal.getsignal(getattr(signal, n)) for n in names} == ours
            if separate_process:  # vLLM's own handlers are in its engine core process: SIGTERM and SIGINT only
                assert _caught(engine.pid) & set(names) == {"SIGTERM", "SIGINT"}
        finally:
            engine.close()
        assert {n: signal.getsignal(getattr(signal, n)) for n in names} == ours
    finally:
        for name, handler in before.items():
            signal.signal(getattr(signal, name), handler)
