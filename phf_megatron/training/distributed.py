"""Process-group set-up for a run: torchrun or a single process, GPU (NCCL) or CPU (gloo).

    torchrun --nproc-per-node 8 -m phf_megatron.train --config configs/phf_qwen3_8b.yaml ...
    python -m phf_megatron.train --config configs/tiny_cpu.yaml ...        # one process

Joining the group (and the CPU shims without CUDA) and Megatron's groups are ``runtime``'s.
``lost_contact(err)`` tells a collective that failed because another rank is gone (killed, its node
down) from any other error (a timeout included: a stuck rank times out the same way); ``lost_rank`` makes it
the ``LostRank`` every surviving rank says at once, before any cleanup; ``kept`` (``input_files``) names what a stopped run keeps.
"""

from __future__ import annotations

import random
import re
import signal
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from ..commands import report_stop
from ..config_errors import fail
from ..errors import LostRank, RunStopped, error_chain
from ..input_files import kept
from ..runtime.megatron_session import init_model_parallel, shutdown
from ..runtime.process_group import join_default_group
from .config import TrainConfig


@dataclass(frozen=True)
class DistributedContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0


def seed_everything(seed: int) -> None:
    """Python, NumPy and torch RNGs; Megatron's model-parallel tracker is seeded separately."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def seed_pipeline_stage(seed: int) -> None:
    """torch's generators and Megatron's RNG tracker seeded ``seed + 100 x pipeline rank`` (Megatron's
    ``_set_random_seed``): seeded alike, every stage drew the same dropout masks
    (layer i of stage 0 and layer i of stage 1 had one draw). TP and DP peers of a stage stay alike."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    stage_seed = seed + 100 * ps.get_pipeline_model_parallel_rank()
    torch.manual_seed(stage_seed)
    model_parallel_cuda_manual_seed(stage_seed)


def init_distributed(cfg: TrainConfig) -> DistributedContext:
    """Join (or create) the default process group and build Megatron's model-parallel groups.

    Under ``torchrun`` the usual environment variables are read; a plain ``python`` launch is a
    world of one. Data parallelism fills what tensor x pipeline parallelism leaves.
    """
    _, local = join_default_group()   # (a world of one is LOCAL_RANK 0, the GPU it set)
    rank, world = dist.get_rank(), dist.get_world_size()
    cuda = torch.cuda.is_available()
    m = cfg.model
    model_parallel = m.tensor_model_parallel_size * m.pipeline_model_parallel_size
    if world % model_parallel:
        raise fail("model.tensor_model_parallel_size",
                   f"tensor_model_parallel_size x pipeline_model_parallel_size = {model_parallel} does not divide "
                   f"the world size {world} (launch with a multiple of {model_parallel} processes)")
    # Identical weights on every data-parallel replica (Megatron's DDP does not broadcast them).
    seed_everything(cfg.training.seed)
    init_model_parallel(m.tensor_model_parallel_size, m.pipeline_model_parallel_size,
                        m.virtual_pipeline_model_parallel_size, seed=cfg.training.seed)
    seed_pipeline_stage(cfg.training.seed)
    return DistributedContext(rank, world, local, torch.device("cuda", local) if cuda else torch.device("cpu"))


def shutdown_distributed() -> None:
    """The run's teardown: Megatron's groups, then the default process group (``runtime.shutdown``)."""
    shutdown()


#: gloo's transport errors (``IoException``: a peer closed or reset the connection) reach Python as a plain
#: ``RuntimeError`` (no ``DistError`` type in torch 2.13), named by the transport file that threw them:
#: "[.../gloo/transport/tcp/pair.cc:553] Connection closed by peer ...". Its checks of the call ("[enforce fail
#: at .../gloo/...]": a bug, such as sizes that differ) do not match.
_GLOO_LOST = re.compile(r"\[[^\]\s]*gloo/transport/[^\]\s]*:\d+\] ")
#: NCCL's text for ``ncclRemoteError`` (a ``DistBackendError``): a peer is gone. Any other NCCL error
#: (invalid usage, a CUDA error) is a bug.
_NCCL_LOST = "remote process exited or there was a network error"
#: A timeout is not taken for a lost rank (gloo's "Timed out waiting ...", "Application timeout caused pair
#: closure", NCCL's watchdog): a rank stuck in a deadlock or a mismatched collective times out the same way,
#: and its traceback says where it waited.
_TIMEOUT = re.compile(r"timed out|timeout", re.IGNORECASE)


def lost_contact(err: BaseException) -> str | None:
    """The backend's own one-line message when ``err`` (or what it was raised from) is a collective's
    failure because another rank is gone: a ``DistNetworkError`` (the rendezvous store or a socket), an
    NCCL ``DistBackendError`` of ``_NCCL_LOST``, a gloo transport error (by its text: gloo gives it no
    type of its own); None for any other error, a timeout included (its traceback stays)."""
    for e in error_chain(err):
        text = str(e).strip()
        if _TIMEOUT.search(text):
            return None
        if (isinstance(e, dist.DistNetworkError)
                or (isinstance(e, dist.DistBackendError) and _NCCL_LOST in text)
                or (type(e) is RuntimeError and _GLOO_LOST.match(text))):
            line = _GLOO_LOST.sub("", text, count=1).splitlines()[0] if text else type(e).__name__
            return line.split(". This is typically caused by")[0][:300]  # gloo's advice: the line that follows says it
    return None


def lost_rank(err: BaseException, phase: str, save_dir: str, redone: bool = False,
              after: type[BaseException] | None = None) -> LostRank | None:
    """``err`` as the ``LostRank`` every surviving rank reports when it is a collective's failure because another
    rank is gone (``lost_contact``; not a ``RunStopped``, said already), else None. Its line is printed now
    (``commands.report_stop``) and torchrun's SIGTERM ignored from here on: torchrun stops the survivors as soon
    as one worker dies (SIGTERM, then SIGKILL 30 s later), and the cleanup that follows the error (the engines'
    shutdown, the process group's) may outlast that. ``phase``: what the run was doing; ``save_dir``, ``redone``:
    what it keeps (``kept``); ``after``: the type of a failure the run was handling when the rank was lost (the
    rollout engines', whose checkpoint it was saving), named first: the root cause, maybe why the rank is gone."""
    if isinstance(err, RunStopped) or (lost := lost_contact(err)) is None:
        return None
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    first = next((e for e in error_chain(err) if isinstance(e, after)), None) if after else None
    cause = f"{first}; then " if first is not None else ""
    stop = LostRank(f"{cause}lost contact with another rank ({phase}: {lost}); a process or node of the run died "
                    f"or stopped answering; {kept(save_dir, redone)}; rerun the same command to resume")
    report_stop(stop)
    return stop
