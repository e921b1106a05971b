"""A quiet start for every command line: third-party noise off unless asked for.

At the default verbosity these are hidden: Python warnings raised by other packages (Megatron's
"Transformer Engine and Apex are not installed" fallbacks, deprecation notices of torch, Megatron
and vLLM), vLLM's INFO and WARNING log (thread binding, LD_PRELOAD, Triton), and torch's own
warning log (Python and C++). The trainer prints one line saying which implementations run
instead (``training.model_setup.implementations``); progress bars stay, and so do errors and the
warnings of phf_megatron itself; a spawned vLLM engine that fails to start prints no traceback (its error is
the command's one line, ``rollout.vllm_start_log``). ``verbose`` (``--logging.verbose``) leaves everything as the
libraries set it. A variable the user exported (``VLLM_LOGGING_LEVEL`` ...) is never overridden.

Call it before torch, Megatron or vLLM is imported: the variables are read at import time, by
this process and by the processes vLLM spawns (which get ``PYTHONWARNINGS=ignore`` too).
``started_quiet``: an engine starts without vLLM's loading bar, here and in the processes the command
spawns (``PHF_QUIET_START``: the eval's data-parallel workers).
``hf_progress_bars_off`` hides transformers' own bars for the span of a command that prints its own
progress (``python -m phf_megatron.toy``, the eval's adapter merge), and restores them after.
``progress_bar`` is every bar of ours (conversion, evaluation, training): tqdm's on a terminal; in a
log file (stderr not a terminal: Slurm, ``2> log``) plain lines instead of ``\\r`` redraws, at most one
per percent of the total and per ``LOG_INTERVAL_S`` seconds.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import warnings
from contextlib import contextmanager

#: Module names whose warnings are kept at the default verbosity (a regex ``warnings`` matches).
OWN_MODULES = r"(phf_megatron|__main__)\b"

#: Warnings other packages raise on behalf of (attributed to) a line of ours.
FOREIGN_MESSAGES = (
    r"Please use DTensor instead",   # torch's ShardedTensor deprecation, through our CPU shim of Megatron
)


#: In a log file, a progress bar writes a line at most this often (and at most once per percent).
LOG_INTERVAL_S = 30.0


#: Set by a quiet start; inherited by the processes the command spawns (the eval's data-parallel workers).
QUIET_ENV = "PHF_QUIET_START"


def started_quiet() -> bool:
    """Whether this process, or the command that spawned it, called ``quiet_start`` without ``verbose``
    (an engine then starts without its bars)."""
    return os.environ.get(QUIET_ENV) == "1"


def quiet_start(verbose: bool = False) -> None:
    """Silence third-party warnings and logs unless ``verbose`` (see the module docstring)."""
    if verbose:
        os.environ.pop(QUIET_ENV, None)   # a --verbose command started by a quiet one (a paper_table row)
        return
    os.environ[QUIET_ENV] = "1"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")   # C++ warnings ("[W ... utils.cpp:68] Warning: ...")
    os.environ.setdefault("TORCH_LOGS", "-all")             # torch's Python log ("Triton not available")
    os.environ.setdefault("PYTHONWARNINGS", "ignore")  # inherited by the processes vLLM spawns
    warnings.filterwarnings("ignore", module=f"(?!{OWN_MODULES})")
    # Megatron's checkpoint writer logs a failed write before raising it (we name it, one line)
    logging.getLogger("megatron.core.dist_checkpointing.strategies.filesystem_async").setLevel(logging.CRITICAL)
    # Megatron 0.19 logs "MCore's async save is deprecated" on every save, synchronous ones too (its
    # sync save runs through the async path); that logger has no other warning
    logging.getLogger("megatron.core.dist_checkpointing.strategies.torch").setLevel(logging.ERROR)
    for message in FOREIGN_MESSAGES:
        warnings.filterwarnings("ignore", message=message)


@contextmanager
def hf_progress_bars_off():
    """Inside: transformers' own progress bars off ("Loading weights", "Writing model shards", and
    huggingface_hub's with them), where a command prints its own progress between them; on exit the
    setting is back as it was, so a caller of the library keeps its own."""
    from huggingface_hub import utils as hub
    from transformers.utils import logging as hf_logging

    was_on, hub_off = hf_logging.is_progress_bar_enabled(), hub.are_progress_bars_disabled()
    if was_on:
        hf_logging.disable_progress_bar()   # transformers' and the hub's
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()   # enables the hub's too: as they were
            if hub_off:
                hub.disable_progress_bars()


class _LogLines:
    """A log file as a tqdm bar's stream: each redraw (``\\r`` + the bar) is a line of its own, and
    the newline ``close()`` adds after the last one is dropped (that line has ended)."""

    def __init__(self, stream):
        self._stream = stream
        self.encoding = getattr(stream, "encoding", None)

    def write(self, text: str) -> None:
        if text.startswith("\r"):
            text = text[1:].rstrip()
            if text:
                self._stream.write(text + "\n")
        elif text.strip():
            self._stream.write(text)

    def flush(self) -> None:
        self._stream.flush()


def _has_width(stream) -> bool:
    """The terminal says its size (a pseudo-terminal of 0 x 0, as ``script`` or ``docker -t`` may open,
    showed no bar at all: tqdm hid it as a row past the last; 80 x 20 then)."""
    try:
        size = os.get_terminal_size(stream.fileno())
        return size.columns > 0 and size.lines > 0
    except (AttributeError, OSError, ValueError):
        return False


def progress_bar(iterable=None, *, total: int, desc: str, unit: str, initial: int = 0, enabled: bool = True,
                 mininterval: float = 0.1):
    """A tqdm bar on stderr with a count, a total, a rate and an ETA (``initial``: done before, as a
    resume). On a terminal it redraws in place; otherwise each redraw is a line, at most one per percent
    of ``total`` and per ``LOG_INTERVAL_S`` seconds, plus the first and the last (a log file of a run of
    hours gets about a hundred lines, not one carriage-return update per step)."""
    from tqdm import tqdm

    class Bar(tqdm):
        def update(self, n=1):
            if self.total is not None and self.n + n >= self.total:   # the last: close() draws it (drawn
                self.n += n                                             # here too, 100% was twice in a log)
                return None
            return super().update(n)

    stream = sys.stderr
    if not enabled or stream.isatty():
        wide = _has_width(stream)
        return Bar(iterable, total=total, initial=initial, desc=desc, unit=unit, disable=not enabled,
                   dynamic_ncols=wide, ncols=None if wide else 80, nrows=None if wide else 20,
                   mininterval=mininterval)
    return Bar(iterable, total=total, initial=initial, desc=desc, unit=unit, file=_LogLines(stream),
                mininterval=max(mininterval, LOG_INTERVAL_S), miniters=max(1, math.ceil(total / 100)),
                maxinterval=math.inf)   # (tqdm's monitor would redraw every 10 s, and then at every update)
