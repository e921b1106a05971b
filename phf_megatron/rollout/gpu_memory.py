"""GPU memory around a colocated rollout engine: release the trainer's cache, explain a refusal.

vLLM sizes its share of the GPU (weights + KV cache) as ``gpu_memory_utilization x total``
and, at start-up, refuses to start when less than that is free (``vllm/v1/worker/utils.py``,
``request_memory``: "Free memory on device ... is less than desired GPU memory utilization",
0.24.0 to 0.33.0). In a colocated run the student, its optimizer state and the EMA copy are
already on the GPU, and PyTorch's caching allocator keeps the last step's peak activations
reserved. :func:`release_cached_memory` hands those cached blocks back (as verl and NeMo-RL do
before waking their engines; every trainer rank runs it before the engines start, since a TP > 1
engine's workers sit on other ranks' GPUs); :func:`explain_start_failure` turns vLLM's refusal
into one line naming the settings that decide the fit, also when a spawned engine process
failed (its parent only sees "Engine core initialization failed").
"""

from __future__ import annotations

import gc

import torch

from .vllm_start_log import described

#: what vLLM 0.24.0-0.33.0 says when the free memory is below its share at start-up
VLLM_FREE_MEMORY_MESSAGE = "is less than desired GPU memory utilization"
#: what vLLM 0.24.0-0.33.0 says when its share leaves no room, or too little, for the KV cache of one request of
#: max_model_len tokens (``v1/core/kv_cache_utils.py``, ``_check_enough_kv_cache_memory``)
VLLM_KV_CACHE_MESSAGES = ("No available memory for the cache blocks",
                          "KV cache is needed, which is larger than the available KV cache memory")
#: what the parent of a spawned engine process sees when the engine's start fails, whatever the
#: cause (vLLM 0.24 ``v1/engine/utils.py:1272``, 0.32 ``:1432``); the cause is in the engine's log
VLLM_SPAWNED_START_FAILURE = "Engine core initialization failed"


def release_cached_memory() -> int | None:
    """Collect garbage and return PyTorch's cached (unused) CUDA blocks to the driver.

    Returns the free device memory afterwards in bytes (None without CUDA). Tensors still
    referenced stay where they are: this frees the allocator's cache, not the trainer's state.
    """
    gc.collect()
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    return free


def explain_start_failure(exc: BaseException, model_dir: str, gpu_memory_utilization: float,
                          free_bytes: int | None, engine_error: BaseException | None = None) -> str:
    """The message of the ``EngineStartError`` raised when ``vllm.LLM(...)`` fails.

    For vLLM's free-memory refusal it names ``rollout.gpu_memory_utilization`` and what else
    holds memory on the GPU at that point, and so for a KV cache too small for one request (on a GPU:
    on CPU the cache is ``kv_cache_bytes``, no setting); otherwise it is vLLM's own error, prefixed. A spawned
    engine process's failure is said by its own error, ``engine_error`` (``vllm_start_log.engine_error``), when its
    log gave it; else the line says it is in the log above. The trainer's words: the eval says it in its own flags
    (``eval.engine_start``).
    """
    text = described(engine_error or exc)
    free = f"{free_bytes / 2**30:.1f} GiB free after releasing the trainer's cache" if free_bytes is not None else ""
    fit = ("Lower rollout.gpu_memory_utilization (it sizes vLLM's weights + KV cache), or free training memory "
           "(model.recompute_granularity=full, a smaller training.micro_batch_size, more model parallelism).")
    if VLLM_FREE_MEMORY_MESSAGE in text:
        return (f"rollout.gpu_memory_utilization: vLLM needs {gpu_memory_utilization:g} x the GPU's memory free "
                f"when it starts, but the trainer's model, optimizer state and EMA teacher already hold part of it"
                f"{' (' + free + ')' if free else ''}. {fit} vLLM said: {text}")
    if free_bytes is not None and any(m in text for m in VLLM_KV_CACHE_MESSAGES):   # (CPU: kv_cache_bytes)
        return (f"rollout.gpu_memory_utilization: vLLM's share, {gpu_memory_utilization:g} x the GPU's memory, "
                f"leaves too little KV cache beside its weights for one request of data.max_prompt_length + "
                f"rollout.max_tokens tokens: raise it if the training leaves room ({free}), or lower those. "
                f"vLLM said: {text}")
    if engine_error is not None:
        return f"vLLM's engine process could not start on {model_dir!r}: {text}"
    if VLLM_SPAWNED_START_FAILURE in text:
        why = (f" (on a GPU shared with training most often less free memory than rollout.gpu_memory_utilization="
               f"{gpu_memory_utilization:g} x the GPU's memory, {free}; if so, {fit[0].lower()}{fit[1:-1]})"
               if free else "")
        return (f"vLLM's engine process could not start on {model_dir!r}: its own error is in the log above"
                f"{why}. vLLM said: {text}")
    return f"vLLM could not start on {model_dir!r}: {text}"

