"""Write a HF Qwen3 checkpoint (safetensors shards + index + config + tokenizer) from a stream.

``write_hf_checkpoint(items, out_dir, ...)`` consumes ``(hf_name, tensor)`` pairs one at a time,
buffering at most one shard (``max_shard_bytes``), and writes into ``<out_dir>.tmp`` renamed to
``out_dir`` at the end (``output_files.atomic_dir``). The result is what ``transformers`` and vLLM
load: ``config.json`` (with the stored dtype), ``model-XXXXX-of-YYYYY.safetensors``,
``model.safetensors.index.json``.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Iterable, Optional

import torch
from safetensors.torch import save_file

from ..errors import NonFiniteError
from ..output_files import atomic_dir, nonfinite_summary

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def write_hf_checkpoint(items: Iterable[tuple[str, torch.Tensor]], out_dir: str, *, hf_config: dict,
                        dtype: torch.dtype, tokenizer_src: Optional[str] = None,
                        tokenizer_files: Iterable[str] = (), max_shard_bytes: int = 2 << 30,
                        expected_names: Optional[Iterable[str]] = None, replace: bool = False) -> str:
    """Stream ``items`` into a HF checkpoint at ``out_dir``; returns ``out_dir``.

    An existing ``out_dir`` is refused, or with ``replace`` swapped for the new one once it is complete
    (the trainer's own export, rewritten when a finished run is resumed to train longer).

    ``expected_names``: if given, the stream must produce exactly these names (checked before
    the rename, so a short stream never becomes a checkpoint).
    """
    out_dir = os.path.abspath(out_dir)
    if os.path.exists(out_dir) and not replace:
        raise FileExistsError(f"out_dir: {out_dir} already exists")
    with atomic_dir(out_dir, replace=replace) as tmp:
        nonfinite = _write_into(tmp, items, hf_config, dtype, tokenizer_src, tokenizer_files, max_shard_bytes,
                                expected_names)
        if nonfinite is not None:  # raised inside: the temp directory goes, out_dir never appears
            raise NonFiniteError.not_written(out_dir, nonfinite)
    return out_dir


def _write_into(tmp: str, items, hf_config: dict, dtype: torch.dtype, tokenizer_src: Optional[str],
                tokenizer_files: Iterable[str], max_shard_bytes: int, expected_names: Optional[Iterable[str]]) -> Optional[str]:
    """The checkpoint's files, into the (temporary) directory ``tmp``; returns what the first tensor
    that is not finite holds (in the written dtype), or None."""
    shard: dict[str, torch.Tensor] = {}
    shard_bytes, files, weight_map, total = 0, [], {}, 0
    nonfinite = None  # the first tensor that is not finite (the stream is finished first: it may be collective)

    def flush():
        nonlocal shard, shard_bytes
        if shard:
            name = f"shard-{len(files):05d}.safetensors"
            save_file(shard, os.path.join(tmp, name), metadata={"format": "pt"})
            files.append((name, list(shard)))
            shard, shard_bytes = {}, 0

    for name, tensor in items:
        if name in weight_map or name in shard:
            raise ValueError(f"{name}: produced twice by the conversion")
        tensor = tensor.detach().to("cpu", dtype).contiguous()
        if nonfinite is None and (summary := nonfinite_summary(tensor)) is not None:
            nonfinite = f"{name} holds {summary}"
        size = tensor.numel() * tensor.element_size()
        if shard and shard_bytes + size > max_shard_bytes:
            flush()
        shard[name] = tensor.clone() if tensor.untyped_storage().nbytes() != size else tensor
        shard_bytes += size
        total += size
        weight_map[name] = None
    flush()
    if nonfinite is not None:
        return nonfinite
    if expected_names is not None:
        missing = sorted(set(expected_names) - set(weight_map))
        if missing:
            raise ValueError(f"conversion produced no tensor for {missing[:5]} ({len(missing)} missing)")
    # Final names need the shard count, so rename once all are written.
    for i, (name, names) in enumerate(files):
        final = f"model-{i + 1:05d}-of-{len(files):05d}.safetensors"
        os.replace(os.path.join(tmp, name), os.path.join(tmp, final))
        weight_map.update({n: final for n in names})
    with open(os.path.join(tmp, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
    config = dict(hf_config)
    config["torch_dtype"] = config["dtype"] = DTYPE_NAMES[dtype]
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    for name in tokenizer_files:
        shutil.copy2(os.path.join(tokenizer_src, name), os.path.join(tmp, name))
    return None
