"""The process the library runs in: the default process group, a Megatron-Core session, CPU shims.

Shared by the trainer (``training.distributed``), the converters (``convert.checkpoints``), the
benchmarks and the tests; it imports nothing of ours above ``errors``, so every layer may use it.

* ``process_group``: ``join_default_group()`` (torchrun's group, or a one-process group on a free
  local port; NCCL with CUDA, gloo and the CPU shims without), ``free_port()``,
  ``standalone_environ()`` (the environment for a child that forms a group of its own);
* ``megatron_session``: ``init_model_parallel(tp, pp, vpp, seed)`` (Megatron's groups and RNG
  tracker), ``shutdown()``, and ``megatron_session(tp, pp)``, the two as a context manager;
* ``children``: ``bind_children()``: helper processes die with this one, even on SIGKILL;
* ``cpu_shims``: Megatron-Core on CPU torch + gloo (tests and the tiny CPU runs only).

Submodules load on first use (``lazy_exports``).
"""

from ..lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "megatron_session": ("init_model_parallel", "megatron_session", "shutdown"),
    "process_group": ("free_port", "join_default_group", "standalone_environ"),
})
