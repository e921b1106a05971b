"""The rollout engine's error types: what a trainer catches, and what it should do then.

    RolloutEngineError                  base; the trainer saves a checkpoint and exits on it
    ├── EngineStartError                the engine could not start (bad model dir, no memory, ...)
    │   └── VLLMStartError              ``vllm.LLM(...)`` failed (its error: the cause)
    ├── EngineProcessError              a spawned engine process's own error, of a type not built in, as it logged
    │                                   it (the cause of vLLM's "Engine core initialization failed")
    ├── GenerationTimeoutError          a generate() call ran past its timeout (engine now unusable)
    ├── EngineUnusableError             a call after a timeout, a failed sync or close()
    ├── EngineDiedError                 the engine's process exited (killed, crashed): unusable
    └── WeightSyncError                 a weight sync failed
        ├── WeightMismatchError         a pushed tensor's name or shape is unknown to the engine
        │                               (also a ValueError: it is bad input, named)
        └── SyncVerificationError       the probe's logprobs after the sync differ from the
                                        trainer's (``no_effect`` = the sync changed nothing)

``one_line``: an error's text as the one line a user sees of it (the engine start's lines are built with it).
"""

from __future__ import annotations


def one_line(text) -> str:
    """``text``'s lines joined by spaces (vLLM's and pydantic's messages run over several)."""
    return " ".join(line.strip() for line in str(text).splitlines() if line.strip())


class RolloutEngineError(RuntimeError):
    """Base class: any failure of the rollout engine the trainer should treat as fatal."""


class EngineStartError(RolloutEngineError):
    """The engine failed to start; the message names the backend and the model directory."""


class VLLMStartError(EngineStartError):
    """``vllm.LLM(...)`` raised (its error is the cause); the message is the trainer's (``gpu_memory.
    explain_start_failure``). ``free_bytes`` (the device memory free when it started, None off a GPU) and ``process``
    (its spawned engine process that died, described; "" when none) let a caller say it in its own flags (the
    eval: ``eval.engine_start``), and so does ``engine_error``: a spawned engine process's own error, as its log
    said it (``vllm_start_log.engine_error``; None: none logged), ``process`` then naming that log too, which
    ``log_dir`` keeps (None: none kept; a caller whose line does not name it drops it: ``vllm_start_log.
    drop_unsaid_logs``)."""

    def __init__(self, message: str, *, free_bytes: int | None = None, process: str = "",
                 engine_error: BaseException | None = None, log_dir: str | None = None):
        super().__init__(message)
        self.free_bytes = free_bytes
        self.process = process
        self.engine_error = engine_error
        self.log_dir = log_dir


class EngineProcessError(RolloutEngineError):
    """A spawned engine process's own error as it logged it (``vllm_start_log.engine_error``): ``Type: message``."""


class GenerationTimeoutError(RolloutEngineError):
    """generate(), score() or a weight update's load did not return within its timeout. The engine is
    marked unusable."""


class EngineUnusableError(RolloutEngineError):
    """The engine was closed, or a previous timeout / failed sync left it in an unknown state."""


class EngineDiedError(RolloutEngineError):
    """The engine's own process exited while the trainer needed it; the message gives its exit code."""


class WeightSyncError(RolloutEngineError):
    """A weight sync failed. Tensors pushed before the failure may already be live."""


class WeightMismatchError(WeightSyncError, ValueError):
    """A pushed tensor's name is unknown, its shape differs from the engine's, or a fused group
    (q/k/v, gate/up) was pushed incompletely. ``tensor_name`` names the culprit."""

    def __init__(self, tensor_name: str, message: str):
        super().__init__(f"{tensor_name}: {message}")
        self.tensor_name = tensor_name


class SyncVerificationError(WeightSyncError):
    """After a sync the engine's probe logprobs differ from the trainer's by more than ``atol``.

    ``no_effect`` is True when the engine's probe logprobs did not change at all across the
    sync: the classic silent failure (weights pushed to a copy, a no-op loader, a stale cache).
    """

    def __init__(self, message: str, *, max_abs_diff: float, no_effect: bool):
        super().__init__(message)
        self.max_abs_diff = max_abs_diff
        self.no_effect = no_effect
