"""Why a rollout engine did not start, as the user meets it (``rollouts.RolloutDriver``, every rank together).

* a setting vLLM refused: a ``--rollout.vllm_kwargs`` keyword it does not take or a value its checks reject,
  or a setting's own error (``rollout.gpu_memory_utilization`` above the free memory, ``gpu_memory.
  explain_start_failure``; ``rollout.tensor_parallel_size`` on CPU): one line naming the flag, exit code 2
  (``ConfigError``, said by rank 0);
* the engine's own failure (its process died, no memory, a server that does not answer, a timeout): one line,
  ``error: rollout engine E (host rank R): failed to start: ...; <what is kept>; ...``, exit code 1
  (``RunStopped``); a spawned vLLM process's own error is in the log above it, and the line says so;
* any other error (a bug of ours or of vLLM's: a ``TypeError``, an ``AttributeError`` ...) keeps its traceback.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ConfigError, RunStopped, UserError, as_config_error, missing_dependency
from ..input_files import kept
from ..rollout.errors import RolloutEngineError
from ..rollout.gpu_memory import VLLM_KV_CACHE_MESSAGES
from .distributed import _chain   # ``err`` and what it was raised from or during, outermost first

#: vLLM's own ``TypeError`` for a keyword ``vllm.LLM`` does not take (0.24-0.33: ``EngineArgs.__init__()``).
_UNKNOWN_KEYWORD = re.compile(r"unexpected keyword argument '(\w+)'")
#: an error the engine raised that says a bug, not the machine: its traceback stays.
_BUGS = (TypeError, AttributeError, NameError, LookupError, AssertionError, NotImplementedError, ImportError)


@dataclass(frozen=True)
class StartFailure:
    """A host's failed engine start, as every rank learns it (picklable)."""

    text: str
    """one line: what failed (a setting's error: what is wrong with it)."""
    key: str | None = None
    """the setting to change (``rollout.vllm_kwargs``), or None."""
    kind: str = "engine"
    """setting (``key``) | user (another error the user fixes: a file, a dependency) | engine (the engine's own
    failure) | bug (neither: the host keeps the traceback)."""


def one_line(text: str) -> str:
    """``text``'s lines joined by spaces (vLLM's and pydantic's messages run over several)."""
    return " ".join(line.strip() for line in str(text).splitlines() if line.strip())


def _refused_keyword(err: BaseException, vllm_kwargs: dict) -> str | None:
    """What vLLM said of a ``vllm_kwargs`` keyword when ``err`` names one: an unknown keyword, a pydantic
    ``ValidationError`` at the keyword's field, or a message naming it; None otherwise."""
    chain = list(_chain(err))
    for cause in chain:
        unknown = _UNKNOWN_KEYWORD.search(str(cause)) if isinstance(cause, TypeError) else None
        if unknown and unknown.group(1) in vllm_kwargs:
            return f"{unknown.group(1)}: not a keyword of vllm.LLM"
        errors = cause.errors() if type(cause).__name__ == "ValidationError" and hasattr(cause, "errors") else []
        for e in errors:   # [{"loc": ("max_num_seqs",), "msg": "Input should be greater than or equal to 1", ...}]
            loc, msg = [str(part) for part in e.get("loc", ())], one_line(e.get("msg", ""))
            key = next((k for k in vllm_kwargs if k in loc or re.search(rf"\b{re.escape(k)}\b", msg)), None)
            if key is not None:
                return f"{key}: {vllm_kwargs[key]!r}: vLLM refused it: {msg}"
    root = chain[-1]   # vLLM's own error, not our wrapping of it
    if "kv_cache_memory_bytes" in vllm_kwargs and any(m in str(root) for m in VLLM_KV_CACHE_MESSAGES):
        return f"kv_cache_memory_bytes: {vllm_kwargs['kv_cache_memory_bytes']!r}: vLLM refused it: {one_line(root)}"
    key = next((k for k in vllm_kwargs if re.search(rf"\b{re.escape(k)}\b", str(root))), None)
    if key is not None:
        return f"{key}: {vllm_kwargs[key]!r}: vLLM refused it: {type(root).__name__}: {one_line(root)}"
    return None


def classify(err: Exception, vllm_kwargs: dict, rollout_fields) -> StartFailure:
    """A host's ``build_engine`` error as a ``StartFailure`` (``rollout_fields``: the ``rollout`` section's)."""
    said = _refused_keyword(err, vllm_kwargs or {})
    if said is not None:
        return StartFailure(said, key="rollout.vllm_kwargs", kind="setting")
    if isinstance(err, UserError) and not isinstance(err, ConfigError):
        return StartFailure(err.line, kind="user")
    setting = as_config_error(err, rollout_fields, "rollout") or as_config_error(
        err, {f"rollout.{f}" for f in rollout_fields})   # "tensor_parallel_size: ...", "rollout.gpu_memory_...: ..."
    if setting is not None:
        return StartFailure(one_line(setting.detail), key=setting.key, kind="setting")
    missing = next((m for c in _chain(err) if (m := missing_dependency(c)) is not None), None)
    if missing is not None:
        return StartFailure(missing.line, kind="user")
    if isinstance(err, RolloutEngineError) and not isinstance(err.__cause__, _BUGS):
        return StartFailure(one_line(err))
    return StartFailure(f"({type(err).__name__}) {one_line(err)}", kind="bug")


def start_failed(failures: list[tuple[str, StartFailure]], save_dir: str) -> Exception | None:
    """What every rank raises when engines failed to start (``failures``: each host's engine name and failure):
    a setting's ``ConfigError``, a missing dependency's one line (``UserError``), the engines' own failures'
    ``RunStopped``; None when one is a bug (the caller raises its ``RolloutFailure``, the host's cause chained)."""
    kinds = {f.kind: f for _, f in reversed(failures)}   # each kind's first failure
    if not failures or "bug" in kinds:
        return None
    if "setting" in kinds:
        return ConfigError(kinds["setting"].key, kinds["setting"].text)
    if "user" in kinds:
        return UserError(kinds["user"].text)
    said = "; ".join(f"{name}: failed to start: {f.text}" for name, f in failures)
    return RunStopped(f"{said}; {kept(save_dir)}; rerun the same command to resume")
