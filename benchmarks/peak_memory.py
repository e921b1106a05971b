"""Peak GPU memory over a run with a colocated vLLM engine, by a counter of our own.

    peak = PeakMemory()            # after the engine started
    with peak:                     # a thread samples the device's used memory
        for _ in range(steps):
            step()
            peak.step_done()       # torch's allocator peak of the step, then reset
    peak.result()                  # {"peak_mem_gib": ..., "peak_device_used_gib": ..., "peak_mem_gib_by_step": [...]}

Why not ``torch.cuda.max_memory_allocated()`` alone: vLLM resets torch's peak statistics when
it starts and profiles (``reset_peak_memory_stats``), so over a run that starts an engine it
reports the peak since the engine's start, and a later reset would cut it again. Here each
step's allocator peak is read and reset by us and the maximum kept (``peak_mem_gib``), and a
thread samples the device's used memory (``total - free``: the trainer, vLLM's weights and KV
cache whether or not torch's allocator holds them, every process on the GPU) every
``interval_s`` (``peak_device_used_gib``; a spike shorter than the interval can be missed).
Without CUDA every value is None.

``peak_device_used_gib`` is the headline figure for now: vLLM's sleep mode unmaps its weights and KV
cache, but they were allocated through torch's allocator (vLLM's cumem ``MemPool``), so the allocator's
counts, and ``peak_mem_gib`` with them, may still include a sleeping engine (a 1.7B run on an H100:
allocator peak 45.5 GiB, device used 39.2 GiB, unexplained). ``allocated_around_sleep`` records
``torch.cuda.memory_allocated()`` just before and after each of the engine's sleeps to settle it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

GIB = 2**30


def _cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def _device_used() -> int:
    import torch
    free, total = torch.cuda.mem_get_info()
    return total - free


def _allocated() -> int:
    import torch
    return torch.cuda.memory_allocated()


def _allocator_peak_and_reset() -> int:
    import torch
    peak = torch.cuda.max_memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    return peak


class PeakMemory:
    """See the module docstring; ``device_used`` and ``allocator_peak`` read the GPU (tests pass their own)."""

    def __init__(self, interval_s: float = 0.02, *, device_used: Callable[[], int] | None = None,
                 allocator_peak: Callable[[], int] | None = None):
        on = device_used is not None or _cuda()
        self.interval_s = interval_s
        self._device_used = device_used or (_device_used if on else None)
        self._allocator_peak = allocator_peak or (_allocator_peak_and_reset if on else None)
        self.device_peak: int | None = None
        self.step_peaks: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self._allocator_peak is not None:
            self._allocator_peak()   # start from here: what came before (the engine's start) is not a step's

    def _sample(self) -> None:
        used = self._device_used()
        self.device_peak = used if self.device_peak is None else max(self.device_peak, used)

    def _poll(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> "PeakMemory":
        if self._device_used is not None:
            self._sample()
            self._thread = threading.Thread(target=self._poll, name="peak-memory", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._sample()

    def step_done(self) -> None:
        """Record the step's allocator peak (and reset it for the next step)."""
        if self._allocator_peak is not None:
            self.step_peaks.append(self._allocator_peak())
        if self._device_used is not None:
            self._sample()

    def result(self) -> dict:
        """``peak_mem_gib`` (max of the steps' allocator peaks), ``peak_device_used_gib``, per step."""
        return {"peak_mem_gib": max(self.step_peaks) / GIB if self.step_peaks else None,
                "peak_device_used_gib": None if self.device_peak is None else self.device_peak / GIB,
                "peak_mem_gib_by_step": [p / GIB for p in self.step_peaks] or None}


def allocated_around_sleep(engine, allocated: Callable[[], int] | None = None) -> list[dict] | None:
    """Wrap ``engine.sleep`` to record torch's allocated memory just before and just after each call
    (``{"before_gib", "after_gib"}``, appended to the returned list as the run goes). If ``after`` stays near
    ``before``, the allocator still counts the sleeping engine's memory. None (nothing wrapped) without an
    engine, or without CUDA unless ``allocated`` is given (tests)."""
    if engine is None or (allocated is None and not _cuda()):
        return None
    allocated = allocated or _allocated
    seen: list[dict] = []
    sleep = engine.sleep

    def recorded_sleep(*args, **kwargs):
        before = allocated()
        out = sleep(*args, **kwargs)
        seen.append({"before_gib": before / GIB, "after_gib": allocated() / GIB})
        return out

    engine.sleep = recorded_sleep
    return seen
