"""Convert a Megatron-Core dist checkpoint of Qwen3 to a Hugging Face checkpoint.

    python tools/convert/mcore_to_hf.py --mcore-dir ckpt/qwen3-1.7b-mcore --out-dir Qwen3-1.7B-export \
        [--tokenizer-dir Qwen3-1.7B] [--dtype bf16|fp32] [--max-shard-size-gb 2]

Writes safetensors shards + index, ``config.json`` and the tokenizer files, loadable by
``transformers`` and vLLM. The HF config and tokenizer come from the checkpoint (stored by
``hf_to_mcore.py``); the tokenizer falls back to the recorded source directory, or give
``--tokenizer-dir``. For a dist checkpoint written elsewhere (e.g. by training), pass
``--hf-config path/to/config.json``. One process loads the checkpoint unsharded (peak memory ≈
the model once + one shard); ``torchrun --nproc-per-node TP*PP ... --tp TP --pp PP`` loads it
sharded and gathers tensor by tensor. Writes ``OUT.tmp`` and renames it when complete.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from phf_megatron.convert.checkpoints import convert_mcore_to_hf  # noqa: E402
from phf_megatron.models.config import as_dtype  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mcore-dir", required=True, help="Megatron-Core dist checkpoint directory")
    p.add_argument("--out-dir", required=True, help="new directory for the HF checkpoint")
    p.add_argument("--tokenizer-dir", default=None, help="take the tokenizer files from here")
    p.add_argument("--hf-config", default=None, help="HF config.json, for checkpoints without our metadata")
    p.add_argument("--dtype", choices=["bf16", "fp32", "fp16"], default=None,
                   help="dtype of the HF weights (default: the stored one)")
    p.add_argument("--max-shard-size-gb", type=float, default=2.0, help="safetensors shard size")
    p.add_argument("--tp", type=int, default=1, help="TP size when launched with torchrun")
    p.add_argument("--pp", type=int, default=1, help="PP size when launched with torchrun")
    args = p.parse_args(argv)
    hf_config = None
    if args.hf_config:
        with open(args.hf_config) as f:
            hf_config = json.load(f)
    convert_mcore_to_hf(args.mcore_dir, args.out_dir, tokenizer_dir=args.tokenizer_dir, hf_config=hf_config,
                        dtype=as_dtype(args.dtype) if args.dtype else None, tp=args.tp, pp=args.pp,
                        max_shard_bytes=int(args.max_shard_size_gb * (1 << 30)))
    print(f"wrote {os.path.abspath(args.out_dir)}")


if __name__ == "__main__":  # dist-checkpoint loading may spawn helper processes: keep this guard
    main()
