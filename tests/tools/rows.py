"""A paper_table row trained elsewhere, as the files the table reads: the trainer's latest file, its
checkpoint's ``meta.json`` and the exported adapter (no training)."""

import json
import os

from phf_megatron.input_files import LATEST_FILE, META_FILE, iter_dir_name, run_checkpoints_dir


def fake_trained(row, step: int, *, meta: dict | None = None, save: str | None = None) -> str:
    """Write ``row``'s checkpoint of ``step`` (in ``save`` or its run's checkpoints) and its adapter directory;
    return the checkpoint's directory."""
    ckpts = run_checkpoints_dir(row.run_dir, save)
    iteration = os.path.join(ckpts, iter_dir_name(step))
    os.makedirs(iteration, exist_ok=True)
    with open(os.path.join(iteration, META_FILE), "w") as f:
        json.dump(meta or {}, f)
    with open(os.path.join(ckpts, LATEST_FILE), "w") as f:
        f.write(str(step))
    if row.adapter:
        os.makedirs(row.adapter, exist_ok=True)
    return iteration
