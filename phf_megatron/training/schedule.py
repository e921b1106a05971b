"""The learning-rate schedule: Megatron's ``OptimizerParamScheduler`` with the official OPSD span.

The paper's schedule (cosine, ``num_train_epochs=30``, no warm-up; the official scripts at 7448751
set no ``lr_scheduler_type``, so TRL 0.26's GOLDConfig keeps HF's linear default: README "Recipe",
``--optimizer.lr_decay_style=linear``) decays over ``num_train_epochs * steps_per_epoch`` steps, with
``steps_per_epoch = ceil(rows / global_batch_size)`` (29,434 rows / 32 -> 920 -> 27,600 steps),
and a watcher stops the run at step 100, so the learning rate barely moves (5e-6 -> ~5e-6 x
0.99997). Megatron's cosine with ``min_lr = 0`` is the same curve as HF's:

    lr(s) = min_lr + (lr - min_lr) * 0.5 * (1 + cos(pi * (s - warmup) / (decay - warmup)))

Steps here count optimizer updates (``scheduler.step(1)`` after each), not samples as in
Megatron's ``pretrain_gpt.py``. ``lr(0)`` is the first update's rate, as in HF.
"""

from __future__ import annotations

import math

from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

from ..config_errors import fail
from ..errors import UserError
from .config import OptimizerConfig, TrainConfig


def steps_per_epoch(num_rows: int, rows_per_step: int, iterations: int = 1) -> int:
    """Optimizer steps in one pass over the data (the last, short batch counts, as in HF).

    ``rows_per_step`` is the number of dataset rows (prompts) one rollout batch reads:
    ``TrainConfig.prompts_per_step`` = ``global_batch_size / rollout.n`` (``global_batch_size``
    counts completions; with ``rollout.n = G`` completions per prompt a step reads G times fewer rows).
    ``iterations``: optimizer steps per rollout batch (``grpo.num_iterations``, TRL's mu: its
    sampler repeats each generation batch mu times), so an epoch is mu times as many steps.
    """
    if iterations < 1:
        raise ValueError(f"iterations: must be >= 1, got {iterations}")
    if num_rows <= 0:
        raise ValueError(f"num_rows: the dataset is empty ({num_rows} rows)")
    if rows_per_step <= 0:
        raise ValueError(f"rows_per_step: must be > 0, got {rows_per_step}")
    return math.ceil(num_rows / rows_per_step) * iterations


def lr_decay_iters(optim: OptimizerConfig, rows_per_step: int, num_rows: int, iterations: int = 1) -> int:
    """The cosine's length in steps: ``optimizer.lr_decay_iters`` or epochs x steps per epoch."""
    if optim.lr_decay_iters is not None:
        decay = optim.lr_decay_iters
    else:
        decay = math.ceil(optim.num_train_epochs * steps_per_epoch(num_rows, rows_per_step, iterations))
    if decay <= optim.lr_warmup_iters:
        raise fail("optimizer.lr_decay_iters", f"the schedule spans {decay} steps, not more than "
                   f"lr_warmup_iters = {optim.lr_warmup_iters}")
    return decay


def megatron_optimizer_config(cfg: TrainConfig, **overrides):
    """Megatron's ``OptimizerConfig`` (AdamW) from the run's settings.

    Megatron copies ``lr`` / ``min_lr`` into every param group as ``max_lr`` / ``min_lr``, and
    its scheduler reads them from there, so they must come from the same place as the schedule.
    ``bf16`` follows ``model.dtype`` (fp32 master weights for bf16 parameters); ``overrides`` go
    straight to Megatron (e.g. ``bf16=False`` when the trainable adapters are kept in fp32).
    """
    from megatron.core.optimizer import OptimizerConfig as MegatronOptimizerConfig

    o = cfg.optimizer
    values = dict(
        optimizer="adam", lr=o.lr, min_lr=o.min_lr, weight_decay=o.weight_decay, adam_beta1=o.adam_beta1,
        adam_beta2=o.adam_beta2, adam_eps=o.adam_eps, clip_grad=o.clip_grad,
        use_distributed_optimizer=o.use_distributed_optimizer,
        loss_scale=o.loss_scale, initial_loss_scale=o.initial_loss_scale, min_loss_scale=o.min_loss_scale,
        loss_scale_window=o.loss_scale_window, hysteresis=o.hysteresis,
        bf16=cfg.model.dtype == "bfloat16", fp16=cfg.model.dtype == "float16",
    )
    values.update(overrides)
    return MegatronOptimizerConfig(**values)


def _check_param_groups(optimizer, optim: OptimizerConfig) -> None:
    for i, group in enumerate(optimizer.param_groups):
        for key, want in (("max_lr", optim.lr), ("min_lr", optim.min_lr)):
            if key in group and group[key] != want:
                raise ValueError(f"optimizer param group {i}: {key} = {group[key]!r} but the schedule uses "
                                 f"{want!r}; build the Megatron optimizer with megatron_optimizer_config(cfg)")


def build_scheduler(optimizer, optim: OptimizerConfig, rows_per_step: int, num_rows: int,
                    iterations: int = 1) -> OptimizerParamScheduler:
    """Megatron's scheduler over ``optimizer.param_groups`` (a Megatron or a torch optimizer).

    It sets ``lr`` of every param group at construction (step 0); call ``.step(1)`` after each
    optimizer update. Weight decay is held constant at ``optim.weight_decay``. Its
    ``state_dict()`` goes into the checkpoint.
    """
    _check_param_groups(optimizer, optim)
    decay = lr_decay_iters(optim, rows_per_step, num_rows, iterations)
    return OptimizerParamScheduler(
        optimizer,
        init_lr=0.0 if optim.lr_warmup_iters > 0 else optim.lr,
        max_lr=optim.lr,
        min_lr=optim.min_lr,
        lr_warmup_steps=optim.lr_warmup_iters,
        lr_decay_steps=decay,
        lr_decay_style=optim.lr_decay_style,
        start_wd=optim.weight_decay,
        end_wd=optim.weight_decay,
        wd_incr_steps=decay,
        wd_incr_style="constant",
        use_checkpoint_opt_param_scheduler=False,  # a resumed run must carry the same schedule
    )


def current_lr(scheduler: OptimizerParamScheduler) -> float:
    """The learning rate the next update uses (first param group's)."""
    return float(scheduler.optimizer.param_groups[0]["lr"])


_SCHEDULE_KEYS = ("max_lr", "min_lr", "lr_warmup_steps", "lr_decay_steps", "lr_decay_style")


def load_scheduler_state(scheduler: OptimizerParamScheduler, state: dict) -> None:
    """Restore the step count; raise ``UserError`` (one line) if the checkpoint's schedule differs.

    (Megatron's own check is an ``assert``; this names the differing values and the cause.)
    """
    current = scheduler.state_dict()
    diffs = [f"{k}: checkpoint {state.get(k)!r}, now {current[k]!r}" for k in _SCHEDULE_KEYS if state.get(k) != current[k]]
    if diffs:
        raise UserError("the learning-rate schedule differs from the checkpoint's (optimizer.* settings, "
                         "training.global_batch_size, rollout.n, or the dataset's row count): " + "; ".join(diffs))
    scheduler.num_steps = 0  # Megatron's load adds the saved count to the current one
    scheduler.load_state_dict(state)
