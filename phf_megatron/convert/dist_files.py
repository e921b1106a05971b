"""Reading Megatron's distributed (torch_dist) checkpoints: a damaged file is an ``InputFileError`` that names it
(``.metadata``, ``common.pt``, ``metadata.json`` or a ``*.distcp`` cut short), not torch's traceback.

    state = load_dist_checkpoint(model.sharded_state_dict(), ckpt_dir)
    with reading_dist_checkpoint(ckpt_dir): ...   # around any other read of one
"""

from __future__ import annotations

import json
import os
import pickle
from contextlib import contextmanager

from ..errors import InputFileError
from ..input_files import load_torch_file, read_json


#: What a Megatron dist checkpoint's reader raises on a damaged file.
_DAMAGED = (EOFError, RuntimeError, ValueError, pickle.UnpicklingError)
#: What unpickling damaged bytes raises: cut or overwritten, any of these, by where and what the bytes say.
_UNPICKLING = (OSError, EOFError, pickle.UnpicklingError, ValueError, AttributeError, ImportError, IndexError,
               KeyError, TypeError, OverflowError, MemoryError, RecursionError)


def _dist_metadata(ckpt_dir: str):
    """A torch_dist checkpoint's ``.metadata`` (torch's DCP ``Metadata``); ``InputFileError`` naming it when it is
    missing, unreadable, cut short or holds another object."""
    from torch.distributed.checkpoint.metadata import Metadata

    path = os.path.join(ckpt_dir, ".metadata")
    try:
        with open(path, "rb") as f:
            metadata = pickle.load(f)
    except FileNotFoundError:
        raise InputFileError(path, "missing (not a complete torch_dist checkpoint)") from None
    except _UNPICKLING as err:
        raise InputFileError(path, f"unreadable, truncated or corrupt ({type(err).__name__}: {err})") from err
    if not isinstance(metadata, Metadata):
        raise InputFileError(path, f"unreadable, truncated or corrupt (a pickled {type(metadata).__name__}, not "
                                   "torch.distributed.checkpoint's Metadata)")
    return metadata


def _damaged_dist_file(ckpt_dir: str) -> tuple[str, str] | None:
    """The first damaged file of a torch_dist checkpoint and what is wrong with it (None: all look fine):
    ``.metadata`` and ``common.pt`` must load, ``metadata.json`` parse, and every ``*.distcp`` hold
    the bytes ``.metadata`` says it holds."""
    try:
        metadata = _dist_metadata(ckpt_dir)
    except InputFileError as err:
        return err.path, err.detail
    for name, reader in (("metadata.json", read_json), ("common.pt", lambda p: load_torch_file(p, weights_only=False))):
        path = os.path.join(ckpt_dir, name)
        if os.path.isfile(path):
            try:
                reader(path)
            except InputFileError as err:
                return path, err.detail
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(needed.items()):
        path = os.path.join(ckpt_dir, name)
        if not os.path.isfile(path):
            return path, "missing (listed in .metadata)"
        if os.path.getsize(path) < size:
            return path, f"truncated: {os.path.getsize(path)} bytes, .metadata says at least {size}"
    return None


@contextmanager
def reading_dist_checkpoint(ckpt_dir: str):
    """Around a read of a Megatron dist checkpoint: a failure caused by a damaged file becomes an
    ``InputFileError`` naming that file (or the directory, when no single file is to blame)."""
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException: wraps each rank's error

    try:
        yield
    except (*_DAMAGED, CheckpointException) as err:
        damaged = _damaged_dist_file(ckpt_dir)
        if damaged is not None:
            raise InputFileError(*damaged) from err
        # each rank's error, wrapped: its last line (str() is every rank's traceback)
        cause = next(iter(err.failures.values()))[0] if isinstance(err, CheckpointException) and err.failures else err
        said = f"{type(cause).__name__}: {str(cause).strip().splitlines()[-1] if str(cause).strip() else ''}"
        if "shape mismatch" in str(cause):   # megatron's check of the model's shapes: another model, not damage
            raise InputFileError(ckpt_dir, f"saved from another model than this run's ({said})") from err
        if isinstance(err, (EOFError, json.JSONDecodeError, pickle.UnpicklingError, CheckpointException)):
            raise InputFileError(ckpt_dir, f"a file of this dist checkpoint is truncated or corrupt ({said})") from err
        raise


def _common_inside(ckpt_dir: str) -> bool:
    """Whether the checkpoint keeps its common state among its DCP objects (``common_state/...`` in ``.metadata``):
    Megatron-Core 0.19 writes no ``common.pt`` (``dist_checkpointing.save``), earlier releases do. A damaged
    ``.metadata``: ``InputFileError`` naming it (``_dist_metadata``)."""
    return any(str(key).startswith("common_state/") for key in _dist_metadata(ckpt_dir).state_dict_metadata or {})


def load_dist_checkpoint(sharded_state_dict: dict, ckpt_dir: str) -> dict:
    """``megatron.core.dist_checkpointing.load``, damaged files named (``reading_dist_checkpoint``)."""
    from megatron.core import dist_checkpointing

    for name in ("metadata.json", ".metadata", "common.pt"):   # Megatron's loader: a traceback without one
        if not os.path.isfile(os.path.join(ckpt_dir, name)) and not (name == "common.pt" and _common_inside(ckpt_dir)):
            raise InputFileError(os.path.join(ckpt_dir, name), "missing (not a complete torch_dist checkpoint)")
    with reading_dist_checkpoint(ckpt_dir):
        return dist_checkpointing.load(sharded_state_dict, ckpt_dir)
