"""The run config's ``rollout`` section (``--rollout.*``): the engines that sample the student's
completions, how they are reached and synced, and the sampling parameters. ``training.config``
nests it with the other sections; every ``__post_init__`` error names the flag that changes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..config_errors import check_choice, check_positive, fail
from . import choices as rollout_choices


#: The setting (its flag) each ``vllm.LLM`` keyword the trainer sets comes from (``training/rollouts.py``
#: ``_engine_config``); the engine's own (``rollout.choices.ENGINE_SET_VLLM_KWARGS``: None) are absent.
VLLM_KWARG_SETTINGS = {
    "model": "--model.hf_dir", "dtype": "--model.dtype", "seed": "--training.seed",
    "max_model_len": "--data.max_prompt_length + --rollout.max_tokens", "tensor_parallel_size":
    "--rollout.tensor_parallel_size", "gpu_memory_utilization": "--rollout.gpu_memory_utilization",
    "enable_sleep_mode": "--rollout.enable_sleep_mode", "enforce_eager": "--rollout.enforce_eager",
    "logprobs_mode": "--grpo.vllm_importance_sampling_correction",
}


@dataclass
class RolloutConfig:
    """On-policy sampling of the student's completions y."""

    backend: str = "auto"
    """auto (vLLM when installed, else hf) | vllm (official, paper) | hf (transformers generate: slow,
    for CPU tests and debugging) | vllm_server (a separate vLLM server at server_url)."""
    server_url: str | None = None
    """Base URL of the rollout server for backend vllm_server (disaggregated set-ups; the server
    runs with VLLM_SERVER_DEV_MODE=1, see rollout/server_process.server_command)."""
    server_weight_transport: str = "auto"
    """How weights reach a vllm_server: auto (nccl when the trainer has CUDA and vLLM is 0.32.x, whose
    NCCL weight-transfer API the push speaks; else rpc) | nccl
    (vLLM's NCCL weight transfer; server started with --weight-transfer-config '{"backend": "nccl"}')
    | rpc (bytes through the server's /collective_rpc into our worker extension; CPU, small models)."""
    server_nccl_address: str | None = None
    """An address of the trainer's rank-0 host that the server's workers can reach: the NCCL
    weight push's rendezvous (required with server_weight_transport=nccl)."""
    server_nccl_port: int = rollout_choices.DEFAULT_NCCL_PORT
    """Port of that rendezvous (free on the trainer's rank-0 host)."""
    n: int = 1
    """Completions per prompt (official num_generations = 1)."""
    max_tokens: int = 1024
    """Rollout length (paper: 1024)."""
    temperature: float = 1.1
    """Sampling temperature (paper: 1.1)."""
    top_p: float = 0.95
    """Nucleus threshold (paper: 0.95)."""
    top_k: int = 20
    """Top-k (paper: 20); 0 or -1 disables it."""
    gpu_memory_utilization: float = 0.6
    """Fraction of GPU memory vLLM may take (official: 0.6 on 143 GB H20s)."""
    colocate: bool = True
    """The engines run on the trainer's own GPUs, in or beside its processes (official vllm_mode
    colocate): the only placement of the vllm and hf backends, so a run refuses false with them. An engine
    on GPUs of its own is a separate server: backend vllm_server (there this setting is not read)."""
    enable_sleep_mode: bool = False
    """Free vLLM's weights and KV cache while training (official default off)."""
    enforce_eager: bool | None = None
    """vLLM without torch.compile and CUDA graphs: the engine starts in seconds instead of
    compiling and capturing graphs first, and decodes slower. None: eager on CPU, graphs on GPU."""
    tensor_parallel_size: int = 1
    """vLLM tensor parallel size (official: 1)."""
    vllm_kwargs: dict = field(default_factory=dict)
    """Extra keyword arguments for ``vllm.LLM`` (backends vllm and auto), a YAML mapping: e.g.
    '{attention_backend: TRITON_ATTN}' if FlashAttention fails on the GPU, '{max_num_seqs: 64}'. A keyword
    that a setting already gives (dtype: model.dtype, seed, max_model_len, tensor_parallel_size, ...) is
    refused, naming that setting. An engine option: a resumed run may change it."""
    sync_interval: int = 1
    """Push the student's weights to the engine every this many steps (official vllm_sync_frequency 1).
    Checkpoints (checkpoint.save_interval, a multiple of it) and a SIGTERM stop fall after a push, so a
    resumed run's engine holds the weights the uninterrupted run's would."""
    verify_sync: bool = True
    """After a weight push, check the engine's weights against the trainer's."""
    timeout_s: float = 600.0
    """Give up on one generate call (or engine start) after this many seconds."""
    fingerprint_projections: int = 2
    """With verify_sync: random projections per pushed tensor compared between trainer and engine
    (rollout/fingerprint.py; exact, catches a sync that loaded nothing); 0 disables them."""
    probe_atol: float | None = None
    """With verify_sync: max |engine - trainer| logprob on the probe sequence (a coarse end-to-end
    check; the fingerprints are the exact one). None: by dtype and the probe's logprob spread
    (rollout/sync.py probe_tolerance): float32 1e-4; bfloat16 max(0.1, 2 x 2^-7 x max |log p|),
    float16 max(0.05, 2 x 2^-10 x max |log p|)."""
    num_engines: int | str = 1
    """Rollout engines: the data-parallel replicas split into this many groups of consecutive ranks,
    each sampling its own ranks' prompts with an engine on its first rank (rollout/groups.py); auto:
    one per node. 1 (paper: one vLLM engine)."""
    async_steps: int = 0
    """1: the engines sample step k+1's prompts while the trainer runs step k (one-step off-policy,
    staleness 1, logged as rollout_staleness; training/rollout_async.py); it saves time only when the
    engines have GPUs or cores of their own (benchmarks/rollout_overlap.md). 0 (paper: on-policy)."""
    lmbda: float = 1.0
    """GKD's on-policy fraction: each micro-batch trains on rollouts with probability lmbda, else on
    the rows' solutions as completions (TRL GOLD training_step; training.policy_mix). 1 (paper,
    official scripts' --lmbda 1; the official OPSD trainer ignores the flag and always samples)."""

    def check_placement(self) -> None:
        """``colocate`` false with an engine that can only run on the trainer's GPUs: refused when a run starts
        (``TrainConfig.require_inputs``), not when a config loads: a run saved with it (it was accepted and
        ignored) still converts and evaluates."""
        if not self.colocate and self.backend != "vllm_server":
            raise fail("rollout.colocate", f"false is not supported with rollout.backend={self.backend}: its engines "
                       "run on the trainer's GPUs; for an engine elsewhere start a vLLM server and use "
                       "--rollout.backend=vllm_server --rollout.server_url=...")

    def check_vllm_installed(self) -> None:
        """``vllm_kwargs`` with backend auto where vLLM does not import (auto runs transformers): refused when a run
        starts (``TrainConfig.require_inputs``), before the student is built, not when a config loads."""
        if not (self.vllm_kwargs and self.backend == "auto"):
            return   # nothing to check: no torch import (factory's) before the trainer's quiet start
        from .factory import vllm_kwargs_dropped
        dropped = vllm_kwargs_dropped(self.vllm_kwargs, self.backend, "rollout.backend")
        if dropped is not None:
            raise fail("rollout.vllm_kwargs", dropped)

    def __post_init__(self) -> None:
        check_choice("rollout.backend", self.backend, rollout_choices.BACKENDS)
        check_positive("rollout.fingerprint_projections", self.fingerprint_projections, allow_zero=True)
        if self.probe_atol is not None:
            check_positive("rollout.probe_atol", self.probe_atol)
        if not 0.0 <= self.lmbda <= 1.0:
            raise fail("rollout.lmbda", f"must lie in [0, 1], got {self.lmbda}")
        if self.backend == "vllm_server" and not self.server_url:
            raise fail("rollout.server_url", "is required with rollout.backend=vllm_server")
        check_choice("rollout.server_weight_transport", self.server_weight_transport, rollout_choices.WEIGHT_TRANSPORTS)
        if self.backend == "vllm_server" and self.server_weight_transport == "nccl" and not self.server_nccl_address:
            raise fail("rollout.server_nccl_address", "is required with rollout.server_weight_transport=nccl (an "
                       "address of the trainer's rank-0 host that the server's workers can reach)")
        if not 0 < self.server_nccl_port < 65536:
            raise fail("rollout.server_nccl_port", f"must lie in 1..65535, got {self.server_nccl_port}")
        for name in ("n", "max_tokens", "tensor_parallel_size", "sync_interval"):
            check_positive(f"rollout.{name}", getattr(self, name))
        check_positive("rollout.temperature", self.temperature)
        check_positive("rollout.timeout_s", self.timeout_s)
        if not 0.0 < self.top_p <= 1.0:
            raise fail("rollout.top_p", f"must lie in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise fail("rollout.top_k", f"must be >= 1, or 0 / -1 to disable it, got {self.top_k}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise fail("rollout.gpu_memory_utilization", f"must lie in (0, 1], got {self.gpu_memory_utilization}")
        self._check_engines()
        self._check_vllm_kwargs()

    def _check_vllm_kwargs(self) -> None:
        """``vllm_kwargs``: a mapping of ``vllm.LLM`` keywords, none that a setting already gives, only for vLLM."""
        problem = rollout_choices.vllm_kwargs_problem(self.vllm_kwargs, self.backend, VLLM_KWARG_SETTINGS,
                                                      by="the trainer", backend_flag="rollout.backend")
        if problem is not None:
            raise fail("rollout.vllm_kwargs", problem)

    def _check_engines(self) -> None:
        """``num_engines`` and ``async_steps`` (the layout itself is checked at start: rollout/groups.py)."""
        if isinstance(self.num_engines, str) and self.num_engines != "auto":
            raise fail("rollout.num_engines", f"must be a positive count or 'auto', got {self.num_engines!r}")
        if isinstance(self.num_engines, int) and self.num_engines < 1:
            raise fail("rollout.num_engines", f"must be a positive count or 'auto', got {self.num_engines}")
        if self.backend == "vllm_server" and self.num_engines != 1:
            raise fail("rollout.num_engines", "rollout.backend=vllm_server samples from one server; use num_engines=1")
        check_choice("rollout.async_steps", self.async_steps, (0, 1))
        if self.async_steps and self.enable_sleep_mode:
            raise fail("rollout.async_steps", "1 samples while the trainer steps, so the engine must stay awake on "
                       "GPUs or CPU time of its own; turn off rollout.enable_sleep_mode")
        if self.async_steps and self.sync_interval != 1:
            raise fail("rollout.async_steps", f"1 needs rollout.sync_interval=1 (with {self.sync_interval} the "
                       f"rollouts would lag {self.sync_interval} steps behind the trainer, not 1)")
