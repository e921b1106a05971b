"""Whole-checkpoint conversions HF <-> Megatron-Core dist checkpoint (what tools/convert/ runs).

Both validate everything they can before creating any output (architecture, shards, shapes,
TP/PP divisibility, an existing output directory), stream tensor by tensor (peak memory ≈ the
model once, in the stored dtype), and write atomically (``<out>.tmp`` renamed at the end).
"""

from __future__ import annotations

import os
import sys
from typing import Optional

import torch
import torch.distributed as dist

from phf_megatron.commands import launch_world_size
from phf_megatron.convert.hf_checkpoint import TOKENIZER_FILES, HFCheckpoint
from phf_megatron.convert.hf_writer import DTYPE_NAMES, write_hf_checkpoint
from phf_megatron.convert.live_model import iter_hf_weights, load_hf_weights
from phf_megatron.convert.mcore_checkpoint import (METADATA_FILE, TOKENIZER_DIR, check_dist_checkpoint,
                                                   checkpoint_dtype, load_checkpoint, read_metadata,
                                                   save_checkpoint, write_metadata)
from phf_megatron.runtime.megatron_session import megatron_session
from phf_megatron.models.qwen3_arch import Qwen3Arch
from phf_megatron.convert.qwen3_mapping import hf_shapes
from phf_megatron.errors import InputFileError, UserError, as_config_error
from phf_megatron.output_files import new_dir_problem
from phf_megatron.startup import progress_bar


def _launch_layout(tp: int, pp: int) -> tuple[int, int]:
    """The layout to build in: (tp, pp) under torchrun with tp*pp ranks, (1, 1) in one process."""
    world = launch_world_size()
    if world == 1:
        return 1, 1
    if world != tp * pp:
        raise UserError(f"WORLD_SIZE={world}: launched with {world} ranks; expected 1 or tp x pp = {tp * pp} "
                        f"(--tp {tp} --pp {pp})")
    return tp, pp


def _check_new_dir(path: str) -> None:
    if why := new_dir_problem(path):
        raise (FileExistsError if os.path.exists(path) else FileNotFoundError)(f"out_dir: {why}")


def convert_hf_to_mcore(hf_dir: str, out_dir: str, *, tp: int = 1, pp: int = 1,
                        dtype: Optional[torch.dtype] = None, progress: bool = True,
                        require_tokenizer: bool = False) -> None:
    """HF Qwen3 checkpoint -> Megatron-Core dist checkpoint loadable under any TP/PP.

    ``tp``/``pp`` are the layout the checkpoint is meant for (checked against the model's
    heads, query groups, FFN, vocabulary and layers); a one-process run saves it unsharded.
    ``require_tokenizer``: refuse an ``hf_dir`` without tokenizer files (the export needs them).
    """
    from phf_megatron.models import build_qwen3_model
    from phf_megatron.tokenizer import TOKENIZER_RULE, check_tokenizer_files, has_tokenizer_files  # transformers

    source = HFCheckpoint(hf_dir)  # validates names, shards and shapes against config.json
    if require_tokenizer and not has_tokenizer_files(source.path):
        raise InputFileError(source.path, f"no tokenizer files ({TOKENIZER_RULE}), which "
                                          "mcore_to_hf needs to export the checkpoint; copy them in, or pass "
                                          "--require_tokenizer=false and give mcore_to_hf --tokenizer_dir later")
    check_tokenizer_files(source.path)   # a damaged one is named here, not copied into the checkpoint
    arch = source.arch
    try:
        arch.check_layout(tp, pp)
    except ValueError as err:  # "tp: ..." / "pp: ...": the converter's --tp / --pp
        raise as_config_error(err, ("tp", "pp")) or err from None
    _check_new_dir(out_dir)
    dtype = dtype or source.dtype()
    run_tp, run_pp = _launch_layout(tp, pp)
    with megatron_session(run_tp, run_pp):
        model = build_qwen3_model(arch, dtype=dtype, perform_initialization=False)
        names = [n for n, _ in model.named_parameters()]
        bar = progress_bar(total=len(names), desc="hf->mcore load", unit="tensor",
                           enabled=progress and dist.get_rank() == 0)
        load_hf_weights(model, source.get, arch, on_tensor=lambda name: bar.update())
        bar.close()

        def extra(tmp_dir: str) -> None:
            write_metadata(tmp_dir, hf_config=source.config, dtype=DTYPE_NAMES[dtype],
                           saved_layout=dict(tp=run_tp, pp=run_pp), target_layout=dict(tp=tp, pp=pp),
                           source_hf_dir=source.path, tokenizer_src=source.path,
                           tokenizer_files=tuple(source.tokenizer_files()))

        say_phase(progress, f"hf->mcore save: writing the dist checkpoint into {os.path.abspath(out_dir)}.tmp "
                         "(renamed when complete)")   # as long as the load at 8B, with no bar of its own
        save_checkpoint(model, out_dir, write_extra=extra)


def say_phase(enabled: bool, line: str) -> None:
    """A converter's phase without a bar of its own (a dist checkpoint's save or load, a run export's loads),
    said as it starts (rank 0, stderr, as the bars)."""
    if enabled and dist.get_rank() == 0:
        print(line, file=sys.stderr, flush=True)


def _tokenizer_source(mcore_dir: str, meta: dict, tokenizer_dir: Optional[str]) -> tuple[str, list[str]]:
    from phf_megatron.input_files import missing_dir
    from phf_megatron.tokenizer import check_tokenizer_files, has_tokenizer_files

    if tokenizer_dir and (why := missing_dir(tokenizer_dir)):   # was "mcore_dir: no tokenizer found (looked in ...)"
        raise FileNotFoundError(f"tokenizer_dir: {why}")
    candidates = [tokenizer_dir] if tokenizer_dir else [
        os.path.join(mcore_dir, meta.get("tokenizer_dir") or TOKENIZER_DIR), meta.get("source_hf_dir")]
    for path in candidates:
        if path and os.path.isdir(path):
            if has_tokenizer_files(path):
                check_tokenizer_files(path)   # named here, not copied into the export
                return path, [f for f in TOKENIZER_FILES if os.path.isfile(os.path.join(path, f))]
            if tokenizer_dir:
                raise FileNotFoundError(f"tokenizer_dir: no tokenizer files in {tokenizer_dir}")
    raise FileNotFoundError(f"mcore_dir: no tokenizer found (looked in {[c for c in candidates if c]}); "
                            "pass --tokenizer_dir DIR")


def convert_mcore_to_hf(mcore_dir: str, out_dir: str, *, tokenizer_dir: Optional[str] = None,
                        hf_config: Optional[dict] = None, dtype: Optional[torch.dtype] = None,
                        tp: int = 1, pp: int = 1, max_shard_bytes: int = 2 << 30,
                        progress: bool = True) -> None:
    """Megatron-Core dist checkpoint -> HF safetensors + config + tokenizer (rank 0 writes)."""
    from megatron.core import parallel_state

    from phf_megatron.models import build_qwen3_model

    mcore_dir = os.path.abspath(mcore_dir)
    if hf_config is not None:   # before the tokenizer's search: a directory of another kind is named as such
        check_dist_checkpoint(mcore_dir)
    meta = read_metadata(mcore_dir) if hf_config is None else {"hf_config": hf_config}
    try:
        arch = Qwen3Arch.from_hf(meta["hf_config"])
    except ValueError as err:  # the stored (or given) config names a model we cannot export
        raise InputFileError(os.path.join(mcore_dir, METADATA_FILE) if hf_config is None else "hf_config",
                             str(err)) from None
    tok_src, tok_files = _tokenizer_source(mcore_dir, meta, tokenizer_dir)
    _check_new_dir(out_dir)
    run_tp, run_pp = _launch_layout(tp, pp)
    stored = checkpoint_dtype(mcore_dir)
    with megatron_session(run_tp, run_pp):
        model = build_qwen3_model(arch, dtype=stored, perform_initialization=False)
        say_phase(progress, f"mcore->hf load: reading the dist checkpoint {mcore_dir}")
        try:
            load_checkpoint(model, mcore_dir)
        except Exception as err:   # Megatron's CheckpointingException: a traceback of its planner
            if hf_config is None or "shape mismatch" not in str(err):
                raise
            said = next(line for line in str(err).splitlines() if "shape mismatch" in line).strip()
            said = said.partition("CheckpointingException: ")[2] or said
            raise InputFileError("hf_config", f"not the model of {mcore_dir}: its tensors have other shapes "
                                              f"({said[:240]})") from None
        items = iter_hf_weights(model, arch, pp_group=parallel_state.get_pipeline_model_parallel_group())
        if dist.get_rank() == 0:
            names = list(hf_shapes(arch))
            # closed on an error too, so the error's line starts a line of its own
            with progress_bar(items, total=len(names), desc="mcore->hf", unit="tensor", enabled=progress) as bar:
                write_hf_checkpoint(bar, out_dir, hf_config=meta["hf_config"], dtype=dtype or stored,
                                    tokenizer_src=tok_src, tokenizer_files=tok_files,
                                    max_shard_bytes=max_shard_bytes, expected_names=names)
        else:
            for _ in items:  # the gathers and broadcasts are collective
                pass
        dist.barrier()
