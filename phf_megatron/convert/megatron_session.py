"""Process-group and Megatron set-up for the conversion tools.

``megatron_session(tp, pp)`` joins the process group (torchrun's environment when present,
otherwise a one-process group on a free local port), applies the CPU shims when there is no
GPU, initialises Megatron's model parallelism and seeds its RNG; on exit it tears all of it
down. Under a one-process launch ``tp = pp = 1`` (dist checkpoints are layout-agnostic, so
this is all a converter needs); ``torchrun --nproc-per-node tp*pp`` gives a truly sharded run.
"""

from __future__ import annotations

import contextlib

import torch.distributed as dist

from ..parallel.process_group import join_default_group


@contextlib.contextmanager
def megatron_session(tp: int = 1, pp: int = 1, seed: int = 1234):
    """Yield with ``dist`` and Megatron initialised for ``tp`` x ``pp`` (x DP filling the world)."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    own_group = join_default_group()
    world = dist.get_world_size()
    if world % (tp * pp):
        raise ValueError(f"tp x pp = {tp * pp} does not divide the world size {world}")
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    model_parallel_cuda_manual_seed(seed)
    try:
        yield
    finally:
        parallel_state.destroy_model_parallel()
        if own_group:
            dist.destroy_process_group()
