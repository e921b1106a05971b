"""GPU memory around a colocated rollout engine: release the trainer's cache, explain a refusal.

vLLM sizes its share of the GPU (weights + KV cache) as ``gpu_memory_utilization x total``
and, at start-up, refuses to start when less than that is free (``vllm/v1/worker/utils.py``,
``request_memory``: "Free memory on device ... is less than desired GPU memory utilization",
0.24.0 to 0.33.0). In a colocated run the student, its optimizer state and the EMA copy are
already on the GPU, and PyTorch's caching allocator keeps the last step's peak activations
reserved. :func:`release_cached_memory` hands those cached blocks back (as verl and NeMo-RL do
before waking their engines); :func:`explain_start_failure` turns vLLM's refusal into one line
naming the settings that decide the fit.
"""

from __future__ import annotations

import gc

import torch

#: what vLLM 0.24.0-0.33.0 says when the free memory is below its share at start-up
VLLM_FREE_MEMORY_MESSAGE = "is less than desired GPU memory utilization"


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
                          free_bytes: int | None) -> str:
    """The message of the ``EngineStartError`` raised when ``vllm.LLM(...)`` fails.

    For vLLM's free-memory refusal it names ``rollout.gpu_memory_utilization`` and what else
    holds memory on the GPU at that point; otherwise it is vLLM's own error, prefixed.
    """
    text = f"{type(exc).__name__}: {exc}"
    if VLLM_FREE_MEMORY_MESSAGE not in str(exc):
        return f"vLLM could not start on {model_dir!r}: {text}"
    free = f"{free_bytes / 2**30:.1f} GiB free after releasing the trainer's cache" if free_bytes is not None else ""
    return (f"rollout.gpu_memory_utilization: vLLM needs {gpu_memory_utilization:g} x the GPU's memory free when it "
            f"starts, but the trainer's model, optimizer state and EMA teacher already hold part of it"
            f"{' (' + free + ')' if free else ''}. Lower rollout.gpu_memory_utilization (it sizes vLLM's weights + "
            f"KV cache), or free training memory (model.recompute_granularity=full, a smaller "
            f"training.micro_batch_size, more model parallelism). vLLM said: {text}")
