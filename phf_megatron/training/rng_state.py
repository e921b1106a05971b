"""Capture and restore every random generator a training step draws from (one rank's share).

Python ``random``, NumPy's global generator, torch's CPU generator, every CUDA device's generator
(when CUDA is available) and Megatron's RNG tracker (the named states that ``tensor_parallel``
forks for dropout inside model-parallel regions; on CPU these are the shims' CPU generator
states). The result holds only tensors, ints, floats, strings and tuples, so it loads with
``torch.load(..., weights_only=True)``. Each rank saves its own (``checkpoint.Scope.RANK``).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def _megatron_tracker():
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    return get_cuda_rng_tracker()


def capture_rng_state() -> dict[str, Any]:
    """This process's generator states (copies: later draws do not change them)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    tracker = _megatron_tracker()
    return {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch_cpu": torch.get_rng_state().clone(),
        "cuda": [s.clone() for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else None,
        "megatron_tracker": {name: s.clone() for name, s in tracker.get_states().items()},
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put back what ``capture_rng_state`` returned; raises if the saved CUDA devices differ."""
    missing = {"python", "numpy", "torch_cpu", "cuda", "megatron_tracker"} - set(state)
    if missing:
        raise ValueError(f"rng state: missing entries {sorted(missing)}")
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch_cpu"])
    cuda = state["cuda"]
    if torch.cuda.is_available():
        if cuda is None or len(cuda) != torch.cuda.device_count():
            saved = "none" if cuda is None else len(cuda)
            raise ValueError(f"rng state: saved for {saved} CUDA device(s), this process sees {torch.cuda.device_count()}")
        torch.cuda.set_rng_state_all(cuda)
    tracker_states = state["megatron_tracker"]
    if tracker_states:
        _megatron_tracker().set_states({name: s.clone() for name, s in tracker_states.items()})
