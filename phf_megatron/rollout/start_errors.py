"""What vLLM said of a keyword the user gave it (``--rollout.vllm_kwargs``, the eval's ``--engine_kwargs``) when
an engine did not start: the trainer's ``training/engine_start.py`` and the eval name the flag with it."""

from __future__ import annotations

import dataclasses
import re
import sys
import typing

from ..errors import error_chain
from .errors import VLLMStartError, one_line
from .gpu_memory import VLLM_KV_CACHE_MESSAGES

#: vLLM's own ``TypeError`` for a keyword ``vllm.LLM`` does not take (0.24-0.33: ``EngineArgs.__init__()``).
_UNKNOWN_KEYWORD = re.compile(r"unexpected keyword argument '(\w+)'")
#: The types a keyword's declared type (``vllm.engine.arg_utils.EngineArgs``) may be a union of for
#: ``mistyped_keyword`` to check a value against it; vLLM converts richer ones (an enum, a config) its own way.
_SCALARS = {int, float, bool, str, type(None)}
#: an error the engine raised that says a bug, not the machine: its traceback stays (``engine_bug``).
_BUGS = (TypeError, AttributeError, NameError, LookupError, AssertionError, NotImplementedError, ImportError)


def engine_bug(err: BaseException) -> bool:
    """True when the engine's start failed on an error that says a bug (``_BUGS``): ``err``'s cause, or a spawned
    engine process's own error as its log said it (``VLLMStartError.engine_error``: the cause is then vLLM's
    "Engine core initialization failed", and a ``TypeError`` the engine core raised was told as the engine's own
    failure, "rerun the same command to resume", where the in-process engine's kept its traceback)."""
    own = err.engine_error if isinstance(err, VLLMStartError) else None
    return isinstance(own if own is not None else err.__cause__, _BUGS)


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
    # a value of another type ({max_num_seqs: abc}) fails where vLLM first uses it ("'<' not supported between
    # instances of 'int' and 'str'"), naming no keyword
    return mistyped_keyword(vllm_kwargs) if isinstance(root, (TypeError, ValueError, AttributeError)) else None


def mistyped_keyword(vllm_kwargs: dict) -> str | None:
    """The first keyword whose value is not of the type ``EngineArgs`` declares for it (a union of int, float, bool,
    str and None, or a container of those: others are not checked; a None value neither), said as vLLM's other
    refusals are; None when none is (or without vLLM)."""
    if not vllm_kwargs:   # (the hf backend's failure: vLLM, maybe broken here, is not imported for it)
        return None
    try:
        import pydantic
        from vllm.engine import arg_utils
    except Exception:   # noqa: BLE001 - not installed, or broken (a TypeError at import): not checked
        return None
    declared = {f.name: f.type for f in dataclasses.fields(arg_utils.EngineArgs)}
    for key, value in vllm_kwargs.items():
        if value is None:   # vLLM's "unset", the default of fields it declares as a bare int or bool (0.32's
            continue        # enable_flashinfer_autotune, elastic_ep_max_dp_size): not of another type
        hint = declared.get(key)
        if isinstance(hint, str):   # a postponed annotation, resolved field by field: typing.get_type_hints(EngineArgs)
            # raises for all of them on one unresolvable name (0.32: NameError 'QuantizationConfigArgs')
            try:
                hint = eval(hint, vars(sys.modules[arg_utils.EngineArgs.__module__]))   # noqa: S307 - vLLM's own
            except Exception:   # noqa: BLE001 - a name its module does not hold: not checked
                continue
        if hint is None or not set(typing.get_args(hint) or (hint,)) <= _SCALARS:
            continue
        try:
            pydantic.TypeAdapter(hint).validate_python(value)
        except pydantic.ValidationError as err:
            return f"{key}: {value!r}: vLLM refused it: {one_line(err.errors()[0]['msg'])}"
    return None
