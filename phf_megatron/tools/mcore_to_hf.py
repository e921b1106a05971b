"""Convert a Megatron-Core checkpoint of Qwen3 to a Hugging Face checkpoint: a converted base model
(hf_to_mcore's), or a training run's student (LoRA merged, or the PEFT adapter).

    python tools/convert/mcore_to_hf.py --mcore_dir ckpt/qwen3-1.7b-mcore --out_dir Qwen3-1.7B-export \\
        [--tokenizer_dir Qwen3-1.7B] [--dtype bf16|fp32] [--max_shard_size_gb 2]
    python tools/convert/mcore_to_hf.py --mcore_dir runs/phf --out_dir runs/phf/export/merged     # latest checkpoint
    python tools/convert/mcore_to_hf.py --mcore_dir runs/phf/checkpoints/iter_0000100 --out_dir H
    python tools/convert/mcore_to_hf.py --mcore_dir runs/phf --out_dir A --adapter_only           # PEFT adapter
    phf-mcore-to-hf ...                       # the same command, installed by pip

A model checkpoint: writes safetensors shards + index, ``config.json`` and the tokenizer files,
loadable by ``transformers`` and vLLM. The HF config and tokenizer come from the checkpoint (stored
by ``hf_to_mcore.py``); the tokenizer falls back to the recorded source directory, or give
``--tokenizer_dir``. For a dist checkpoint written elsewhere, pass ``--hf_config path/to/config.json``.
One process loads the checkpoint unsharded (peak memory ≈ the model once + one shard);
``torchrun --nproc-per-node TP*PP ... --tp TP --pp PP`` loads it sharded and gathers tensor by tensor.

A training run (its directory, its ``checkpoints/`` directory or one ``iter_N`` in it): the student
is rebuilt from the run's ``config.yaml`` and base model (``--base_model`` when the run's
``model.hf_dir`` is elsewhere here), the checkpoint's adapters (or weights) are loaded, and the
student is written as a HF model with every LoRA adapter merged into its base weight (what vLLM
serves, what ``eval_avg_at_k.py --model`` takes), or with ``--adapter_only`` as a PEFT adapter
(``adapter_config.json`` + ``adapter_model.safetensors``, for ``--model BASE --adapter A``). A run
saved at TP x PP > 1 converts under ``torchrun --nproc-per-node TP*PP``. Writes ``OUT.tmp`` and
renames it when complete; an existing ``--out_dir`` is refused.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from ..commands import command, process_rank, tool_config
from ..config_errors import check_choice, check_positive, fail
from ..input_files import missing_base_model, missing_checkpoint_dir, missing_dir, missing_file
from ..models.choices import DTYPE_SPELLINGS, as_dtype
from ..output_files import new_dir_problem


@dataclass
class McoreToHf:
    """What to export, and how."""

    mcore_dir: str
    """Megatron-Core dist checkpoint directory (hf_to_mcore's), or a training run: its directory (the
    latest checkpoint), its checkpoints directory, or one checkpoint (runs/x/checkpoints/iter_0000100)."""
    out_dir: str
    """New directory for the HF checkpoint (or the PEFT adapter)."""
    adapter_only: bool = False
    """Training run with LoRA: write the PEFT adapter instead of the merged model."""
    base_model: str | None = None
    """Training run: the base HF model directory it was trained from; None: the run's model.hf_dir."""
    run_config: str | None = None
    """Training run: its config.yaml; None: found in the run directory above the checkpoint."""
    tokenizer_dir: str | None = None
    """Take the tokenizer files from here; None: the checkpoint's own (or its recorded source)."""
    hf_config: str | None = None
    """HF config.json, for model checkpoints without our metadata."""
    dtype: str | None = None
    """dtype of the written weights (the HF model, or the PEFT adapter): bf16 | fp16 | fp32 (or bfloat16 |
    float16 | float32); None: the stored one (a run's: model.dtype)."""
    max_shard_size_gb: float = 2.0
    """safetensors shard size in GiB."""
    tp: int = 1
    """TP size when launched with torchrun (model checkpoints; a run's checkpoint uses its own layout)."""
    pp: int = 1
    """PP size when launched with torchrun (model checkpoints; a run's checkpoint uses its own layout)."""

    def __post_init__(self) -> None:
        if self.dtype is not None:
            check_choice("dtype", self.dtype, DTYPE_SPELLINGS)
        check_positive("max_shard_size_gb", self.max_shard_size_gb)
        check_positive("tp", self.tp)   # 0 was accepted, and ignored in one process
        check_positive("pp", self.pp)


def _missing_input(args: McoreToHf) -> tuple[str, str] | None:
    """``(flag, why)`` for the first path given that cannot be read, None when each can: the optional ones too (a
    mistyped --tokenizer_dir or --hf_config was ignored for a training run, or an errno line without the flag after
    torch loaded). --base_model: the export's own first check (``missing_base_model``); its weights and tokenizer the
    export checks."""
    checks = (("mcore_dir", args.mcore_dir, missing_checkpoint_dir), ("base_model", args.base_model, missing_base_model),
              ("tokenizer_dir", args.tokenizer_dir, missing_dir), ("run_config", args.run_config, missing_file),
              ("hf_config", args.hf_config, missing_file))
    return next(((key, why) for key, path, missing in checks if path is not None and (why := missing(path))), None)


def convert(argv: list[str], quiet: bool) -> int:
    args = tool_config(McoreToHf, argv, __doc__, quiet)
    if args is None:
        return 0
    key, why = _missing_input(args) or ("out_dir", new_dir_problem(args.out_dir))
    if why:   # before torch and Megatron load (seconds), not after
        raise fail(key, why)
    from ..errors import as_config_error

    try:
        return _convert(args)
    except (FileNotFoundError, FileExistsError) as err:  # "mcore_dir: ...", "out_dir: ...": named as the flags
        raise as_config_error(err, ("mcore_dir", "out_dir", "tokenizer_dir")) or err from None


def _convert(args: McoreToHf) -> int:
    from ..errors import ConfigError
    from ..training.export import export_run_checkpoint, find_run_checkpoint

    dtype = as_dtype(args.dtype) if args.dtype else None
    shard_bytes = int(args.max_shard_size_gb * (1 << 30))
    run = find_run_checkpoint(args.mcore_dir, args.run_config)
    if run is not None:
        export_run_checkpoint(run, args.out_dir, adapter=args.adapter_only, base_model=args.base_model, dtype=dtype,
                              max_shard_bytes=shard_bytes)
        what = "PEFT adapter" if args.adapter_only else "HF model (LoRA merged)" if run.cfg.lora.enabled else "HF model"
        if process_rank() == 0:  # under torchrun: once
            print(f"wrote {os.path.abspath(args.out_dir)}: the {what} of {run.path} (step {run.iteration})")
        return 0
    if args.adapter_only:
        raise ConfigError("adapter_only", f"{args.mcore_dir} is a model checkpoint, not a training run: it has no "
                                          "adapter")
    from ..convert.checkpoints import convert_mcore_to_hf
    from ..errors import InputFileError
    from ..input_files import read_json

    hf_config = read_json(args.hf_config) if args.hf_config else None
    if args.hf_config and not isinstance(hf_config, dict):   # was a TypeError traceback
        raise InputFileError(args.hf_config, "expected a JSON object (a HF config.json)")
    try:
        convert_mcore_to_hf(args.mcore_dir, args.out_dir, tokenizer_dir=args.tokenizer_dir, hf_config=hf_config,
                            dtype=dtype, tp=args.tp, pp=args.pp, max_shard_bytes=shard_bytes)
    except InputFileError as err:   # the config is named by its file, not as "hf_config"
        if err.path != "hf_config":
            raise
        raise InputFileError(args.hf_config, err.detail) from None
    if process_rank() == 0:
        print(f"wrote {os.path.abspath(args.out_dir)}")
    return 0


main = command(convert)


if __name__ == "__main__":  # dist-checkpoint loading may spawn helper processes: keep this guard
    sys.exit(main())
