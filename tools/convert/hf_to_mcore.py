"""Convert a Hugging Face Qwen3 checkpoint to a Megatron-Core dist checkpoint.

    python tools/convert/hf_to_mcore.py --hf-dir Qwen3-1.7B --out-dir ckpt/qwen3-1.7b-mcore \
        [--tp 2] [--pp 2] [--dtype bf16|fp32]

One process is enough: the checkpoint is saved unsharded with Megatron's ShardedTensor metadata
and loads under any TP/PP (``--tp/--pp`` are checked against the model and recorded as the
intended layout). ``torchrun --nproc-per-node TP*PP tools/convert/hf_to_mcore.py ...`` writes the
same checkpoint from a truly sharded model. On a GPU machine the model is built on the GPU; set
``CUDA_VISIBLE_DEVICES=`` to convert on the CPU. Peak memory ≈ the model once in ``--dtype``.
Writes ``OUT.tmp`` and renames it to ``OUT`` when complete. Also stores the HF config and
tokenizer files (for ``mcore_to_hf.py``).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from phf_megatron.convert.checkpoints import convert_hf_to_mcore  # noqa: E402
from phf_megatron.models.config import as_dtype  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hf-dir", required=True, help="HF checkpoint directory (config.json + safetensors)")
    p.add_argument("--out-dir", required=True, help="new directory for the Megatron dist checkpoint")
    p.add_argument("--tp", type=int, default=1, help="intended tensor-parallel size (checked)")
    p.add_argument("--pp", type=int, default=1, help="intended pipeline-parallel size (checked)")
    p.add_argument("--dtype", choices=["bf16", "fp32", "fp16"], default=None,
                   help="stored dtype (default: the HF checkpoint's)")
    args = p.parse_args(argv)
    convert_hf_to_mcore(args.hf_dir, args.out_dir, tp=args.tp, pp=args.pp,
                        dtype=as_dtype(args.dtype) if args.dtype else None)
    print(f"wrote {os.path.abspath(args.out_dir)}")


if __name__ == "__main__":  # dist-checkpoint saving spawns helper processes: keep this guard
    main()
