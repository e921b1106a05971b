"""Run a function on N gloo ranks with Megatron-Core on CPU (torch.multiprocessing spawn).

    results = run_ranks(fn, world_size, *args)   # fn(rank, world_size, *args) on every rank

Each rank (CUDA hidden from it, on a GPU machine too) joins a fresh gloo group, applies ``cpu_shims``,
runs ``fn`` and returns a picklable
value; ``run_ranks`` returns the list of values by rank (an exception on any rank fails the
call with that rank's traceback). Spawning costs seconds, so run several checks per spawn and
switch layouts inside with ``megatron_layout(tp, pp)``. ``free_port`` is the package's.
"""

from __future__ import annotations

import os
import tempfile

import torch
import torch.multiprocessing as mp

from phf_megatron.runtime.process_group import free_port  # noqa: F401 - part of this module's API


def _entry(rank, world_size, port, out_dir, fn, args):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    from phf_megatron.runtime import cpu_shims

    cpu_shims.apply()
    try:
        result = fn(rank, world_size, *args)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def run_ranks(fn, world_size: int, *args):
    """``[fn(rank, world_size, *args) for rank in range(world_size)]``, each on its own process."""
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""   # CPU ranks (gloo + cpu_shims) on a GPU machine too, as in CI
    try:
        with tempfile.TemporaryDirectory() as out_dir:
            mp.spawn(_entry, args=(world_size, free_port(), out_dir, fn, args), nprocs=world_size, join=True)
            return [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False) for r in range(world_size)]
    finally:
        if hidden is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES")
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = hidden


def megatron_layout(tp: int, pp: int, seed: int = 1234, vpp: int | None = None) -> None:
    """(Re)initialise Megatron's model-parallel groups for ``tp`` x ``pp`` (``vpp`` virtual stages;
    DP fills the rest) and seed the model-parallel RNG tracker."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    parallel_state.destroy_model_parallel()
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                             virtual_pipeline_model_parallel_size=vpp)
    model_parallel_cuda_manual_seed(seed)
