"""Rollout engines (vLLM, transformers fallback) with a token-id boundary and verified weight sync.

See ``engine.py`` for the interface and ``sync.py`` for the push order and staleness guarantee.
Submodules load on first use (``lazy_exports``): ``rollout.choices`` imports without torch.
"""

from ..lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "choices": ("BACKENDS", "WEIGHT_TRANSPORTS"),
    "engine": ("RolloutEngine", "UpdateStats"),
    "errors": ("EngineDiedError", "EngineStartError", "EngineUnusableError", "GenerationTimeoutError",
               "RolloutEngineError", "SyncVerificationError", "WeightMismatchError", "WeightSyncError"),
    "factory": ("EngineConfig", "build_engine", "resolve_backend"),
    "sync": ("SyncProbe", "SyncReport", "hf_reference_logprobs", "make_probe", "probe_token_ids", "sync_weights"),
    "types": ("FINISH_LENGTH", "FINISH_STOP", "Completion", "SamplingParams"),
    "weights": ("WeightSpec", "iter_buckets"),
})
