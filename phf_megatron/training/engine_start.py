"""Why a rollout engine did not start, as the user meets it (``rollouts.RolloutDriver``, every rank together).

* a setting vLLM refused: a ``--rollout.vllm_kwargs`` keyword it does not take or a value its checks reject,
  or a setting's own error (``rollout.gpu_memory_utilization`` above the free memory, ``gpu_memory.
  explain_start_failure``; ``rollout.tensor_parallel_size`` on CPU): one line naming the flag, exit code 2
  (``ConfigError``, said by rank 0);
* the engine's own failure (its process died, no memory, a server that does not answer, a timeout): one line,
  ``error: rollout engine E (host rank R): failed to start: ...; <what is kept>; ...``, exit code 1
  (``RunStopped``); a spawned vLLM process's own error, which its parent does not see, is read from its log
  (``rollout.vllm_start_log``): the line says it, and a setting it names is told as above;
* any other error (a bug of ours or of vLLM's: a ``TypeError``, an ``AttributeError`` ...) keeps its traceback.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError, RunStopped, UserError, as_config_error, error_chain, missing_dependency
from ..input_files import kept
from ..rollout.errors import RolloutEngineError, one_line
from ..rollout.start_errors import engine_bug, refused_keyword



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


def classify(err: Exception, vllm_kwargs: dict, rollout_fields) -> StartFailure:
    """A host's ``build_engine`` error as a ``StartFailure`` (``rollout_fields``: the ``rollout`` section's)."""
    said = refused_keyword(err, vllm_kwargs or {})
    if said is not None:
        return StartFailure(said, key="rollout.vllm_kwargs", kind="setting")
    if isinstance(err, UserError) and not isinstance(err, ConfigError):
        return StartFailure(err.line, kind="user")
    setting = as_config_error(err, rollout_fields, "rollout") or as_config_error(
        err, {f"rollout.{f}" for f in rollout_fields})   # "tensor_parallel_size: ...", "rollout.gpu_memory_...: ..."
    if setting is not None:
        return StartFailure(one_line(setting.detail), key=setting.key, kind="setting")
    missing = next((m for c in error_chain(err) if (m := missing_dependency(c)) is not None), None)
    if missing is not None:
        return StartFailure(missing.line, kind="user")
    if isinstance(err, RolloutEngineError) and not engine_bug(err):
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
