"""The CUDA generators in a checkpoint's RNG state when the resumed process sees another number of GPUs.

GPU-only logic, tested here on CPU by patching ``torch.cuda``'s functions with a fake machine: a run
trained under torchrun (each rank sees all 8 GPUs, rank 3's current device is 3) resumed under Slurm's
``srun --gpus-per-task=1`` (each rank sees one GPU, its device 0). A rank draws only from its current
device's generator, so that one is restored from the saved ``cuda_device``; an older checkpoint without
that index keeps the refusal, one line naming the checkpoint's file. The assertions say which saved
state lands on which device.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

from phf_megatron.errors import InputFileError
from phf_megatron.training import checkpoint as ckpt
from phf_megatron.training import rng_state
from phf_megatron.training.checkpoint_parts import Part, RankLayout, Scope, rng_part


class FakeCuda:
    """``count`` devices, each generator state a distinct byte tensor; records what is set where."""

    def __init__(self, count: int, current: int, fill: int):
        self.count, self.current = count, current
        self.states = [torch.full((16,), fill + i, dtype=torch.uint8) for i in range(count)]
        self.set_all: list[list[int]] | None = None
        self.set_one: list[tuple[int, int]] = []   # (value of the state, device)

    def install(self, monkeypatch) -> None:
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "is_available", lambda: True)
        monkeypatch.setattr(cuda, "device_count", lambda: self.count)
        monkeypatch.setattr(cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(cuda, "get_rng_state_all", lambda: [s.clone() for s in self.states])
        monkeypatch.setattr(cuda, "set_rng_state_all", lambda states: setattr(self, "set_all", [int(s[0]) for s in states]))
        monkeypatch.setattr(cuda, "set_rng_state", lambda state, device="cuda": self.set_one.append((int(state[0]), device)))


class NoTracker:
    def get_states(self):
        return {}

    def set_states(self, states):
        raise AssertionError("no tracker state was saved")


@pytest.fixture(autouse=True)
def _no_megatron_tracker(monkeypatch):
    monkeypatch.setattr(rng_state, "_megatron_tracker", NoTracker)


def test_a_resume_on_one_visible_gpu_restores_the_ranks_own_device_generator(monkeypatch):
    FakeCuda(count=8, current=3, fill=10).install(monkeypatch)   # torchrun: rank 3 sees the node's 8 GPUs
    state = rng_state.capture_rng_state()
    assert state["cuda_device"] == 3
    resumed = FakeCuda(count=1, current=0, fill=100)   # srun --gpus-per-task=1: its GPU is device 0
    resumed.install(monkeypatch)
    rng_state.restore_rng_state(state)
    assert resumed.set_one == [(13, 0)] and resumed.set_all is None   # saved device 3's state, on device 0


def test_the_same_visible_gpus_restore_every_device(monkeypatch):
    FakeCuda(count=4, current=1, fill=10).install(monkeypatch)
    state = rng_state.capture_rng_state()
    resumed = FakeCuda(count=4, current=1, fill=100)
    resumed.install(monkeypatch)
    rng_state.restore_rng_state(state)
    assert resumed.set_all == [10, 11, 12, 13] and resumed.set_one == []


def test_an_older_checkpoint_on_other_gpus_is_refused_in_one_line_naming_its_file(tmp_path, monkeypatch):
    FakeCuda(count=8, current=3, fill=10).install(monkeypatch)

    def older_capture():   # what the code saved before cuda_device
        state = rng_state.capture_rng_state()
        state.pop("cuda_device", None)
        return state

    ckpt.save_checkpoint(str(tmp_path), 1, {"rng": Part(Scope.RANK, older_capture, rng_state.restore_rng_state)},
                         RankLayout())
    resumed = FakeCuda(count=1, current=0, fill=100)
    resumed.install(monkeypatch)
    random.random()   # a draw after the save: a restored Python generator would go back before it
    before = random.getstate()
    with pytest.raises(InputFileError) as err:
        ckpt.load_checkpoint(str(tmp_path), {"rng": rng_part()}, RankLayout())
    path = os.path.join(str(tmp_path), "iter_0000001", RankLayout().file_name(Scope.RANK))
    assert str(err.value) == (
        f"{path}: part 'rng' does not fit this run: rng state: saved for 8 CUDA device(s) without the rank's own "
        "device index (an older checkpoint), this process sees 1: resume with the same visible GPUs "
        "(CUDA_VISIBLE_DEVICES), or skip it (--checkpoint.no_load_rng)")
    assert resumed.set_one == [] and resumed.set_all is None and random.getstate() == before   # nothing restored


def test_the_same_visible_gpus_on_another_device_restore_the_ranks_own_generator(monkeypatch):
    """Same count, another device: trained on 2 nodes x 4 ranks of 8-GPU nodes (NGPU=4, rank 5 is node 1's local
    rank 1, device 1), resumed on one node's 8 ranks (rank 5 on device 5). Every device's state goes back as saved,
    and the rank's current device gets the one it drew from (saved device 1's), not saved device 5's (never used)."""
    FakeCuda(count=8, current=1, fill=10).install(monkeypatch)
    state = rng_state.capture_rng_state()
    resumed = FakeCuda(count=8, current=5, fill=100)
    resumed.install(monkeypatch)
    rng_state.restore_rng_state(state)
    assert resumed.set_all == list(range(10, 18)) and resumed.set_one == [(11, 5)]
