"""A spawned vLLM engine process's own start-up error, caught in a file so the parent's one line can say it.

When the engine core runs in a process of its own and fails to start, vLLM's parent only raises
``RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): ...``
(0.24-0.33): the cause is what the child logged (``run_engine_core``: ``logger.exception("EngineCore failed to
start.")``; a worker process's "WorkerProc failed to start." likewise) to a console the trainer keeps quiet by
default. :func:`start_log_environ` starts the engine with vLLM's own logging configuration
(``VLLM_LOGGING_CONFIG_PATH``: its default, read in this process, plus a file handler for its errors), so every
error the engine's processes log lands in ``engine_errors.log`` of a fresh directory, each exception followed by
one line of our own (``EngineErrorFormatter``); :func:`engine_error` reads back the first a process logged as its
failed start (an earlier error logged and gone past, vLLM's "Error saving model info cache.", is not the cause), else
the first of them. A user's own
``VLLM_LOGGING_CONFIG_PATH`` or ``VLLM_CONFIGURE_LOGGING=0`` is kept: the cause is then not caught (the line
says "in the log above", as before).

A quiet run (``startup.started_quiet``: no ``--logging.verbose`` / ``--verbose``) prints that line alone: an engine
process that logs its failed start (``FailedStartFilter``) prints nothing more on the console (vLLM's ERROR records
go to stdout), and its stderr (multiprocessing's copy of the traceback as the process ends) goes to the log file.
"""

from __future__ import annotations

import builtins
import copy
import json
import logging
import os
import shutil
import sys
import tempfile

from ..errors import error_chain
from .errors import EngineProcessError, VLLMStartError, one_line

#: the log file's name in the directory ``start_log_environ`` was given
LOG_NAME = "engine_errors.log"
#: what starts our one-line summary of a logged exception in that file, and of one logged as a failed start
_MARK = "phf-engine-error: "
_FAILED_START_MARK = "phf-engine-failed-start: "
#: how an engine process's log of its own failed start ends (0.24-0.33: ``run_engine_core``'s "EngineCore failed to
#: start.", ``WorkerProc.worker_main``'s "WorkerProc failed to start."); the process then ends
_FAILED_START = "failed to start."


class EngineErrorFormatter(logging.Formatter):
    """vLLM's record as ``logging`` formats it, and after a logged exception one line: ``<mark><Type>: <message>``,
    the mark ``_FAILED_START_MARK`` when the record says a failed start (imported by vLLM's ``dictConfig`` in the
    engine's processes)."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if record.exc_info and record.exc_info[1] is not None:
            err = record.exc_info[1]
            mark = _FAILED_START_MARK if record.getMessage().endswith(_FAILED_START) else _MARK
            text += f"\n{mark}{type(err).__name__}: {one_line(err)}"
        return text


class EngineErrorFileHandler(logging.FileHandler):
    """``logging.FileHandler`` whose log going away is no error: once the engine started its directory is dropped,
    but its processes (and, on vLLM 0.32, this one: ``LLM`` applies the configuration here too) keep the handler, and
    a plain one (``delay``: opened at the first error) then raised ``FileNotFoundError`` from the logging call."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            super().emit(record)
        except OSError:   # the directory was dropped: the error goes to vLLM's console handler alone
            pass


class FailedStartFilter(logging.Filter):
    """A quiet run's filter on vLLM's console handler: an engine process that logs its failed start (not
    ``starter_pid``, the process that started the engine, which vLLM 0.32 configures too) sends nothing more to the
    console, and its stderr to the log file (``log_dir``), to its end: the starter's line says the error. The
    handler lets ERROR records through to it (``_at_most_error``); ``level``, the console's own (``VLLM_LOGGING_LEVEL``,
    CRITICAL too), is applied here."""

    def __init__(self, log_dir: str, starter_pid: int, level: int = logging.NOTSET):
        super().__init__()
        self.log_dir, self.starter_pid, self.level = log_dir, starter_pid, level
        self.failed = False

    def filter(self, record: logging.LogRecord) -> bool:
        if (not self.failed and record.exc_info and os.getpid() != self.starter_pid
                and record.getMessage().endswith(_FAILED_START)):
            self.failed = True
            _stderr_to(os.path.join(self.log_dir, LOG_NAME))
        return not self.failed and record.levelno >= self.level


def _stderr_to(path: str) -> None:
    """This process's stderr (its file descriptor: Python's writes and C's) appended to ``path``; dropped when
    ``path`` cannot be opened (its directory was dropped)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError:
        fd = os.open(os.devnull, os.O_WRONLY)
    if sys.stderr is not None:
        sys.stderr.flush()
    os.dup2(fd, 2)
    os.close(fd)


def start_log_environ(log_dir: str, environ=os.environ, quiet: bool = False) -> dict[str, str]:
    """The environment that makes a spawned engine's processes log their errors to ``log_dir/engine_errors.log``
    too (the logging configuration is written there), and, ``quiet``, print nothing more once they logged a failed
    start (``FailedStartFilter``); nothing when the user configures vLLM's logging, or when this vLLM has no
    default configuration to extend."""
    if environ.get("VLLM_LOGGING_CONFIG_PATH") or environ.get("VLLM_CONFIGURE_LOGGING", "1") == "0":
        return {}
    try:
        from vllm.logger import DEFAULT_LOGGING_CONFIG
        config = copy.deepcopy(DEFAULT_LOGGING_CONFIG)
        config["formatters"]["phf_engine_errors"] = {"()": f"{__name__}.EngineErrorFormatter",
                                                     "format": "%(levelname)s %(name)s: %(message)s"}
        config["handlers"]["phf_engine_errors"] = {"class": f"{__name__}.EngineErrorFileHandler", "level": "ERROR",
                                                   "delay": True,
                                                   "filename": os.path.join(log_dir, LOG_NAME),
                                                   "formatter": "phf_engine_errors"}
        config["loggers"]["vllm"]["handlers"].append("phf_engine_errors")
        config["loggers"]["vllm"]["level"] = _at_most_error(config["loggers"]["vllm"]["level"])   # the file's errors
        if quiet:
            console = config["handlers"]["vllm"]
            config.setdefault("filters", {})["phf_failed_start"] = {
                "()": f"{__name__}.FailedStartFilter", "log_dir": log_dir, "starter_pid": os.getpid(),
                "level": logging.getLevelName(console["level"])}
            console["level"] = _at_most_error(console["level"])   # the failed start's record reaches the filter
            console.setdefault("filters", []).append("phf_failed_start")
        path = os.path.join(log_dir, "vllm_logging.json")
        with open(path, "w") as f:
            json.dump(config, f)
    except Exception:   # noqa: BLE001 - another vLLM's layout: the engine starts with its own logging
        return {}
    return {"VLLM_LOGGING_CONFIG_PATH": path}


def _at_most_error(level: str) -> str:
    """``level`` (a ``logging`` level's name, ``VLLM_LOGGING_LEVEL``'s), or ERROR when it is above (CRITICAL: the
    logger and the quiet console's handler then dropped the failed start's record, which the file and
    ``FailedStartFilter`` need: the line said the error was "in the log above", multiprocessing's traceback printed)."""
    number = logging.getLevelName(level)
    return "ERROR" if isinstance(number, int) and number > logging.ERROR else level


def new_log_dir() -> str:
    """A fresh directory for one engine start's error log (``drop_log_dir`` once the engine started)."""
    return tempfile.mkdtemp(prefix="phf_vllm_start_")


def drop_log_dir(log_dir: str) -> None:
    shutil.rmtree(log_dir, ignore_errors=True)


def kept_logs(err: BaseException) -> list[str]:
    """The log directories a failed start kept for its line (``VLLMStartError.log_dir``, in ``err``'s chain)."""
    return [cause.log_dir for cause in error_chain(err) if isinstance(cause, VLLMStartError) and cause.log_dir]


def drop_unsaid_logs(log_dirs: list[str], line: str) -> None:
    """Drop each of ``log_dirs`` (``kept_logs``) that ``line``, what the user is told, does not name (a setting's
    line says vLLM's words alone, the eval's parent one worker's line: nobody would find that log)."""
    for log_dir in log_dirs:
        if log_dir not in line:
            drop_log_dir(log_dir)


def engine_error(log_dir: str) -> Exception | None:
    """The first exception the engine's processes logged under ``log_dir`` as a failed start, else the first logged,
    rebuilt: a built-in exception type as itself (``ValueError``), another as ``EngineProcessError`` naming it; None
    when none was logged."""
    try:
        with open(os.path.join(log_dir, LOG_NAME)) as f:
            marked = [line.rstrip("\n") for line in f if line.startswith((_FAILED_START_MARK, _MARK))]
    except OSError:
        return None
    line = next((m for m in marked if m.startswith(_FAILED_START_MARK)), marked[0] if marked else None)
    if line is None:
        return None
    said = line.partition(": ")[2]
    name, _, message = said.partition(": ")
    cls = getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(message)
        except Exception:   # noqa: BLE001 - a type of more arguments (UnicodeDecodeError)
            pass
    return EngineProcessError(said)


def described(err: BaseException) -> str:
    """``Type: message`` of ``err`` (an ``EngineProcessError`` names the engine process's own type already)."""
    return str(err) if isinstance(err, EngineProcessError) else f"{type(err).__name__}: {err}"
