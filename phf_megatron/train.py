"""Train with OPSD + PHF on Megatron-Core.

    python -m phf_megatron.train --config configs/tiny_cpu.yaml --model.hf_dir DIR --data.path FILE
    torchrun --nproc-per-node 8 -m phf_megatron.train --config configs/phf_qwen3_8b.yaml \\
        --model.hf_dir /models/Qwen3-8B --data.path siyanzhao/Openthoughts_math_30k_opsd

Any config field can be overridden as ``--section.field=value`` (see ``training/config.py``);
``--ablation NAME`` selects one of the paper's ablations (opsd_only, local_only, direction_only,
geometry_only, pointwise_mse, selected_layers).
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    from .training.config_io import config_from_argv
    from .training.distributed import shutdown_distributed
    from .training.loop import Trainer

    cfg = config_from_argv(sys.argv[1:] if argv is None else argv)
    trainer = Trainer(cfg)
    try:
        trainer.run()
    finally:
        trainer.close()
        shutdown_distributed()


if __name__ == "__main__":
    main()
