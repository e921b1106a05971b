"""The step breakdown's pass/fail rule (``--check``), per method."""

from benchmarks.train_step_breakdown import step_checks

SYNCED = dict(time_sync_s=0.5, sync_probe_diff=0.07)


def test_a_zero_gradient_passes_only_where_every_grpo_group_drew_one_reward():
    assert step_checks([dict(grad_norm=0.0, frac_reward_zero_std=1.0, **SYNCED)])["ok"]      # all advantages 0
    assert not step_checks([dict(grad_norm=0.0, frac_reward_zero_std=0.5, **SYNCED)])["ok"]
    assert not step_checks([dict(grad_norm=0.0, **SYNCED)])["ok"]                            # PHF: never
    assert not step_checks([dict(grad_norm=float("nan"), frac_reward_zero_std=1.0, **SYNCED)])["ok"]


def test_the_probe_is_required_where_a_sync_ran_and_sft_has_none():
    grpo_round = [dict(grad_norm=1.0, **SYNCED), dict(grad_norm=1.0)]          # num_iterations 2: one sync a round
    assert step_checks(grpo_round)["ok"]
    assert not step_checks([dict(grad_norm=1.0, time_sync_s=0.5, sync_probe_diff=None)])["ok"]
    assert not step_checks([dict(grad_norm=1.0)])["ok"]                        # rollouts, yet no sync at all
    assert step_checks([dict(grad_norm=1.0)], synced=False)["ok"]             # SFT
