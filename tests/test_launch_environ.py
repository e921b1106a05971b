"""The launcher's variables a rank reads (torchrun's RANK, WORLD_SIZE, LOCAL_RANK, GROUP_RANK; commands.launcher_int):
a hand-made launch that sets one to something other than a whole number is one line naming the variable and its value
(each was a ValueError traceback where it was read), before any process group is joined."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from phf_megatron.errors import UserError

WHOLE_NUMBER = "expected a whole number (torchrun sets it: examples/launch_phf.sh)"


@pytest.fixture
def launch(monkeypatch):
    """A hand-made launch of one rank on 127.0.0.1 (the variables torchrun sets), no CUDA; ``launch(**env)`` sets more."""
    import torch

    from phf_megatron.runtime.process_group import free_port

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for name, value in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                            MASTER_PORT=str(free_port())).items():
        monkeypatch.setenv(name, value)
    assert not dist.is_initialized()
    yield lambda **env: [monkeypatch.setenv(k, v) for k, v in env.items()]
    if dist.is_initialized():   # (the failure before the fix: the group was joined, then int() failed)
        dist.destroy_process_group()


def test_a_stray_local_rank_in_a_world_of_one_is_the_device_it_joined_with(launch, monkeypatch):
    """A plain ``python`` launch (no RANK, WORLD_SIZE) with a LOCAL_RANK left in the shell is a world of one on its
    GPU 0 (``join_default_group``); the trainer's context read the stray value before joining, so its device
    (``cuda:3``) was not the one set (``cuda:0``)."""
    from phf_megatron.training.config import TrainConfig
    from phf_megatron.training.distributed import init_distributed, shutdown_distributed

    launch(LOCAL_RANK="3")
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    try:
        assert init_distributed(TrainConfig()).local_rank == 0
    finally:
        shutdown_distributed()


@pytest.mark.parametrize("value", ["first", "²"])   # "²".isdigit() is True, and int() refuses it
def test_a_local_rank_that_is_not_a_number_is_one_line_before_the_group_is_joined(launch, value):
    """The trainer's set-up (``init_distributed``) read it with ``int()`` after joining the group."""
    from phf_megatron.training.config import TrainConfig
    from phf_megatron.training.distributed import init_distributed

    launch(LOCAL_RANK=value)
    with pytest.raises(UserError) as err:
        init_distributed(TrainConfig())
    assert err.value.line == f"LOCAL_RANK={value!r}: {WHOLE_NUMBER}"
    assert not dist.is_initialized()


def test_a_node_index_that_is_not_a_number_is_one_line():
    """Where the rollout engines go (``rollout.groups.this_node``, torchrun's ``GROUP_RANK``)."""
    from phf_megatron.rollout.groups import this_node

    assert (this_node({}), this_node({"GROUP_RANK": " 3"})) == (0, 3)
    with pytest.raises(UserError) as err:
        this_node({"GROUP_RANK": "node-1"})
    assert err.value.line == f"GROUP_RANK='node-1': {WHOLE_NUMBER}"


@pytest.mark.parametrize("env, want", [
    ({}, (1, 1)),
    ({"WORLD_SIZE": "2"}, (1, 1)),   # without RANK a world of one (process_group): a stray WORLD_SIZE was read
    ({"WORLD_SIZE": "two"}, (1, 1)),
    ({"RANK": "0", "WORLD_SIZE": "2"}, (2, 1)),
    ({"RANK": "0", "WORLD_SIZE": "two"}, "WORLD_SIZE='two': torchrun sets RANK and WORLD_SIZE (whole numbers, "
                                         "RANK < WORLD_SIZE); unset RANK for a run of one process"),
])
def test_the_converters_read_the_world_the_process_group_will_have(monkeypatch, env, want):
    """The converters' layout (``convert.checkpoints._launch_layout``) read ``WORLD_SIZE`` with ``int()``, with or
    without ``RANK``; the run's export (``training.export``) reads it the same way."""
    from phf_megatron.convert.checkpoints import _launch_layout

    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if isinstance(want, tuple):
        assert _launch_layout(2, 1) == want
    else:
        with pytest.raises(UserError) as err:
            _launch_layout(2, 1)
        assert err.value.line == want


@pytest.mark.parametrize("env, gpu", [
    ({"RANK": "1", "WORLD_SIZE": "2"}, None),        # mpirun / srun / a script without torchrun: was GPU 0 for each
    ({"RANK": "0", "WORLD_SIZE": "1"}, 0),           # a world of one: its GPU 0
    ({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "3"}, 3),
])
def test_a_launch_of_several_ranks_without_local_rank_is_one_line(monkeypatch, env, gpu):
    """Each rank of a launch that sets RANK and WORLD_SIZE but not LOCAL_RANK took GPU 0 (``local_device``'s default),
    all of them on one GPU, in silence. Now one line naming LOCAL_RANK, before any device is set."""
    import torch

    from phf_megatron.runtime import process_group

    def set_device(device):   # (stops the set-up there: a world of several would wait for its other ranks)
        raise RuntimeError(f"set_device({device})")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises((UserError, RuntimeError)) as err:
        process_group.join_default_group()
    if gpu is None:
        assert err.type is UserError and err.value.line == (
            "LOCAL_RANK is not set (RANK=1, WORLD_SIZE=2): each rank needs its index on its node, its GPU (else every "
            "rank takes GPU 0); torchrun sets it (examples/launch_phf.sh); under mpirun or srun without torchrun set "
            "LOCAL_RANK=$OMPI_COMM_WORLD_LOCAL_RANK or $SLURM_LOCALID")
    else:
        assert (err.type, str(err.value)) == (RuntimeError, f"set_device({gpu})")
