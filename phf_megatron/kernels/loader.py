"""Find the fused flow-loss CUDA extension, or say why it is not there.

Order: the module ``phf_megatron._flow_cuda`` built by ``setup.py`` (``pip install -e .
--no-build-isolation`` on a GPU machine), then a one-time JIT build of ``csrc/`` with
``torch.utils.cpp_extension.load`` into ``$PHF_FLOW_BUILD_DIR`` (default
``~/.cache/phf_megatron/flow_cuda/<torch>-<cuda>``). On a CPU machine nothing is built and
:func:`unavailable_reason` explains why. ``PHF_FLOW_JIT=0`` disables the JIT build.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path
from types import ModuleType

CSRC = Path(__file__).resolve().parents[2] / "csrc"
JIT_NAME = "phf_flow_cuda"
NVCC_FLAGS = ("-O3", "-lineinfo")  # the -std flag is torch's own (C++17 or C++20 by version)


def _sources() -> list[Path]:
    return sorted(CSRC.glob("*.cpp")) + sorted(CSRC.glob("*.cu"))


def _build_dir(torch) -> Path:
    explicit = os.environ.get("PHF_FLOW_BUILD_DIR")
    if explicit:
        return Path(explicit)
    digest = hashlib.sha1()
    for path in sorted(CSRC.glob("*")):
        digest.update(path.name.encode() + path.read_bytes())
    tag = f"torch{torch.__version__}-cu{torch.version.cuda}-{digest.hexdigest()[:10]}".replace("+", "_")
    return Path.home() / ".cache" / "phf_megatron" / "flow_cuda" / tag


def _jit_build(torch, verbose: bool) -> ModuleType:
    from torch.utils.cpp_extension import load

    build_dir = _build_dir(torch)
    build_dir.mkdir(parents=True, exist_ok=True)
    extra = ["-Xptxas=-v"] if os.environ.get("PHF_FLOW_PTXAS_VERBOSE") == "1" else []
    if not verbose:
        warnings.warn(f"building the flow CUDA extension into {build_dir} (one time, about a minute)", stacklevel=3)
    return load(
        name=JIT_NAME,
        sources=[str(p) for p in _sources()],
        extra_cflags=["-O3"],
        extra_cuda_cflags=list(NVCC_FLAGS) + extra,
        build_directory=str(build_dir),
        verbose=verbose,
    )


_RESULT: tuple[ModuleType | None, str | None] | None = None


def _load(verbose: bool = False) -> tuple[ModuleType | None, str | None]:
    """Try once per process; every later call returns the first answer."""
    global _RESULT
    if _RESULT is None:
        _RESULT = _try_load(verbose)
    return _RESULT


def _try_load(verbose: bool) -> tuple[ModuleType | None, str | None]:
    try:
        from phf_megatron import _flow_cuda  # built by setup.py

        return _flow_cuda, None
    except ImportError as exc:
        prebuilt = f"phf_megatron._flow_cuda is not built ({exc})"
    import torch

    if torch.version.cuda is None:
        return None, f"{prebuilt}; torch {torch.__version__} is a CPU-only build, so nothing can be JIT-built"
    if not torch.cuda.is_available():
        return None, f"{prebuilt}; no CUDA device is visible"
    if os.environ.get("PHF_FLOW_JIT", "1") == "0":
        return None, f"{prebuilt}; the JIT build is disabled (PHF_FLOW_JIT=0)"
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME is None:
        return None, f"{prebuilt}; no CUDA toolkit found for a JIT build (set CUDA_HOME or put nvcc on PATH)"
    if not _sources():
        return None, f"{prebuilt}; the kernel sources are not at {CSRC} (a wheel install ships no csrc/)"
    try:
        return _jit_build(torch, verbose), None
    except Exception as exc:  # a failed compile must not take the reference path down with it
        return None, f"{prebuilt}; the JIT build failed: {type(exc).__name__}: {exc}"


def load_extension(verbose: bool = False) -> ModuleType | None:
    """The extension module, or None (see :func:`unavailable_reason`). Cached after the first call."""
    return _load(verbose)[0]


def unavailable_reason() -> str | None:
    """Why the extension cannot be used here, or None when it can."""
    return _load()[1]


def available() -> bool:
    return load_extension() is not None


def require() -> ModuleType:
    """The extension, or a RuntimeError that says why it is unavailable."""
    module, reason = _load()
    if module is None:
        raise RuntimeError(f"backend='cuda': the fused flow-loss CUDA extension is unavailable: {reason}")
    return module
