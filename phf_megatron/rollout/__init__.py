"""Rollout engines (vLLM, transformers fallback) with a token-id boundary and verified weight sync.

See ``engine.py`` for the interface and ``sync.py`` for the push order and staleness guarantee.
"""

from .engine import RolloutEngine, UpdateStats
from .errors import (
    EngineDiedError,
    EngineStartError,
    EngineUnusableError,
    GenerationTimeoutError,
    RolloutEngineError,
    SyncVerificationError,
    WeightMismatchError,
    WeightSyncError,
)
from .factory import BACKENDS, EngineConfig, build_engine, resolve_backend
from .sync import SyncProbe, SyncReport, hf_reference_logprobs, make_probe, probe_token_ids, sync_weights
from .types import FINISH_LENGTH, FINISH_STOP, Completion, SamplingParams
from .weights import WeightSpec, iter_buckets

__all__ = [
    "BACKENDS", "Completion", "EngineConfig", "EngineDiedError", "EngineStartError", "EngineUnusableError",
    "FINISH_LENGTH", "FINISH_STOP", "GenerationTimeoutError", "RolloutEngine", "RolloutEngineError",
    "SamplingParams", "SyncProbe", "SyncReport", "SyncVerificationError", "UpdateStats",
    "WeightMismatchError", "WeightSpec", "WeightSyncError", "build_engine", "hf_reference_logprobs",
    "iter_buckets", "make_probe", "probe_token_ids", "resolve_backend", "sync_weights",
]
