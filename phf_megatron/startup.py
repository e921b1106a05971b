"""A quiet start for every command line: third-party noise off unless asked for.

At the default verbosity these are hidden: Python warnings raised by other packages (Megatron's
"Transformer Engine and Apex are not installed" fallbacks, deprecation notices of torch, Megatron
and vLLM), vLLM's INFO and WARNING log (thread binding, LD_PRELOAD, Triton), and torch's own
warning log (Python and C++). The trainer prints one line saying which implementations run
instead (``training.model_setup.implementations``); progress bars stay, and so do errors and the
warnings of phf_megatron itself. ``verbose`` (``--logging.verbose``) leaves everything as the
libraries set it. A variable the user exported (``VLLM_LOGGING_LEVEL`` ...) is never overridden.

Call it before torch, Megatron or vLLM is imported: the variables are read at import time, by
this process and by the processes vLLM spawns (which get ``PYTHONWARNINGS=ignore`` too).
``hf_progress_bars_off`` hides transformers' own bars for the span of a command that prints its own
progress (``python -m phf_megatron.toy``), and restores them after.
"""

from __future__ import annotations

import logging
import os
import warnings
from contextlib import contextmanager

#: Module names whose warnings are kept at the default verbosity (a regex ``warnings`` matches).
OWN_MODULES = r"(phf_megatron|__main__)\b"

#: Warnings other packages raise on behalf of (attributed to) a line of ours.
FOREIGN_MESSAGES = (
    r"Please use DTensor instead",   # torch's ShardedTensor deprecation, through our CPU shim of Megatron
)


def quiet_start(verbose: bool = False) -> None:
    """Silence third-party warnings and logs unless ``verbose`` (see the module docstring)."""
    if verbose:
        return
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
