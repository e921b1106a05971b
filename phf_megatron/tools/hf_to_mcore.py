"""Convert a Hugging Face Qwen3 checkpoint to a Megatron-Core dist checkpoint.

    python tools/convert/hf_to_mcore.py --hf_dir Qwen3-1.7B --out_dir ckpt/qwen3-1.7b-mcore \\
        [--tp 2] [--pp 2] [--dtype bf16|fp32]
    phf-hf-to-mcore ...                       # the same command, installed by pip

One process is enough: the checkpoint is saved unsharded with Megatron's ShardedTensor metadata
and loads under any TP/PP (``--tp/--pp`` are checked against the model and recorded as the
intended layout). ``torchrun --nproc-per-node TP*PP tools/convert/hf_to_mcore.py ...`` writes the
same checkpoint from a truly sharded model. On a GPU machine the model is built on the GPU; set
``CUDA_VISIBLE_DEVICES=`` to convert on the CPU. Peak memory ≈ the model once in ``--dtype``.
Writes ``OUT.tmp`` and renames it to ``OUT`` when complete. Also stores the HF config and
tokenizer files (for ``mcore_to_hf.py``); a ``--hf_dir`` without tokenizer files (``tokenizer.json``,
or ``vocab.json`` and ``merges.txt``: a ``tokenizer_config.json`` alone is no tokenizer) is refused
unless ``--require_tokenizer=false``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from ..commands import command, tool_config
from ..config_errors import check_choice, fail
from ..errors import as_config_error
from ..input_files import missing_hf_config
from ..models import choices
from ..models.qwen3_arch import Qwen3Arch
from ..output_files import new_dir_problem


@dataclass
class HfToMcore:
    """What to convert, and how."""

    hf_dir: str
    """HF checkpoint directory (config.json + safetensors)."""
    out_dir: str
    """New directory for the Megatron dist checkpoint."""
    tp: int = 1
    """Intended tensor-parallel size (checked against the heads, query groups, FFN and vocabulary)."""
    pp: int = 1
    """Intended pipeline-parallel size (checked against the number of layers)."""
    dtype: str | None = None
    """Stored dtype: bf16 | fp16 | fp32 (or bfloat16 | float16 | float32); None: the HF checkpoint's."""
    require_tokenizer: bool = True
    """Refuse a --hf_dir without tokenizer files (mcore_to_hf copies them into the export); false:
    convert anyway and give mcore_to_hf --tokenizer_dir."""

    def __post_init__(self) -> None:
        if self.dtype is not None:
            check_choice("dtype", self.dtype, choices.DTYPE_SPELLINGS)


def _check_layout(args: HfToMcore) -> None:
    """--tp / --pp against the model's config.json, before torch loads (~0.1 s, was ~5 s): one line naming the flag;
    a config.json it cannot read is left to the converter, which names the file."""
    try:
        arch = Qwen3Arch.from_hf(args.hf_dir)
    except ValueError:
        return
    try:
        arch.check_layout(args.tp, args.pp)
    except ValueError as err:   # "tp: ..." / "pp: ..."
        raise as_config_error(err, ("tp", "pp")) or err from None


def convert(argv: list[str], quiet: bool) -> int:
    args = tool_config(HfToMcore, argv, __doc__, quiet)
    if args is None:
        return 0
    for key, why in (("hf_dir", missing_hf_config(args.hf_dir)), ("out_dir", new_dir_problem(args.out_dir))):
        if why:   # before torch and Megatron load (seconds), not after
            raise fail(key, why)
    _check_layout(args)
    from ..convert.checkpoints import convert_hf_to_mcore

    try:
        convert_hf_to_mcore(args.hf_dir, args.out_dir, tp=args.tp, pp=args.pp,
                            dtype=choices.as_dtype(args.dtype) if args.dtype else None,
                            require_tokenizer=args.require_tokenizer)
    except (FileNotFoundError, FileExistsError) as err:  # "hf_dir: ...", "out_dir: ...": named as the flags
        raise as_config_error(err, ("hf_dir", "out_dir")) or err from None
    print(f"wrote {os.path.abspath(args.out_dir)}")
    return 0


main = command(convert)


if __name__ == "__main__":  # dist-checkpoint saving spawns helper processes: keep this guard
    sys.exit(main())
