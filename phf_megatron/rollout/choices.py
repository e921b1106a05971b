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


def vllm_kwargs_problem(vllm_kwargs, backend: str, settings: dict, by: str, backend_flag: str) -> str | None:
    """What is wrong with ``vllm_kwargs`` (extra ``vllm.LLM`` keywords), None when nothing: not a mapping of names, a
    keyword the engine sets (``ENGINE_SET_VLLM_KWARGS``: named with the setting that gives it, ``settings[key]``, or
    the engine's own), or a ``backend`` that starts no vLLM engine. ``by`` starts the engine (``"the trainer"``) and
    ``backend_flag`` chooses its backend; the callers (``RolloutConfig``, ``EngineConfig``, the eval's
    ``--engine_kwargs``) prefix the flag of the keywords."""
    if not isinstance(vllm_kwargs, dict) or not all(isinstance(k, str) for k in vllm_kwargs):
        return f"expected a mapping of vllm.LLM keywords like {{max_num_seqs: 64}}, got {vllm_kwargs!r}"
    for key in vllm_kwargs:
        if key in ENGINE_SET_VLLM_KWARGS:
            owner = settings.get(key)
            return (f"{key} is set by {by} from {owner}: use that setting instead" if owner else
                    f"{key} is set by the rollout engine itself (its weight sync needs it): leave it out")
    if vllm_kwargs and backend in ("hf", "vllm_server"):
        return (f"only applies to a vLLM engine {by} starts ({backend_flag}=vllm or auto), not to "
                f"{backend_flag}={backend}" + (" (give them to the server's own command line)"
                                               if backend == "vllm_server" else ""))
    return None
