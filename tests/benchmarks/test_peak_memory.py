"""The benchmark's peak-memory counter survives vLLM's reset of torch's peak statistics."""

import threading
import time

from benchmarks.peak_memory import GIB, PeakMemory, allocated_around_sleep


class _Allocator:
    """torch's peak statistic as vLLM leaves it: a running max that anyone may reset."""

    def __init__(self):
        self.peak = 0

    def allocate(self, nbytes):
        self.peak = max(self.peak, nbytes)

    def reset(self):          # torch.cuda.reset_peak_memory_stats(), e.g. inside vLLM
        self.peak = 0

    def read_and_reset(self):
        peak, self.peak = self.peak, 0
        return peak


def test_step_peaks_are_kept_by_us_and_the_engine_start_is_not_a_step():
    alloc = _Allocator()
    alloc.allocate(50 * GIB)                                   # the engine's start, before the counter
    peak = PeakMemory(device_used=lambda: 0, allocator_peak=alloc.read_and_reset)
    with peak:
        for step_peak in (7 * GIB, 9 * GIB, 3 * GIB):
            alloc.allocate(step_peak)
            peak.step_done()
            alloc.reset()                                       # a reset after the step loses nothing
    got = peak.result()
    assert got["peak_mem_gib"] == 9 and got["peak_mem_gib_by_step"] == [7, 9, 3]


def test_the_polling_thread_sees_a_spike_between_steps():
    used = [1 * GIB]
    seen = threading.Event()

    def device_used():
        if used[0] == 6 * GIB:
            seen.set()
        return used[0]

    peak = PeakMemory(interval_s=0.001, device_used=device_used, allocator_peak=lambda: 0)
    with peak:
        used[0] = 6 * GIB                                       # e.g. vLLM's wake during a rollout
        assert seen.wait(10)
        used[0] = 2 * GIB
        time.sleep(0.01)
    assert peak.result()["peak_device_used_gib"] == 6


def test_without_cuda_every_value_is_none():
    with PeakMemory() as peak:
        peak.step_done()
    assert peak.result() == {"peak_mem_gib": None, "peak_device_used_gib": None, "peak_mem_gib_by_step": None}


class _Engine:
    """An engine whose sleep frees (or, as vLLM's cumem pool may, keeps counted) what it holds."""

    def __init__(self, held, frees):
        self.allocated, self.held, self.frees, self.calls = held, held, frees, 0

    def sleep(self):
        self.calls += 1
        if self.frees:
            self.allocated -= self.held


def test_allocated_around_each_sleep_shows_whether_the_sleeping_engine_stays_counted():
    for frees, after in ((True, 0), (False, 5)):
        engine = _Engine(5 * GIB, frees)
        seen = allocated_around_sleep(engine, allocated=lambda: engine.allocated)
        engine.sleep()          # as the trainer calls it: the instance's attribute
        assert engine.calls == 1 and seen == [{"before_gib": 5, "after_gib": after}]


def test_allocated_around_sleep_is_none_without_cuda_or_engine():
    import torch

    assert allocated_around_sleep(None, allocated=lambda: 0) is None
    if not torch.cuda.is_available():
        engine = _Engine(GIB, True)
        assert allocated_around_sleep(engine) is None and "sleep" not in vars(engine)   # nothing wrapped
