"""Package ``__init__``s that import their submodules on first use (PEP 562).

``phf_megatron.lora.config`` must import without Megatron, and ``phf_megatron.objectives.config``
without torch, so that the command line parses (and ``--help`` answers) before any heavy import;
yet ``from phf_megatron.lora import apply_lora`` keeps working. A package lists what it exports:

    __getattr__, __dir__, __all__ = lazy_exports(__name__, {"inject": ("apply_lora", ...), ...})
"""

from __future__ import annotations

import importlib
from typing import Callable


def lazy_exports(package: str, exports: dict[str, tuple[str, ...]]) -> tuple[Callable, Callable, list[str]]:
    """``(__getattr__, __dir__, __all__)`` for ``package``: each name imports its submodule when read."""
    owner = {name: module for module, names in exports.items() for name in names}
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str):
        if name not in owner:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = owner[name]  # a submodule's name, or a relative one (``"..tokenizer"``)
        value = getattr(importlib.import_module(module if module.startswith(".") else f"{package}.{module}",
                                                package), name)
        namespace[name] = value  # later reads skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(owner))

    return __getattr__, __dir__, sorted(owner)
