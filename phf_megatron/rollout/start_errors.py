"""What vLLM said of a keyword the user gave it (``--rollout.vllm_kwargs``, the eval's ``--engine_kwargs``) when
an engine did not start: the trainer's ``training/engine_start.py`` and the eval name the flag with it."""

from __future__ import annotations

import re

from ..errors import error_chain
from .gpu_memory import VLLM_KV_CACHE_MESSAGES

#: vLLM's own ``TypeError`` for a keyword ``vllm.LLM`` does not take (0.24-0.33: ``EngineArgs.__init__()``).
_UNKNOWN_KEYWORD = re.compile(r"unexpected keyword argument '(\w+)'")
#: an error the engine raised that says a bug, not the machine: its traceback stays.
BUGS = (TypeError, AttributeError, NameError, LookupError, AssertionError, NotImplementedError, ImportError)


def one_line(text: str) -> str:
    """``text``'s lines joined by spaces (vLLM's and pydantic's messages run over several)."""
    return " ".join(line.strip() for line in str(text).splitlines() if line.strip())


def refused_keyword(err: BaseException, vllm_kwargs: dict) -> str | None:
    """What vLLM said of a ``vllm_kwargs`` keyword when ``err`` names one: an unknown keyword, a pydantic
    ``ValidationError`` at the keyword's field, or a message naming it; None otherwise."""
    chain = list(error_chain(err))
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
