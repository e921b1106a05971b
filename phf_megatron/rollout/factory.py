"""Build a rollout engine from one config: vLLM when it imports, else transformers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .choices import (
    BACKENDS, DEFAULT_NCCL_PORT, ENGINE_SET_VLLM_KWARGS, LOGPROBS_MODES, WEIGHT_TRANSPORTS, vllm_kwargs_problem,
)

if TYPE_CHECKING:   # torch: the eval's settings check an EngineConfig before any path or model (~1 s)
    from .engine import RolloutEngine

#: vllm_server: the bound on one HTTP request and on the wait for the server when timeout_s is None.
DEFAULT_SERVER_TIMEOUT_S = 600.0
#: The ``EngineConfig`` field each ``vllm.LLM`` keyword that ``build_engine`` sets comes from (the engine's own: absent).
VLLM_KWARG_FIELDS = {key: f"EngineConfig.{name}" for key, name in ENGINE_SET_VLLM_KWARGS.items() if name}


@dataclass
class EngineConfig:
    """Everything a rollout engine needs to start."""

    model_dir: str
    """HF model directory (config.json, *.safetensors, tokenizer files)."""
    backend: str = "auto"
    """auto (vLLM if installed, else hf) | vllm | hf (transformers generate fallback) | vllm_server
    (a running vLLM server at ``server_url``; ``model_dir`` names its weights)."""
    dtype: str = "bfloat16"
    """float32 | bfloat16 | float16 (tests use float32 to compare logprobs at 1e-4)."""
    seed: int = 0
    """engine-level seed (requests with SamplingParams.seed are reproducible regardless)."""
    max_model_len: int | None = None
    """prompt + completion tokens; None = the model's max_position_embeddings."""
    bucket_bytes: int = 1 << 30
    """weight-sync bucket size (bytes per push)."""
    timeout_s: float | None = None
    """generate/score timeout; on expiry GenerationTimeoutError and the engine is unusable."""
    tensor_parallel_size: int = 1
    """vLLM tensor parallelism (GPU)."""
    gpu_memory_utilization: float = 0.5
    """vLLM's GPU memory fraction (weights + KV cache); colocated runs leave room for training."""
    kv_cache_bytes: int | None = None
    """vLLM-CPU KV cache size (default 256 MiB)."""
    enable_sleep_mode: bool = False
    """vLLM sleep/wake on GPU (colocated mode: vLLM sleeps while the trainer steps)."""
    enforce_eager: bool | None = None
    """vLLM eager mode (no torch.compile, no CUDA graphs: starts in seconds, decodes slower);
    None: eager on CPU, compiled with CUDA graphs on GPU (vLLM's default)."""
    max_batch_size: int = 64
    """transformers fallback: rows decoded together."""
    device: str | None = None
    """transformers fallback: device (None = cuda if available else cpu)."""
    server_url: str | None = None
    """vllm_server: the server's base URL (http://host:port)."""
    server_weight_transport: str = "auto"
    """vllm_server: how weights reach the server: auto (nccl with CUDA on vLLM 0.32.x, else rpc) | rpc | nccl
    (see ``server_engine.py``)."""
    server_nccl_address: str | None = None
    """vllm_server + nccl: an address of this host the server's workers can reach (NCCL rank 0)."""
    server_nccl_port: int = DEFAULT_NCCL_PORT
    """vllm_server + nccl: the port of that rendezvous."""
    separate_process: bool = False
    """vLLM: run the engine core in a spawned process even in a world of one (it is spawned anyway
    inside a multi-rank process group or with TP > 1); the overlapped mode decodes there."""
    logprobs_mode: str = "raw"
    """What a request's ``logprobs`` returns: raw | processed (after temperature, top-k, top-p: vLLM's
    ``processed_logprobs``; GRPO's importance-sampling correction). Scoring (``score``) stays raw.
    vllm_server: the server's own flag, ``--logprobs-mode processed_logprobs``
    (``server_process.server_command(logprobs_mode=...)``); the client cannot change it."""
    vllm_kwargs: dict = field(default_factory=dict)
    """extra keyword arguments for ``vllm.LLM`` (backend vllm; auto when vLLM imports), none that a field
    above sets (``choices.ENGINE_SET_VLLM_KWARGS``)."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend: {self.backend!r} is not one of {BACKENDS}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype: {self.dtype!r} is not one of float32, bfloat16, float16")
        if self.bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes: must be > 0, got {self.bucket_bytes}")
        if self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size: must be >= 1, got {self.tensor_parallel_size}")
        if self.backend == "vllm_server" and not self.server_url:
            raise ValueError("server_url: required with backend='vllm_server'")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode: {self.logprobs_mode!r} is not one of {LOGPROBS_MODES}")
        if self.server_weight_transport not in WEIGHT_TRANSPORTS:
            raise ValueError(f"server_weight_transport: {self.server_weight_transport!r} is not one of {WEIGHT_TRANSPORTS}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization: must lie in (0, 1], got {self.gpu_memory_utilization}")
        # a mapping of vllm.LLM keywords, none that the engine sets, only for vLLM (auto: build_engine, once resolved)
        problem = vllm_kwargs_problem(self.vllm_kwargs, self.backend, VLLM_KWARG_FIELDS, by="build_engine",
                                      backend_flag="backend")
        if problem is not None:
            raise ValueError(f"vllm_kwargs: {problem}")


def resolve_backend(backend: str) -> str:
    """``auto`` → ``vllm`` when vLLM imports, else ``hf``."""
    from .vllm_engine import vllm_available
    if backend == "auto":
        return "vllm" if vllm_available() else "hf"
    return backend


def vllm_kwargs_dropped(vllm_kwargs, backend: str, backend_flag: str) -> str | None:
    """What to say of ``vllm_kwargs`` given with ``backend`` auto where vLLM does not import (auto runs transformers,
    which would drop them in silence), naming ``backend_flag``; None otherwise. Said by the trainer
    (``RolloutConfig.check_vllm_installed``), the eval (``run_eval``, before any work) and ``build_engine``."""
    if vllm_kwargs and backend == "auto" and resolve_backend(backend) == "hf":
        return (f"only for a vLLM engine, and {backend_flag}=auto runs transformers here (vLLM does not import): "
                "install vLLM or leave them out")
    return None


def build_engine(config: EngineConfig) -> RolloutEngine:
    """Start the configured backend (raises EngineStartError if it cannot)."""
    dropped = vllm_kwargs_dropped(config.vllm_kwargs, config.backend, "backend")
    if dropped is not None:
        raise ValueError(f"vllm_kwargs: {dropped}")
    backend = resolve_backend(config.backend)
    if backend == "vllm_server":
        from .server_engine import VLLMServerEngine
        # every HTTP request and the wait for the server are bounded, even without an engine timeout
        bound = config.timeout_s or DEFAULT_SERVER_TIMEOUT_S
        return VLLMServerEngine(config.server_url, model_dir=config.model_dir,
                                weight_transport=config.server_weight_transport,
                                nccl_address=config.server_nccl_address, nccl_port=config.server_nccl_port,
                                request_timeout_s=bound, start_timeout_s=bound, bucket_bytes=config.bucket_bytes,
                                timeout_s=config.timeout_s)
    if backend == "vllm":
        from .vllm_engine import VLLMEngine
        return VLLMEngine(config.model_dir, dtype=config.dtype, seed=config.seed,
                          max_model_len=config.max_model_len, tensor_parallel_size=config.tensor_parallel_size,
                          gpu_memory_utilization=config.gpu_memory_utilization,
                          kv_cache_bytes=config.kv_cache_bytes, enable_sleep_mode=config.enable_sleep_mode,
                          bucket_bytes=config.bucket_bytes, timeout_s=config.timeout_s,
                          separate_process=config.separate_process,
                          **{"enforce_eager": config.enforce_eager, **config.vllm_kwargs,
                             **({"logprobs_mode": "processed_logprobs"} if config.logprobs_mode == "processed" else {})})
    from .hf_engine import HFEngine
    return HFEngine(config.model_dir, dtype=config.dtype, device=config.device,
                    max_batch_size=config.max_batch_size, bucket_bytes=config.bucket_bytes,
                    timeout_s=config.timeout_s, max_model_len=config.max_model_len,
                    logprobs_mode=config.logprobs_mode)
