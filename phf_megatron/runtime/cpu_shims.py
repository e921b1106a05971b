"""Run Megatron-Core on CPU torch + gloo (tests and the tiny CPU example only).

Megatron-Core assumes CUDA in a handful of places that do not concern the math:

1. tensor factories and moves with a hard-coded CUDA device (``device="cuda"``,
   ``device=torch.cuda.current_device()``, ``tensor.cuda()``) in the pipeline schedules,
   ``transformer/utils.py``, ``tensor_parallel/data.py``, the optimizer, grad clipping, rotary
   embeddings, ``utils.py``;
2. stream and synchronisation calls (``torch.cuda.synchronize`` in dist-checkpointing preload
   and batched p2p, ``torch.cuda.current_stream`` in the DDP grad sync);
3. the CUDA RNG tracker (``model_parallel_cuda_manual_seed`` and ``fork``);
4. type-name checks (``grad.type() == 'torch.cuda.FloatTensor'`` in grad clipping).

``apply()`` fixes all three without editing Megatron: a ``TorchFunctionMode`` maps any CUDA
device argument to the CPU, a few ``torch.cuda`` functions become CPU no-ops, and the RNG
tracker forks the CPU generator instead. It refuses to run where CUDA is available: the GPU
path never touches this module. The distributed optimizer does not run on CPU (it needs CUDA
tensor types); the plain Megatron optimizer does.
"""

from __future__ import annotations

import contextlib
import threading

import torch
from torch.overrides import TorchFunctionMode

_applied = False
_lock = threading.Lock()


def _is_cuda_device(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, int) and not isinstance(device, bool)


class CudaToCpuMode(TorchFunctionMode):
    """Rewrites CUDA device arguments of torch calls to ``cpu``; everything else passes through."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if "device" in kwargs and _is_cuda_device(kwargs["device"]):
            kwargs = {**kwargs, "device": "cpu"}
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            # Megatron asserts e.g. ``grad.type() == 'torch.cuda.FloatTensor'`` (grad clipping):
            # report the CUDA type name of the same dtype.
            name = func(*args)
            return name if name.startswith("torch.cuda.") else name.replace("torch.", "torch.cuda.", 1)
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda_device(args[1]):
            args = (args[0], "cpu", *args[2:])
        if kwargs.get("pin_memory"):
            kwargs = {**kwargs, "pin_memory": False}  # pinned host memory needs CUDA
        return func(*args, **kwargs)


class _NullStream:
    """Stands in for ``torch.cuda.Stream``: work on CPU is already ordered."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, *args, **kwargs):
        pass

    def wait_event(self, *args, **kwargs):
        pass

    def record_event(self, *args, **kwargs):
        return _NullEvent()

    def synchronize(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _NullEvent:
    def __init__(self, *args, **kwargs):
        pass

    def record(self, *args, **kwargs):
        pass

    def wait(self, *args, **kwargs):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True


def _patch_torch_cuda() -> None:
    cuda = torch.cuda
    cuda.current_device = lambda: "cpu"
    cuda.synchronize = lambda *a, **k: None
    cuda.current_stream = lambda *a, **k: _NullStream()
    cuda.default_stream = lambda *a, **k: _NullStream()
    cuda.Stream = _NullStream
    cuda.Event = _NullEvent
    cuda.stream = lambda *a, **k: contextlib.nullcontext()
    cuda.empty_cache = lambda: None
    cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()
    cuda.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    cuda.manual_seed = lambda seed: None
    cuda.manual_seed_all = lambda seed: None
    cuda.memory_allocated = lambda *a, **k: 0
    cuda.max_memory_allocated = lambda *a, **k: 0


def _patch_rng_tracker() -> None:
    """Megatron's RNG tracker, with the CPU generator playing the role of the CUDA one."""
    from megatron.core.tensor_parallel import random as mrandom

    def get_state(*args, **kwargs):
        return torch.get_rng_state()

    def set_state(state, *args, **kwargs):
        torch.set_rng_state(state)

    mrandom._get_cuda_rng_state = get_state
    mrandom._set_cuda_rng_state = set_state

    class CpuRNGStatesTracker(mrandom.CudaRNGStatesTracker):
        def add(self, name, seed):
            self._is_initialized = True
            if seed in self.seeds_:
                raise Exception(f"seed {seed} already exists")
            if name in self.states_:
                raise Exception(f"rng state {name} already exists")
            self.seeds_.add(seed)
            self.states_[name] = torch.Generator().manual_seed(seed).get_state()

        @contextlib.contextmanager
        def fork(self, name=mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME):
            if name not in self.states_:
                raise Exception(f"rng state {name} is not added")
            outer = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(outer)

    mrandom.CudaRNGStatesTracker = CpuRNGStatesTracker
    mrandom.initialize_rng_tracker(force_reset=True)


def apply() -> None:
    """Make Megatron-Core runnable on this CPU-only process. Idempotent; refuses on CUDA."""
    global _applied
    with _lock:
        if _applied:
            return
        if torch.cuda.is_available():
            raise RuntimeError("cpu_shims.apply() is for CPU-only machines; CUDA is available here")
        _patch_torch_cuda()
        _patch_rng_tracker()
        CudaToCpuMode().__enter__()  # stays on the mode stack for the life of the process
        _applied = True
