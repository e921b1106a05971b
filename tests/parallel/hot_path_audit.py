"""Record what a PHF step asks of the device: host syncs from our code, and aten ops per pass.

``HostSyncAudit`` (a ``TorchFunctionMode``) flags the calls that make the host wait for the
device on CUDA: ``.item()``, ``.tolist()``, ``bool()/int()/float()`` of a tensor, ``nonzero``,
``torch.equal``, ``masked_select``, ``.cpu()``/``.numpy()``, and indexing with a boolean tensor.
Each one is attributed to the innermost ``phf_megatron`` frame on the Python stack (Megatron's
and torch's own calls are not ours to fix; they are counted apart). ``OpCount`` (a
``TorchDispatchMode``) counts the aten ops that launch work (view ops excluded), i.e. about the
number of kernels the same step launches on a GPU.
"""

from __future__ import annotations

import collections
import os
import traceback

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep + "phf_megatron"
EXEMPT = ("cpu_shims.py",)
SYNC_CALLS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
              torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.nonzero, torch.nonzero, torch.equal,
              torch.Tensor.masked_select, torch.masked_select, torch.Tensor.cpu, torch.Tensor.numpy}
VIEW_OPS = {"view", "_unsafe_view", "reshape", "slice", "select", "unbind", "expand", "t", "transpose", "detach",
            "alias", "as_strided", "unsqueeze", "squeeze", "permute", "split", "chunk", "split_with_sizes",
            "view_as", "_reshape_alias", "lift_fresh", "numpy_T", "unfold"}


def _ours() -> str | None:
    """``file:line`` of the innermost phf_megatron frame calling torch (None if none)."""
    for frame in reversed(traceback.extract_stack()[:-2]):  # past this function and __torch_function__
        if frame.filename.startswith(PACKAGE) and not frame.filename.endswith(EXEMPT):
            return f"{os.path.relpath(frame.filename, os.path.dirname(PACKAGE))}:{frame.lineno} ({frame.name})"
    return None


def _bool_index(args) -> bool:
    index = args[1] if len(args) > 1 else None
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


class HostSyncAudit(TorchFunctionMode):
    """Collects ``{location: [call names]}`` of host-syncing calls made from phf_megatron."""

    def __init__(self):
        super().__init__()
        self.ours: dict[str, list[str]] = collections.defaultdict(list)
        self.others = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        sync = func in SYNC_CALLS or (func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and _bool_index(args))
        if sync:
            where = _ours()
            if where is None:
                self.others += 1
            else:
                self.ours[where].append(getattr(func, "__name__", str(func)))
        return func(*args, **kwargs)


class OpCount(TorchDispatchMode):
    """Counts aten ops by name, views excluded: ``total`` and ``by_name``."""

    def __init__(self):
        super().__init__()
        self.by_name: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in VIEW_OPS:
            self.by_name[name] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.by_name.values())
