"""The PHF trainer: config, LoRA, EMA teacher, loop, checkpoints, metrics and diagnostics."""
