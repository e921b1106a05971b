"""The learning-rate schedule against the closed-form cosine, with the official span."""

from __future__ import annotations

import math

import pytest
import torch

from phf_megatron.training.config import OptimizerConfig, RolloutConfig, TrainConfig, TrainingConfig
from phf_megatron.training.schedule import (
    build_scheduler, current_lr, load_scheduler_state, lr_decay_iters, megatron_optimizer_config, steps_per_epoch,
)

OFFICIAL_ROWS = 29_434  # siyanzhao/Openthoughts_math_30k_opsd


def closed_form_cosine(step: int, lr: float, min_lr: float, decay_steps: int) -> float:
    """HF's get_cosine_schedule_with_warmup (no warm-up), floored at min_lr."""
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * step / decay_steps))


def _optimizer() -> torch.optim.Optimizer:
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(3))], lr=123.0)


def test_official_span_is_thirty_epochs_of_ceil_rows_over_batch():
    assert steps_per_epoch(OFFICIAL_ROWS, 32) == 920  # 919 full batches + 1 short one
    cfg = TrainConfig()
    assert lr_decay_iters(cfg.optimizer, cfg.prompts_per_step, OFFICIAL_ROWS) == 27_600


def test_lr_at_steps_0_50_100_matches_closed_form():
    cfg = TrainConfig()
    opt = _optimizer()
    sched = build_scheduler(opt, cfg.optimizer, cfg.prompts_per_step, OFFICIAL_ROWS)
    seen = {0: current_lr(sched)}
    for step in range(1, cfg.training.train_iters + 1):
        opt.step()
        sched.step(1)
        seen[step] = current_lr(sched)
    for step in (0, 50, 100):
        assert seen[step] == pytest.approx(closed_form_cosine(step, 5e-6, 0.0, 27_600), rel=1e-13, abs=0)
    assert seen[0] == 5e-6  # the first update uses the peak rate
    assert seen[100] == pytest.approx(5e-6 * 0.99996762, rel=1e-7)  # 100 of 27,600 steps: barely decayed


def test_short_schedule_reaches_min_lr_and_stays():
    optim = OptimizerConfig(lr=1e-3, min_lr=1e-5, lr_decay_iters=100)
    opt = _optimizer()
    sched = build_scheduler(opt, optim, TrainConfig().prompts_per_step, OFFICIAL_ROWS)
    lrs = [current_lr(sched)]
    for _ in range(120):
        sched.step(1)
        lrs.append(current_lr(sched))
    for step in (0, 25, 50, 75, 100):
        assert lrs[step] == pytest.approx(closed_form_cosine(step, 1e-3, 1e-5, 100), rel=1e-13)
    assert lrs[50] == pytest.approx((1e-3 + 1e-5) / 2, rel=1e-13)
    assert lrs[110] == 1e-5


def test_warmup_is_linear_from_zero():
    optim = OptimizerConfig(lr=1e-3, lr_warmup_iters=10, lr_decay_iters=110)
    sched = build_scheduler(_optimizer(), optim, TrainConfig().prompts_per_step, OFFICIAL_ROWS)
    lrs = [current_lr(sched)]
    for _ in range(20):
        sched.step(1)
        lrs.append(current_lr(sched))
    assert lrs[0] == 0.0 and lrs[5] == pytest.approx(5e-4) and lrs[10] == pytest.approx(1e-3)
    assert lrs[20] == pytest.approx(closed_form_cosine(10, 1e-3, 0.0, 100), rel=1e-13)


def test_scheduler_state_round_trip_and_mismatch():
    cfg = TrainConfig()
    sched = build_scheduler(_optimizer(), cfg.optimizer, cfg.prompts_per_step, OFFICIAL_ROWS)
    for _ in range(37):
        sched.step(1)
    state = sched.state_dict()
    fresh_opt = _optimizer()
    fresh = build_scheduler(fresh_opt, cfg.optimizer, cfg.prompts_per_step, OFFICIAL_ROWS)
    fresh.step(5)  # a non-fresh scheduler must still land on the saved step
    load_scheduler_state(fresh, state)
    assert fresh.num_steps == 37 and current_lr(fresh) == current_lr(sched)
    other = build_scheduler(_optimizer(), cfg.optimizer, cfg.prompts_per_step, 1000)  # another dataset size
    with pytest.raises(ValueError, match=r"lr_decay_steps: checkpoint 27600, now 960"):
        load_scheduler_state(other, state)


def test_megatron_param_groups_must_agree_with_the_schedule():
    cfg = TrainConfig()
    mcfg = megatron_optimizer_config(cfg)
    assert (mcfg.lr, mcfg.min_lr, mcfg.clip_grad, mcfg.weight_decay, mcfg.bf16) == (5e-6, 0.0, 0.1, 0.0, True)
    assert (mcfg.adam_beta1, mcfg.adam_beta2, mcfg.adam_eps) == (0.9, 0.999, 1e-8)
    opt = _optimizer()
    opt.param_groups[0]["max_lr"], opt.param_groups[0]["min_lr"] = 5e-6, None  # Megatron's default min_lr
    with pytest.raises(ValueError, match=r"min_lr = None but the schedule uses 0.0.*megatron_optimizer_config"):
        build_scheduler(opt, cfg.optimizer, cfg.prompts_per_step, OFFICIAL_ROWS)


def test_empty_dataset_is_an_error():
    with pytest.raises(ValueError, match="num_rows: the dataset is empty"):
        steps_per_epoch(0, 32)


def test_epoch_counts_prompts_not_completions():
    """With rollout.n = G completions per prompt, a step reads global_batch_size / G rows: the
    epoch (and so the cosine's span) is G times longer in steps than a count of completions gives."""
    cfg = TrainConfig(training=TrainingConfig(global_batch_size=32), rollout=RolloutConfig(n=8))
    assert cfg.prompts_per_step == 4
    assert lr_decay_iters(cfg.optimizer, cfg.prompts_per_step, OFFICIAL_ROWS) == 30 * math.ceil(OFFICIAL_ROWS / 4)
    one = TrainConfig(training=TrainingConfig(global_batch_size=32), rollout=RolloutConfig(n=1))
    assert lr_decay_iters(one.optimizer, one.prompts_per_step, OFFICIAL_ROWS) == 27_600  # n = 1: unchanged
