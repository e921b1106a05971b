"""Capture and restore every random generator a training step draws from (one rank's share).

Python ``random``, NumPy's global generator, torch's CPU generator, every CUDA device's generator
(when CUDA is available, with the index of this process's current device, ``cuda_device``) and Megatron's RNG tracker (the named states that ``tensor_parallel``
forks for dropout inside model-parallel regions; on CPU these are the shims' CPU generator
states). The result holds only tensors, ints, floats, strings and tuples, so it loads with
``torch.load(..., weights_only=True)``. Each rank saves its own (``checkpoint.Scope.RANK``).

A rank draws only from its current device's generator, so a resume where the process sees another
number of devices (torchrun's ranks see all 8 GPUs, ``srun --gpus-per-task=1``'s see one), or the same
number with the rank on another device (2 nodes x 4 ranks, then one node's 8), restores that generator
from the saved ``cuda_device`` entry; a checkpoint without it (saved before) must see
the same devices.
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
        "cuda_device": torch.cuda.current_device() if torch.cuda.is_available() else None,
        "megatron_tracker": {name: s.clone() for name, s in tracker.get_states().items()},
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put back what ``capture_rng_state`` returned; raises ``ValueError`` if the saved CUDA devices do not fit."""
    missing = {"python", "numpy", "torch_cpu", "cuda", "megatron_tracker"} - set(state)
    if missing:
        raise ValueError(f"rng state: missing entries {sorted(missing)}")
    if torch.cuda.is_available():   # checked first: a state that does not fit changes no generator
        _restore_cuda(state["cuda"], state.get("cuda_device"))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch_cpu"])
    tracker_states = state["megatron_tracker"]
    if tracker_states:
        _megatron_tracker().set_states({name: s.clone() for name, s in tracker_states.items()})


def _restore_cuda(cuda: list[torch.Tensor] | None, saved_device: int | None) -> None:
    """Every device's generator when this process sees as many devices as were saved, the current one from the
    saved current device (``cuda_device``) where the rank is on another device now; else (another
    ``CUDA_VISIBLE_DEVICES`` split, e.g. ``srun --gpus-per-task=1``) the current device's, from the
    saved process's current device (``cuda_device``: absent from older checkpoints, which then raise)."""
    count = torch.cuda.device_count()
    if cuda is not None and len(cuda) == count:
        torch.cuda.set_rng_state_all(cuda)
        current = torch.cuda.current_device()   # the same count, the rank on another device (2 x 4 ranks, then 8)
        if saved_device is not None and saved_device != current:
            torch.cuda.set_rng_state(cuda[saved_device], current)
    elif cuda is not None and saved_device is not None and 0 <= saved_device < len(cuda):
        torch.cuda.set_rng_state(cuda[saved_device], torch.cuda.current_device())
    elif cuda is None:
        raise ValueError(f"rng state: saved without CUDA, this process sees {count} CUDA device(s): "
                         "skip it (--checkpoint.no_load_rng)")
    else:
        raise ValueError(f"rng state: saved for {len(cuda)} CUDA device(s) without the rank's own device index "
                         f"(an older checkpoint), this process sees {count}: resume with the same visible GPUs "
                         "(CUDA_VISIBLE_DEVICES), or skip it (--checkpoint.no_load_rng)")
