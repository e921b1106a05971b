"""Join the default process group: torchrun's, or a one-process group on a free local port.

Used by ``megatron_session`` (the trainer's and the converters' set-up) and by the tests that
spawn ranks. NCCL with CUDA, gloo without; on a machine without CUDA the Megatron-Core CPU shims
are applied (``cpu_shims``), the GPU path never touches them.
"""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist

from ..commands import launch_world, launcher_int
from ..errors import UserError


#: What ``join_default_group`` reads (torchrun sets them; a world of one sets them itself).
RENDEZVOUS_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def standalone_environ(environ=None) -> dict[str, str]:
    """``environ`` (default this process's) without ``RENDEZVOUS_VARS``: for a child process that forms
    a process group of its own (a converter, a second run). Inherited, they would send the child to
    this process's rendezvous port, which this process still holds (``EADDRINUSE``)."""
    return {k: v for k, v in (os.environ if environ is None else environ).items() if k not in RENDEZVOUS_VARS}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_rank() -> int:
    """``LOCAL_RANK``: this rank's index on its node (its GPU), 0 when it is not set in a world of one; a ``UserError``
    naming it when it is not a whole number (``commands.launcher_int``) or when a launch of several ranks did not set it
    (mpirun, srun or a script of one's own without torchrun: every rank took GPU 0, in silence)."""
    world = launch_world()
    if "LOCAL_RANK" not in os.environ and world is not None and world[1] > 1:
        raise UserError(f"LOCAL_RANK is not set (RANK={world[0]}, WORLD_SIZE={world[1]}): each rank needs its index on "
                        "its node, its GPU (else every rank takes GPU 0); torchrun sets it (examples/launch_phf.sh); "
                        "under mpirun or srun without torchrun set LOCAL_RANK=$OMPI_COMM_WORLD_LOCAL_RANK or $SLURM_LOCALID")
    return launcher_int("LOCAL_RANK")


def sees_gpus(count: int) -> str:
    """``this process sees N GPU(s) (CUDA_VISIBLE_DEVICES=...)``: the part of a line refusing a GPU past them."""
    return f"this process sees {count} GPU(s) (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"


def local_device() -> int:
    """``LOCAL_RANK``, the GPU this rank takes; a ``UserError`` when it is not one this process sees (a hand-made
    launch, e.g. srun's one task per GPU with ``--gpus-per-task=1`` and ``LOCAL_RANK=$SLURM_LOCALID``: was CUDA's
    ``invalid device ordinal`` traceback in ``set_device``)."""
    local, count = local_rank(), torch.cuda.device_count()
    if local >= count:
        raise UserError(f"LOCAL_RANK={str(local)!r}: {sees_gpus(count)}: one rank per GPU, LOCAL_RANK < {count}; "
                        "torchrun sets it (examples/launch_phf.sh)")
    return local


def join_default_group() -> tuple[bool, int]:
    """Initialise ``torch.distributed`` from the environment unless it is already: True if this call did, and this
    rank's ``LOCAL_RANK`` (read once, before joining; a world of one is 0).

    Without torchrun's variables the process is a world of one (``MASTER_PORT`` kept if set).
    """
    if launch_world() is None:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("MASTER_PORT", str(free_port())))
    rank, world = launch_world()
    cuda = torch.cuda.is_available()
    local = local_device() if cuda else local_rank()   # (before joining: a bad LOCAL_RANK leaves no group behind)
    if cuda:
        torch.cuda.set_device(local)
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    if not cuda:
        from . import cpu_shims

        cpu_shims.apply()
    return created, local
