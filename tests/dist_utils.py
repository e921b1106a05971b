"""Run a function on N CPU ranks (gloo) with Megatron's model-parallel state initialised."""

from __future__ import annotations

import os
import socket
import traceback

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world_size, port, tp, pp, fn, args, errors):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        from phf_megatron.parallel import cpu_shims

        cpu_shims.apply()
        from megatron.core import parallel_state
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

        parallel_state.initialize_model_parallel(tp, pp)
        model_parallel_cuda_manual_seed(1234)
        fn(rank, *args)
    except BaseException:  # report the failing rank's traceback to the parent
        errors.put((rank, traceback.format_exc()))
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn, world_size: int, tp: int = 1, pp: int = 1, args: tuple = ()) -> None:
    """Spawn ``world_size`` processes running ``fn(rank, *args)``; re-raise the first failure."""
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    try:
        mp.start_processes(_worker, args=(world_size, free_port(), tp, pp, fn, args, errors), nprocs=world_size,
                           start_method="spawn")
    except Exception as exc:
        details = errors.get() if not errors.empty() else (None, str(exc))
        raise AssertionError(f"rank {details[0]} failed:\n{details[1]}") from None
