"""The GRPO reference (``objectives.grpo``) equals a float64 transcription of TRL 0.26.0 (``trl_grpo.py``).

Loss and gradient w.r.t. the per-token log-probs, for every loss type (grpo, bnpo, dr_grpo, dapo),
``num_iterations`` 1 (old = current, every ratio 1) and 2 (old log-probs differ, both clip sides
hit), the vLLM correction off and in each of its four modes (some tokens and sequences over the
cap), token- and sequence-level ratios, KL on and off. Advantages: every ``scale_rewards``, a group
with equal rewards, ties, and the single-completion group TRL refuses. Tolerances: float64 sums of
a few dozen terms in a different order, 1e-12 relative.
"""

import itertools

import pytest
import torch

from phf_megatron.objectives import grpo
from tests.objectives.trl_grpo import trl_advantages, trl_args, trl_compute_loss, trl_vllm_is_ratio

B, T, G = 6, 7, 3
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
IS_MODES = (None, "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
#: (beta, use_bias_correction_kl, delta): no KL; k3 KL; KL times the ratio with the two-sided clip
KL_VARIANTS = ((0.0, False, None), (0.04, False, None), (0.04, True, 1.5))


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([7, 5, 1, 6, 0, 3])                     # one empty completion (mask all False)
    mask = torch.arange(T)[None] < lengths[:, None]
    logps = -3 * torch.rand(B, T, generator=g, dtype=torch.float64)
    old2 = logps + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    ref = logps + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)
    drift = 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)
    drift[0] += 0.4                                                # sequence 0: exp(sum) > 3 (over the cap)
    drift[3, 2] = 1.5                                              # one token over the cap (exp(1.5) > 3)
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.5, 0.5, 0.5], dtype=torch.float64)
    return dict(mask=mask, logps=logps, old2=old2, ref=ref, drift=drift, rewards=rewards)


def _case(data, loss_type, iterations, mode, level, beta, kl_corr, delta, ga=3, procs=2):
    """(ours, TRL's) loss and d loss / d logps."""
    mask, maskf = data["mask"], data["mask"].to(torch.float64)
    adv = grpo.group_advantages(data["rewards"], G)
    old = data["old2"] if iterations == 2 else (data["logps"].clone() if mode else None)
    old_for_is = data["logps"] if old is None else old
    sampler = old_for_is - data["drift"]
    num_items, max_len = float(mask.sum()) * 4, T + 3              # the generation batch's tokens; L_max
    args = trl_args(loss_type=loss_type, epsilon_low=0.2, epsilon_high=0.28, delta=delta, beta=beta,
                    importance_sampling_level=level, use_bias_correction_kl=kl_corr,
                    vllm_importance_sampling_correction=mode is not None,
                    vllm_importance_sampling_mode=mode or "sequence_mask", vllm_importance_sampling_cap=3.0,
                    current_gradient_accumulation_steps=ga, max_completion_length=max_len, num_processes=procs)
    inputs = dict(completion_mask=maskf, advantages=adv, ref_per_token_logps=data["ref"], num_items_in_batch=num_items)
    if old is not None:
        inputs["old_per_token_logps"] = old
    if mode:
        inputs["importance_sampling_ratio"] = trl_vllm_is_ratio(old_for_is, sampler, maskf, args)

    x_trl = data["logps"].clone().requires_grad_()
    ref_loss = trl_compute_loss(x_trl, inputs, args)
    x = data["logps"].clone().requires_grad_()
    is_ratio = grpo.vllm_importance_ratio(old_for_is, sampler, mask, mode, 3.0) if mode else None
    loss = grpo.grpo_loss(x, old, adv, mask, loss_type=loss_type, grad_accum_steps=ga, max_completion_length=max_len,
                          num_items=num_items, num_processes=procs, epsilon_low=0.2, epsilon_high=0.28, delta=delta,
                          level=level, is_ratio=is_ratio, beta=beta, ref_logps=data["ref"], kl_is_correction=kl_corr)
    return (loss, *torch.autograd.grad(loss, x)), (ref_loss, *torch.autograd.grad(ref_loss, x_trl))


@pytest.mark.parametrize("mode", IS_MODES)
@pytest.mark.parametrize("iterations", [1, 2])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_loss_and_gradient_equal_trl(loss_type, iterations, mode):
    data = _batch()
    for level, (beta, kl_corr, delta) in itertools.product(grpo.IS_LEVELS, KL_VARIANTS):
        (loss, grad), (ref_loss, ref_grad) = _case(data, loss_type, iterations, mode, level, beta, kl_corr, delta)
        where = f"level={level} beta={beta} kl_corr={kl_corr} delta={delta}"
        torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=1e-15, msg=where)
        torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-15, msg=where)
        assert float(grad.abs().sum()) > 0, where
        assert not bool(grad[~data["mask"]].any()), where          # padding carries no gradient


def test_the_batch_exercises_clips_and_caps():
    """The fixture is not vacuous: at iteration 2 both clip sides bind somewhere, and each vLLM
    mode changes some ratio (token and sequence over the cap)."""
    data = _batch()
    ratio = torch.exp(data["logps"] - data["old2"])[data["mask"]]
    assert bool((ratio < 0.8).any()) and bool((ratio > 1.28).any())
    old, sampler = data["old2"], data["old2"] - data["drift"]
    seq = grpo.vllm_importance_ratio(old, sampler, data["mask"], "sequence_mask", 3.0)
    assert seq.shape == (B, 1) and (seq[:, 0] == 0).tolist() == [True, False, False, True, False, False]
    trunc = grpo.vllm_importance_ratio(old, sampler, data["mask"], "sequence_truncate", 3.0)
    assert float(trunc[0, 0]) == 3.0
    tok = grpo.vllm_importance_ratio(old, sampler, data["mask"], "token_mask", 3.0)
    assert tok.shape == (B, T) and float(tok[3, 2]) == 0.0
    assert float(grpo.vllm_importance_ratio(old, sampler, data["mask"], "token_truncate", 3.0)[3, 2]) == 3.0
    assert bool((tok[~data["mask"]] == 1).all())                   # masked positions: ratio exp(0)


def test_first_iteration_is_the_plain_policy_gradient():
    """num_iterations 1: w = 1, so l = -A and d L / d logp = -A * weight (no clip can bind)."""
    data = _batch()
    adv = grpo.group_advantages(data["rewards"], G)
    x = data["logps"].clone().requires_grad_()
    loss = grpo.grpo_loss(x, None, adv, data["mask"], loss_type="grpo")
    (grad,) = torch.autograd.grad(loss, x)
    weights = grpo.token_weights(data["mask"], "grpo")
    torch.testing.assert_close(grad, -adv[:, None] * weights, rtol=1e-14, atol=0)
    torch.testing.assert_close(loss, -(adv[:, None] * weights).sum(), rtol=1e-14, atol=1e-16)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_how_the_step_depends_on_the_micro_batches(loss_type):
    """The step's gradient (sum over GA micro-batches, mean over P processes) for 8 completions of
    unequal lengths, split as 1 x 8, 2 x 4 and 4 x 2: the same for grpo, dr_grpo and dapo; bnpo's
    per-micro-batch token mean makes it depend on the split (the module docstring)."""
    g = torch.Generator().manual_seed(3)
    n, t = 8, 9
    mask = torch.arange(t)[None] < torch.tensor([9, 2, 5, 7, 1, 8, 3, 6])[:, None]
    logps = -2 * torch.rand(n, t, generator=g, dtype=torch.float64)
    old = logps + 0.3 * torch.randn(n, t, generator=g, dtype=torch.float64)
    adv = grpo.group_advantages(torch.rand(n, generator=g, dtype=torch.float64), 4)
    grads = []
    for procs, ga in ((1, 1), (2, 2), (1, 4)):
        x = logps.clone().requires_grad_()
        size = n // (procs * ga)
        total = 0
        for p in range(procs):                                      # each process: its GA micro-batches
            for k in range(ga):
                rows = slice((p * ga + k) * size, (p * ga + k + 1) * size)
                total = total + grpo.grpo_loss(x[rows], old[rows], adv[rows], mask[rows], loss_type=loss_type,
                                               grad_accum_steps=ga, max_completion_length=t,
                                               num_items=float(mask.sum()), num_processes=procs) / procs
        grads.append(torch.autograd.grad(total, x)[0])
    same = [torch.allclose(grads[0], other, rtol=1e-12, atol=1e-15) for other in grads[1:]]
    assert same == ([False, False] if loss_type == "bnpo" else [True, True]), same


# ----------------------------------------------------------------------------- advantages


@pytest.mark.parametrize("scale", grpo.SCALE_REWARDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_advantages_equal_trl(scale, dtype):
    """Binary rewards with ties, a group of equal rewards (all 1), a group of equal rewards (all 0)
    and a mixed group; and continuous rewards."""
    for rewards in (torch.tensor([1, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 0], dtype=dtype),
                    torch.randn(16, generator=torch.Generator().manual_seed(1)).to(dtype)):
        ours = grpo.group_advantages(rewards, 4, scale)
        theirs = trl_advantages(rewards, trl_args(scale_rewards=scale, num_generations=4))
        torch.testing.assert_close(ours, theirs, rtol=1e-12 if dtype == torch.float64 else 1e-6, atol=0)


def test_equal_rewards_give_zero_advantage_and_ties_equal_ones():
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    for scale in grpo.SCALE_REWARDS:                               # centred per group, whatever the scale
        adv = grpo.group_advantages(rewards, 4, scale)
        assert bool((adv[:4] == 0).all()), scale                   # std 0: 0 / (0 + 1e-4) = 0, not NaN
        assert float(adv[5]) == float(adv[6]) > 0 and float(adv[4]) == float(adv[7]) < 0
    adv = grpo.group_advantages(rewards, 4, "group")               # (1 - 0.5) / (std + 1e-4), std = 1/sqrt(3)
    assert abs(float(adv[5]) - 0.5 / (3 ** -0.5 + 1e-4)) < 1e-14


@pytest.mark.filterwarnings("ignore:std.*degrees of freedom")
def test_a_single_completion_per_group_is_refused_as_trl_does():
    """TRL's GRPOConfig refuses num_generations < 2; its unbiased std of one reward is NaN."""
    rewards = torch.tensor([1.0, 0.0, 1.0])
    assert bool(torch.isnan(trl_advantages(rewards, trl_args(num_generations=1))).all())
    with pytest.raises(ValueError, match="group_size: GRPO needs at least 2 completions"):
        grpo.group_advantages(rewards, 1)


@pytest.mark.parametrize("call, message", [
    (lambda: grpo.group_advantages(torch.zeros(7), 2), "rewards: 7 rewards are not whole groups of 2"),
    (lambda: grpo.group_advantages(torch.zeros(4), 2, "std"), "scale_rewards: must be one of"),
    (lambda: grpo.token_weights(torch.ones(2, 3, dtype=torch.bool), "cispo"), "loss_type: must be one of"),
    (lambda: grpo.token_weights(torch.ones(2, 3, dtype=torch.bool), "dr_grpo"), "max_completion_length"),
    (lambda: grpo.token_weights(torch.ones(2, 3, dtype=torch.bool), "dapo"), "num_items"),
    (lambda: grpo.vllm_importance_ratio(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool),
                                        "seq"), "mode: must be one of"),
    (lambda: grpo.grpo_token_loss(torch.zeros(2, 3), None, torch.zeros(2), torch.ones(2, 3, dtype=torch.bool),
                                 beta=0.1), "ref_logps: required when beta"),
    (lambda: grpo.log_importance_weights(torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), "sequence"),
     "mask: expected a bool tensor"),
])
def test_bad_arguments_are_one_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()
