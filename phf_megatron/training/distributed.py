"""Process-group set-up for a run: torchrun or a single process, GPU (NCCL) or CPU (gloo).

    torchrun --nproc-per-node 8 -m phf_megatron.train --config configs/phf_qwen3_8b.yaml ...
    python -m phf_megatron.train --config configs/tiny_cpu.yaml ...        # one process

Joining the group (and the CPU shims without CUDA) and Megatron's groups are ``runtime``'s.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from ..config_errors import fail
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


def init_distributed(cfg: TrainConfig) -> DistributedContext:
    """Join (or create) the default process group and build Megatron's model-parallel groups.

    Under ``torchrun`` the usual environment variables are read; a plain ``python`` launch is a
    world of one. Data parallelism fills what tensor x pipeline parallelism leaves.
    """
    join_default_group()
    rank, world, local = dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0))
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
    return DistributedContext(rank, world, local, torch.device("cuda", local) if cuda else torch.device("cpu"))


def shutdown_distributed() -> None:
    """The run's teardown: Megatron's groups, then the default process group (``runtime.shutdown``)."""
    shutdown()
