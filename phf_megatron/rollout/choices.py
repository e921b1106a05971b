"""The names a config may choose for the rollout engine (no torch import: the trainer's and the
eval tool's command lines check them before anything heavy loads)."""

#: Engine backends (``factory.build_engine``, ``rollout.backend``, the eval tool's ``--backend``): "auto"
#: (vLLM when it imports, else hf) | "vllm" (in-process vLLM) | "hf" (transformers generate, the
#: fallback) | "vllm_server" (a running vLLM server).
BACKENDS = ("auto", "vllm", "hf", "vllm_server")
#: How weights reach a vllm_server (``server_engine``): "auto" (nccl with CUDA on vLLM 0.32.x, else rpc) |
#: "rpc" | "nccl".
WEIGHT_TRANSPORTS = ("auto", "rpc", "nccl")
#: ``EngineConfig.logprobs_mode``: what ``SamplingParams.logprobs`` returns. raw: log_softmax of the
#: model's logits; processed: of the logits the token was drawn from (temperature, top-k, top-p
#: applied, the rest -inf; vLLM's ``logprobs_mode="processed_logprobs"``, what TRL's GRPO reads).
LOGPROBS_MODES = ("raw", "processed")
#: vllm_server + nccl: the default port of the weight push's rendezvous.
DEFAULT_NCCL_PORT = 29600
#: ``vllm.LLM`` keywords our engine sets itself (``vllm_engine.VLLMEngine``), by the ``EngineConfig`` field
#: they come from (None: the engine's own, for its weight sync): ``EngineConfig.vllm_kwargs`` and
#: ``rollout.vllm_kwargs`` refuse them, since a value there would silently replace the setting's.
ENGINE_SET_VLLM_KWARGS = {
    "model": "model_dir", "dtype": "dtype", "seed": "seed", "max_model_len": "max_model_len",
    "tensor_parallel_size": "tensor_parallel_size", "gpu_memory_utilization": "gpu_memory_utilization",
    "enable_sleep_mode": "enable_sleep_mode", "enforce_eager": "enforce_eager", "logprobs_mode": "logprobs_mode",
    "distributed_executor_backend": None, "worker_extension_cls": None,
}
