"""Megatron-Core dist checkpoints of a Qwen3 model, with the HF facts needed to export them.

A checkpoint directory written here is a plain Megatron-Core dist checkpoint (torch_dist
format; every ``ShardedTensor`` carries its global shape and offsets, so it loads under any
TP/PP layout — Megatron reshards on load) plus:

* ``phf_megatron.json``: format tag, the HF ``config.json`` dict, dtype, the layout it was
  saved from and the layout it was meant for, the source HF directory;
* ``hf_tokenizer/``: the tokenizer (and generation config / chat template) files of the source.

``save_checkpoint`` and ``load_checkpoint`` are collective over all ranks; the directory is
written to ``<dir>.tmp`` and renamed when complete, so a crash never leaves a half checkpoint
under the final name.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Optional

import torch
import torch.distributed as dist

from ..errors import InputFileError
from ..input_files import missing_dir, read_json
from ..output_files import fresh_dir, fsync_tree, replace_dir, writing
from .dist_files import load_dist_checkpoint, reading_dist_checkpoint

METADATA_FILE = "phf_megatron.json"
TOKENIZER_DIR = "hf_tokenizer"
FORMAT = "phf-megatron-qwen3/1"


def write_metadata(ckpt_dir: str, *, hf_config: dict, dtype: str, saved_layout: dict,
                   target_layout: Optional[dict] = None, source_hf_dir: Optional[str] = None,
                   tokenizer_src: Optional[str] = None, tokenizer_files: tuple[str, ...] = ()) -> None:
    """Write ``phf_megatron.json`` (and copy tokenizer files) into ``ckpt_dir`` (rank 0 only)."""
    meta = dict(format=FORMAT, hf_config=hf_config, dtype=dtype, saved_layout=saved_layout,
                target_layout=target_layout or saved_layout, source_hf_dir=source_hf_dir)
    if tokenizer_src and tokenizer_files:
        os.makedirs(os.path.join(ckpt_dir, TOKENIZER_DIR), exist_ok=True)
        for name in tokenizer_files:
            shutil.copy2(os.path.join(tokenizer_src, name), os.path.join(ckpt_dir, TOKENIZER_DIR, name))
        meta["tokenizer_dir"] = TOKENIZER_DIR
    with open(os.path.join(ckpt_dir, METADATA_FILE), "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)


def training_checkpoint_error(ckpt_dir: str) -> InputFileError | None:
    """An error naming the way out when ``ckpt_dir`` is a trainer checkpoint, not a model (else None)."""
    if os.path.isfile(os.path.join(ckpt_dir, METADATA_FILE)) or not os.path.isfile(os.path.join(ckpt_dir, "meta.json")):
        return None
    run = os.path.dirname(os.path.dirname(os.path.abspath(ckpt_dir)))
    return InputFileError(ckpt_dir, "is a training checkpoint of phf_megatron.train (optimizer, EMA, adapters), "
                                    f"not a model: make one with tools/convert/mcore_to_hf.py --mcore_dir {ckpt_dir} "
                                    "--out_dir DIR, or use the run's export, --model <base HF dir> --adapter "
                                    f"{os.path.join(run, 'export', 'peft_adapter')}")


def read_metadata(ckpt_dir: str) -> dict:
    path = os.path.join(ckpt_dir, METADATA_FILE)
    if why := missing_dir(ckpt_dir):
        raise FileNotFoundError(f"mcore_dir: {why}")
    if (error := training_checkpoint_error(ckpt_dir)) is not None:
        raise error
    check_dist_checkpoint(ckpt_dir)   # a HF model directory: not "pass --hf_config", which would not load it either
    if not os.path.isfile(path):
        raise FileNotFoundError(f"mcore_dir: no {METADATA_FILE} in {ckpt_dir} (not written by hf_to_mcore;"
                                " pass --hf_config to export it)")
    meta = read_json(path)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise InputFileError(path, f"format {meta.get('format') if isinstance(meta, dict) else meta!r}, "
                                   f"expected {FORMAT!r}")
    return meta


def save_checkpoint(model, ckpt_dir: str, write_extra=None) -> None:
    """Collectively save ``model`` (this rank's GPTModel) to ``ckpt_dir``, atomically.

    ``write_extra(tmp_dir)`` runs on global rank 0 before the rename (metadata, tokenizer).
    """
    from megatron.core import dist_checkpointing

    ckpt_dir = os.path.abspath(ckpt_dir)
    tmp = ckpt_dir + ".tmp"
    rank = dist.get_rank()
    if rank == 0 and os.path.exists(ckpt_dir):
        raise FileExistsError(f"out_dir: {ckpt_dir} already exists")
    with writing(ckpt_dir, cleanup=tmp if rank == 0 else None):  # a full disk: named, tmp removed
        if rank == 0:
            fresh_dir(tmp)
        dist.barrier()
        dist_checkpointing.save(model.sharded_state_dict(), tmp)
        dist.barrier()
        if rank == 0:
            if write_extra is not None:
                write_extra(tmp)
            fsync_tree(tmp)
            replace_dir(tmp, ckpt_dir, replace=False)
    dist.barrier()


def load_checkpoint(model, ckpt_dir: str) -> None:
    """Collectively load ``ckpt_dir`` into ``model`` under the current TP/PP layout."""
    from megatron.core import dist_checkpointing

    check_dist_checkpoint(ckpt_dir)
    state = load_dist_checkpoint(model.sharded_state_dict(), ckpt_dir)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("_extra_state")]
    if missing:
        raise InputFileError(ckpt_dir, f"the checkpoint lacks {len(missing)} model tensor(s), e.g. {missing[:5]}")


def check_dist_checkpoint(ckpt_dir: str) -> None:
    """``ckpt_dir`` is a Megatron-Core dist checkpoint (Megatron's own test: ``metadata.json``)."""
    if why := missing_dir(ckpt_dir):
        raise FileNotFoundError(f"mcore_dir: {why}")
    if not os.path.isfile(os.path.join(ckpt_dir, "metadata.json")):
        raise InputFileError(ckpt_dir, "not a Megatron-Core dist checkpoint (no metadata.json)")


def checkpoint_dtype(ckpt_dir: str) -> torch.dtype:
    """The dtype of the stored weights (from the tensor metadata of the dist checkpoint)."""
    from megatron.core import dist_checkpointing

    check_dist_checkpoint(ckpt_dir)
    with reading_dist_checkpoint(ckpt_dir):
        meta = dist_checkpointing.load_tensors_metadata(ckpt_dir)
    for key, value in meta.items():
        if "final_layernorm" in key:
            return value.dtype
    raise InputFileError(ckpt_dir, "no final_layernorm tensor")
