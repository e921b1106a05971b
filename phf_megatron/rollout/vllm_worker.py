"""Methods mixed into vLLM's GPU workers (``worker_extension_cls``) for multi-process refits.

Used only when vLLM runs its workers in other processes (GPU, tensor parallel > 1). The
driver passes CUDA IPC handles of one bucket; each worker maps them (no copy on the same
GPU, a peer read on another), runs vLLM's in-place reload, which keeps the worker's TP shard
of every tensor, then drops the mapping.

NOT VERIFIED: no GPU with vLLM was available to this project's tests (the GPU image has no
vLLM); the in-process path in ``vllm_engine.py`` is the one CI exercises.
"""

from __future__ import annotations


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


class WeightSyncWorkerExtension:
    """Extra worker methods, called through ``LLM.collective_rpc``."""

    def phf_reload_from_ipc(self, handles):
        """Load one bucket given as ``[(hf_name, (rebuild_fn, rebuild_args)), ...]``."""
        tensors = [(name, rebuild(*args)) for name, (rebuild, args) in handles]
        self.model_runner.reload_weights(weights_iterator=tensors)
        del tensors
