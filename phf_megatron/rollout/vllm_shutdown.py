"""Stopping a ``vllm.LLM`` so that it gives back what it held, and only that.

An in-process engine's device memory (the model runner, the layers vLLM's reload records keep, the KV cache) is
free once ``shut_down`` returns and the caller drops the engine; the default process group it joined (the
trainer's) survives vLLM's shutdown, which ends by destroying it (``tests/rollout/test_engine_close.py``).
"""

from __future__ import annotations

import contextlib
import warnings


def shut_down(llm, *, in_process: bool, keep_default_group: bool) -> None:
    """Stop ``llm``'s engine and, when it ran ``in_process``, drop vLLM's reload records of its layers;
    ``keep_default_group``: the engine joined this process's default group, which stays."""
    modules = _in_process_modules(llm) if in_process else []
    with _keeping_default_group(keep_default_group):
        _shutdown(llm)
    _forget_reload_state(modules)


def _shutdown(llm) -> None:
    """Stop a ``vllm.LLM``: vLLM 0.24-0.33 have no ``LLMEngine.shutdown``; the engine core client does
    (stops the spawned engine process and its workers, or the in-process executor)."""
    engine = llm.llm_engine
    for owner in (engine, getattr(engine, "engine_core", None)):
        shutdown = getattr(owner, "shutdown", None)
        if callable(shutdown):
            shutdown()
            return


def forget_failed_start(joined_default_group: bool) -> None:
    """After an in-process engine failed to start: vLLM's distributed state (its groups, and the default process
    group it made when this process had none) is dropped, as its shutdown would, so that the process is as it was
    (a retry, another engine, torch.distributed's state); a default group it joined (the trainer's) stays.
    Called while the start's error is raised: a cleanup that fails is a one-line warning, never its traceback
    in place of the start's one-line error."""
    try:
        from vllm.distributed import parallel_state
    except Exception:   # noqa: BLE001 - not imported that far, or broken: nothing of vLLM's to drop
        return
    try:
        try:
            parallel_state.destroy_model_parallel()
        finally:
            with _keeping_default_group(joined_default_group):
                parallel_state.destroy_distributed_environment()
    except Exception as err:   # noqa: BLE001 - the start's error is the one the user sees
        warnings.warn(f"vLLM's state after its failed start was not dropped ({type(err).__name__}: {err}); "
                      "another engine started in this process may fail", stacklevel=2)


def default_group_exists() -> bool:
    """True when this process has a default process group (the trainer's), which an in-process engine joins."""
    import torch.distributed as dist
    return dist.is_available() and dist.is_initialized()


@contextlib.contextmanager
def _keeping_default_group(keep: bool):
    """While an in-process engine shuts down: vLLM 0.24-0.32 end with ``destroy_process_group()`` of the
    default group (``cleanup_dist_env_and_memory``), which is the trainer's when the engine joined it;
    with ``keep`` that one call is skipped (vLLM's own groups still go)."""
    import torch.distributed as dist
    if not keep:
        yield
        return
    destroy = dist.destroy_process_group

    def destroy_but_the_default(group=None):
        if group is not None and group is not dist.GroupMember.WORLD:
            destroy(group)

    dist.destroy_process_group = destroy_but_the_default
    try:
        yield
    finally:
        dist.destroy_process_group = destroy


def _in_process_modules(llm) -> list:
    """Every module of an in-process engine's model (``[]`` when it cannot be reached)."""
    core = getattr(llm.llm_engine.engine_core, "engine_core", None)          # InprocClient -> EngineCore
    worker = getattr(getattr(core, "model_executor", None), "driver_worker", None)
    runner = getattr(getattr(worker, "worker", worker), "model_runner", None)
    model = getattr(runner, "model", None)
    return list(model.modules()) if model is not None else []


def _forget_reload_state(modules) -> None:
    """Drop vLLM's layer-wise reload records of ``modules`` (vLLM 0.24-0.32 keep them in a global
    ``WeakKeyDictionary`` whose values hold the layer itself in closures, so an engine refit with
    ``reload_weights`` never frees its layers, and an attention layer keeps its KV cache: seen on an
    H100, the next in-process engine ran out of memory beside the closed one's 39 GiB)."""
    try:
        from vllm.model_executor.model_loader.reload import layerwise
    except ImportError:
        return
    for module in modules:
        layerwise.LAYERWISE_INFO.pop(module, None)
        layerwise.LOADING_LAYERS.discard(module)
