"""Convert a Megatron-Core dist checkpoint of Qwen3 to a Hugging Face checkpoint.

    python tools/convert/mcore_to_hf.py --mcore_dir ckpt/qwen3-1.7b-mcore --out_dir Qwen3-1.7B-export \\
        [--tokenizer_dir Qwen3-1.7B] [--dtype bf16|fp32] [--max_shard_size_gb 2]
    phf-mcore-to-hf ...                       # the same command, installed by pip

Writes safetensors shards + index, ``config.json`` and the tokenizer files, loadable by
``transformers`` and vLLM. The HF config and tokenizer come from the checkpoint (stored by
``hf_to_mcore.py``); the tokenizer falls back to the recorded source directory, or give
``--tokenizer_dir``. For a dist checkpoint written elsewhere (e.g. by training), pass
``--hf_config path/to/config.json``. One process loads the checkpoint unsharded (peak memory ≈
the model once + one shard); ``torchrun --nproc-per-node TP*PP ... --tp TP --pp PP`` loads it
sharded and gathers tensor by tensor. Writes ``OUT.tmp`` and renames it when complete.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from ..cli import command, tool_config
from ..config_errors import _check_positive, check_choice

DTYPES = ("bf16", "fp16", "fp32")


@dataclass
class McoreToHf:
    """What to export, and how."""

    mcore_dir: str
    """Megatron-Core dist checkpoint directory."""
    out_dir: str
    """New directory for the HF checkpoint."""
    tokenizer_dir: str | None = None
    """Take the tokenizer files from here; None: the checkpoint's own (or its recorded source)."""
    hf_config: str | None = None
    """HF config.json, for checkpoints without our metadata."""
    dtype: str | None = None
    """dtype of the HF weights: bf16 | fp16 | fp32; None: the stored one."""
    max_shard_size_gb: float = 2.0
    """safetensors shard size in GiB."""
    tp: int = 1
    """TP size when launched with torchrun."""
    pp: int = 1
    """PP size when launched with torchrun."""

    def __post_init__(self) -> None:
        if self.dtype is not None:
            check_choice("dtype", self.dtype, DTYPES)
        _check_positive("max_shard_size_gb", self.max_shard_size_gb)


def convert(argv: list[str], quiet: bool) -> int:
    args = tool_config(McoreToHf, argv, __doc__, quiet)
    if args is None:
        return 0
    from ..convert.checkpoints import convert_mcore_to_hf
    from ..input_files import read_json
    from ..models.config import as_dtype

    hf_config = read_json(args.hf_config) if args.hf_config else None
    convert_mcore_to_hf(args.mcore_dir, args.out_dir, tokenizer_dir=args.tokenizer_dir, hf_config=hf_config,
                        dtype=as_dtype(args.dtype) if args.dtype else None, tp=args.tp, pp=args.pp,
                        max_shard_bytes=int(args.max_shard_size_gb * (1 << 30)))
    print(f"wrote {os.path.abspath(args.out_dir)}")
    return 0


main = command(convert)


if __name__ == "__main__":  # dist-checkpoint loading may spawn helper processes: keep this guard
    sys.exit(main())
