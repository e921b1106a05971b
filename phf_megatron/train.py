"""Train with OPSD + PHF on Megatron-Core.

    python -m phf_megatron.train --config configs/tiny_cpu.yaml --model.hf_dir DIR --data.path FILE
    torchrun --nproc-per-node 8 -m phf_megatron.train --config configs/phf_qwen3_8b.yaml \\
        --model.hf_dir /models/Qwen3-8B --data.path siyanzhao/Openthoughts_math_30k_opsd
    python -m phf_megatron.train --help                                  # every setting
    python -m phf_megatron.train --config configs/phf_qwen3_8b.yaml --help   # with the preset's values
    python -m phf_megatron.train --config configs/phf_qwen3_8b.yaml --lr 1e-5 --print-config

Any config field can be overridden as ``--section.field=value`` (the sections: ``training/config.py``,
``training/config_sections.py``, ``lora/config.py``, ``rollout/config.py``, ``objectives/config.py``);
``--ablation NAME`` selects one of the paper's ablations (opsd_only, local_only, direction_only, geometry_only, pointwise_mse, selected_layers). A wrong setting is one
line, ``error: --flag: ...``, printed by rank 0, and exit code 2.
"""

from __future__ import annotations

import os
import sys

from .commands import command


def train(argv: list[str], quiet: bool = True) -> int:
    """Parse (no torch imported yet: ``--help`` and setting errors are immediate), then train."""
    from .cli import wants_help
    from .commands import NOTES_SAID, launch_world, process_rank, require_torchrun_under_srun
    from .training.config_io import config_and_note, help_text, split_argv, to_yaml, with_checkpoint_holdout

    def say(note: str | None) -> None:
        if note and process_rank() == 0 and os.environ.get(NOTES_SAID) != "1":
            print(note, file=sys.stderr, flush=True)

    if wants_help(argv):
        print(help_text(__doc__, argv))   # after --config C: C's values as the defaults
        return 0
    path, print_config, overrides = split_argv(argv)
    cfg, note = config_and_note(path, overrides)
    say(note)   # a run's config.yaml read in another run directory than it records
    cfg, note = with_checkpoint_holdout(cfg)   # a resume of a run saved before data.holdout_fraction: printed too
    say(note)
    if print_config:
        if (world := launch_world()) is not None:   # torchrun's, or a launcher's (examples/launch_phf.sh: NGPU x
            cfg.check_world_size(world[1])        # NNODES ranks); without RANK the run is one process (process_group)
        if process_rank() == 0:
            print(to_yaml(cfg), end="")
        return 0
    require_torchrun_under_srun()
    if quiet:  # before anything imports torch (the finished-run check below does; require_inputs may)
        from .startup import quiet_start

        quiet_start(cfg.logging.verbose)
    cfg.require_inputs()
    from .training.stop_signal import ignoring, stopping_at_once   # (imports no torch)

    trainer, started = None, False
    try:
        with stopping_at_once(cfg.checkpoint, cfg.save_dir):  # a preemption before the first step: one line
            from .training.export import finished_step, outputs_message

            if (step := finished_step(cfg)) is not None:
                if process_rank() == 0:
                    print(f"phf_megatron.train: {cfg.run_dir} is finished (step {step} of "
                          f"{cfg.training.train_iters}): nothing to train; raise --training.train_iters to go on. "
                          f"The run's outputs:\n{outputs_message(cfg, step)}", flush=True)
                return 0
            from .training.checkpoint import require_checkpoint

            require_checkpoint(cfg)
            from .training.loop import Trainer

            started = True  # from here the process group may be up: shut down below
            trainer = Trainer(cfg)
        return trainer.run()  # 0, or 128 + signal number: stopped by checkpoint.exit_signal (saved)
    finally:
        with ignoring(cfg.checkpoint):  # a signal in the teardown does not take the place of the run's end (its error)
            if trainer is not None:
                trainer.close()
            if started:
                from .training.distributed import shutdown_distributed

                shutdown_distributed()


main = command(train)

if __name__ == "__main__":
    sys.exit(main())
