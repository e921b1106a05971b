"""Read back what W&B wrote offline: the history of a ``run-*.wandb`` file under a save dir.

The file is a LevelDB-style log of protobuf ``Record``s (W&B's transaction log): a 7-byte header
``:W&B`` + magic 0xBEE1 + version, then 32 KiB blocks of records, each with a 7-byte header
(checksum, length, type: 1 full, 2 first, 3 middle, 4 last); fewer than 7 bytes left in a block
are padding.
"""

from __future__ import annotations

import glob
import json
import os
import struct
import time

BLOCK = 32768


def _records(path: str):
    from wandb.proto import wandb_internal_pb2 as pb

    data = open(path, "rb").read()
    if len(data) < 7:
        return
    ident, magic, _ = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B" and magic == 0xBEE1, (ident, magic)
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if kind == 0:
            pos += left
            continue
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_runs(save_dir: str, timeout: float = 60.0) -> list[str]:
    """The offline run files under ``save_dir``, each complete: ``wandb.finish()`` returns before
    W&B's writer process has flushed the file, so wait (bounded) for its closing ``exit`` record."""
    paths = sorted(glob.glob(os.path.join(save_dir, "wandb", "offline-run-*", "run-*.wandb")))
    deadline = time.monotonic() + timeout
    for path in paths:
        wandb_complete(path, deadline - time.monotonic())
    return paths


def wandb_complete(path: str, timeout: float = 60.0) -> str:
    """``path`` once W&B's writer has closed it (its ``exit`` record is there; bounded wait)."""
    deadline = time.monotonic() + timeout
    while not any(r.WhichOneof("record_type") == "exit" for r in _records(path)):
        assert time.monotonic() < deadline, f"{path}: W&B did not finish writing within {timeout} s"
        time.sleep(0.2)
    return path


def wandb_history(path: str) -> dict[int, dict[str, float]]:
    """``{step: {key: value}}`` of the logged history (W&B's own ``_step``/``_runtime`` keys dropped)."""
    out: dict[int, dict[str, float]] = {}
    for record in _records(path):
        if record.WhichOneof("record_type") != "history":
            continue
        row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
        out[int(row.pop("_step"))] = {k: v for k, v in row.items() if not k.startswith("_")}
    return out


def wandb_config(path: str) -> dict:
    """The run's config as logged (``{key: value}``, W&B's own ``_wandb`` entry dropped)."""
    config = {}
    for record in _records(path):
        if record.WhichOneof("record_type") in ("run", "config"):
            items = record.run.config.update if record.HasField("run") else record.config.update
            config.update({item.key: json.loads(item.value_json) for item in items})
    config.pop("_wandb", None)
    return config


def wandb_run_id(path: str) -> str:
    """The id of the run a ``run-*.wandb`` file holds."""
    return next(r.run.run_id for r in _records(path) if r.WhichOneof("record_type") == "run")
