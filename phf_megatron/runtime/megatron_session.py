"""Megatron-Core's process state: its model-parallel groups and RNG tracker, set up and torn down.

``init_model_parallel(tp, pp, vpp, seed)`` builds Megatron's groups on the joined default group
(``process_group.join_default_group``) and seeds its model-parallel RNG tracker; ``shutdown()``
destroys both. The trainer (``training.distributed``) calls them with the run's layout;
``megatron_session(tp, pp)`` is the pair as a context manager for the converters, benchmarks and
tests. Under a one-process launch ``tp = pp = 1`` (dist checkpoints are layout-agnostic, so this
is all a converter needs); ``torchrun --nproc-per-node tp*pp`` gives a truly sharded run.
"""

from __future__ import annotations

import contextlib

import torch.distributed as dist

from .children import bind_children
from .process_group import join_default_group


def init_model_parallel(tp: int = 1, pp: int = 1, vpp: int | None = None, seed: int = 1234) -> None:
    """Megatron's model-parallel groups for ``tp`` x ``pp`` (x DP filling the world; ``vpp`` model chunks per
    pipeline rank), unless already built, then its RNG tracker seeded with ``seed``.

    Needs the default process group; raises ``ValueError("tp x pp = ... does not divide the world size ...")``.
    """
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    bind_children()  # Megatron's checkpoint writers (forked) die with this process, even on SIGKILL
    world = dist.get_world_size()
    if world % (tp * pp):
        raise ValueError(f"tp x pp = {tp * pp} does not divide the world size {world}")
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                                 virtual_pipeline_model_parallel_size=vpp)
    model_parallel_cuda_manual_seed(seed)


def shutdown(destroy_group: bool = True) -> None:
    """Destroy Megatron's model-parallel groups, then (``destroy_group``) the default process group."""
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if destroy_group and dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def megatron_session(tp: int = 1, pp: int = 1, seed: int = 1234):
    """Yield with ``dist`` and Megatron initialised for ``tp`` x ``pp``; on exit tear down what it set up
    (the default process group only if this call created it)."""
    own_group, _ = join_default_group()
    init_model_parallel(tp, pp, seed=seed)
    try:
        yield
    finally:
        shutdown(destroy_group=own_group)
