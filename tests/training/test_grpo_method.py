"""GRPO's method pieces with the real Qwen3 tokenizer: gold answers at load, the official reward on real
completions, advantages per group (over every engine group's samples), the rank / micro-batch split of
advantages and sampler log-probs, the metrics, the schedule's epoch and the settings refused in one line."""

from types import SimpleNamespace

import pytest
import torch

from phf_megatron.data import PromptConfig
from phf_megatron.data.rows import BadRowError, MathRow
from phf_megatron.data.toy import toy_row
from phf_megatron.errors import ConfigError
from phf_megatron.objectives.grpo import group_advantages
from phf_megatron.tokenizer import load_qwen3_tokenizer
from phf_megatron.training.batches import build_microbatches, grpo_microbatches, local_samples
from phf_megatron.training.config_io import load_config
from phf_megatron.training.methods.grpo import GrpoMethod, check_gold_answers
from phf_megatron.training.methods.grpo import is_truncated as method_is_truncated
from phf_megatron.training.rollouts import StepRequests, StepSamples
from phf_megatron.training.schedule import steps_per_epoch
from phf_megatron.training.step_plan import StepPlan, StepPlanner

ROWS = [toy_row(12, 19), toy_row(31, 40)]  # answers "1" and "1"
#: completions of the two prompts (G = 2 each): the first group's rewards differ, the second's do not
TEXTS = ["<think>12 + 19 = 31 so \\boxed{7}</think> The last digit is \\boxed{1}.",
         "<think>\\boxed{1}</think> so \\boxed{ 2 }",
         "no box at all",
         "</think> \\boxed{1"]  # unbalanced: no answer
REWARDS = [1.0, 0.0, 0.0, 0.0]


@pytest.fixture(scope="module")
def tok():
    return load_qwen3_tokenizer()


def _method(tok, *flags, gather=None):
    cfg = load_config(None, ["--method=grpo", "--rollout.n=2", "--training.global_batch_size=4",
                             "--training.micro_batch_size=1", "--rollout.top_k=0", "--rollout.top_p=1.0",
                             "--training.packing=false", *flags])
    method = GrpoMethod(cfg, SimpleNamespace(chunks=[torch.nn.Linear(1, 1)]))
    method.eos_token_ids = frozenset({tok.convert_tokens_to_ids("<|im_end|>")})
    method.driver = SimpleNamespace(gather=gather or (lambda obj: [obj]))
    return cfg, method


def _round(tok, method, cfg, group=range(2), texts=TEXTS):
    planner = StepPlanner(cfg, None, tok, PromptConfig(), 1, row_inputs=method.row_inputs)
    pairs = [method.row_inputs(tok, r, PromptConfig()) for r in ROWS]
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    completions = {i: tok.encode(texts[i], add_special_tokens=False) + ([im_end] if i != 2 else [])
                   for i in range(group.start * 2, group.stop * 2)}
    plan = StepPlan(0, [0, 1], ROWS, pairs, StepRequests(0, [p.student_ids for p in pairs], [True] * 4))
    samples = StepSamples(0, 0, completions=completions,
                          logprobs={i: [-0.5 - 0.01 * t for t in range(len(c))] for i, c in completions.items()})
    return method.training_samples(planner, plan, samples, group)


def test_gold_answers_and_one_line_for_rows_without_one():
    check_gold_answers([MathRow("p", "so \\boxed{\\frac{1}{2}}", None, "a.jsonl:1"), ROWS[0]])
    bad = [MathRow("p", "no box", None, "a.jsonl:3"), MathRow("p", "\\boxed{}", None, "a.jsonl:4"), ROWS[0]]
    with pytest.raises(BadRowError) as err:
        check_gold_answers(bad)
    line = str(err.value)
    assert line.startswith("a.jsonl:3: no gold answer for the GRPO reward") and "(and 1 more row(s): a.jsonl:4)" in line
    assert "\n" not in line


def test_rewards_of_real_completions_and_group_advantages(tok):
    cfg, method = _method(tok)
    pairs, completions = _round(tok, method, cfg)
    assert all(p.student_ids == p.teacher_ids for p in pairs)  # the student prompt on both sides
    rnd = method.round
    assert rnd.rewards.tolist() == REWARDS
    torch.testing.assert_close(rnd.advantages, group_advantages(torch.tensor(REWARDS, dtype=torch.float64), 2),
                               rtol=0, atol=0)
    assert rnd.advantages[0] > 0 > rnd.advantages[1] and rnd.advantages[2:].tolist() == [0.0, 0.0]
    assert rnd.truncated.tolist() == [False, False, True, False]  # the one without <|im_end|>
    metrics = method.step_metrics()
    assert metrics["reward"] == 0.25 and metrics["accuracy"] == 0.25 and metrics["grpo_truncated"] == 1
    assert metrics["frac_reward_zero_std"] == 0.5
    assert metrics["reward_std"] == pytest.approx(float(torch.tensor([1.0, 0.0]).std()) / 2)


def test_batch_scaling_and_groups_from_other_engines(tok):
    """Each rank rewards its engine group's samples; the gather gives every rank the whole step's, and
    ``scale_rewards=batch`` takes the std of all of them."""
    other = {2: (1.0, False), 3: (1.0, False)}  # engine group 1's samples, rewarded on its ranks
    cfg, method = _method(tok, "--grpo.scale_rewards=batch", gather=lambda mine: [mine, other])
    _round(tok, method, cfg, group=range(1))
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    assert method.round.rewards.tolist() == rewards.tolist()
    torch.testing.assert_close(method.round.advantages, group_advantages(rewards, 2, "batch"), rtol=0, atol=0)


@pytest.mark.parametrize("dp_rank", [0, 1])
def test_advantages_and_sampler_logps_follow_the_rank_and_micro_batch_split(tok, monkeypatch, dp_rank):
    from megatron.core import parallel_state as ps

    monkeypatch.setattr(ps, "get_data_parallel_rank", lambda *a, **k: dp_rank)
    monkeypatch.setattr(ps, "get_data_parallel_world_size", lambda *a, **k: 2)
    cfg, method = _method(tok)
    pairs, completions = _round(tok, method, cfg)
    mbs = build_microbatches(pairs, completions, pad_id=tok.pad_token_id, micro_batch_size=1, dp_rank=dp_rank,
                             dp_size=2, pad_multiple=1, make=method.microbatches)
    local = local_samples(4, dp_rank, 2)
    assert len(mbs) == len(local) == 2
    for mb, i in zip(mbs, local):
        assert mb.advantages.tolist() == [float(method.round.advantages[i])]
        assert mb.score_tokens.tolist() == completions[i]  # scored: the completion, EOS included
        assert mb.sampler_logps[mb.scored].tolist() == pytest.approx([-0.5 - 0.01 * t for t in range(len(completions[i]))])
        assert float(mb.sampler_logps[~mb.scored].abs().sum()) == 0.0


@pytest.mark.parametrize("dp_size", [1, 2])
def test_a_token_budget_gives_each_micro_batch_its_own_samples_advantages(tok, dp_size):
    """``training.max_tokens_per_microbatch``: the plan reorders and regroups the step's samples (longest first,
    balanced over ranks); every micro-batch carries the advantages, completions and sampler log-probs of the
    samples the plan put in it, not of the rank's contiguous slice."""
    from phf_megatron.training.microbatch_plan import token_budget_plan

    cfg, method = _method(tok, "--training.packing", "--training.max_tokens_per_microbatch=200")
    pairs, completions = _round(tok, method, cfg)
    lengths = [len(p.student_ids) + len(c) for p, c in zip(pairs, completions)]
    plan = token_budget_plan(lengths, lengths, dp_size=dp_size, max_tokens=200)
    order = [i for r in range(dp_size) for i in plan.local_samples(r)]
    assert order != list(range(4))  # the plan is not the contiguous split: the test can tell them apart
    for rank in range(dp_size):
        mbs = build_microbatches(pairs, completions, pad_id=tok.pad_token_id, micro_batch_size=1, dp_rank=rank,
                                 dp_size=dp_size, pad_multiple=1, make=method.microbatches, max_tokens=200)
        assert [mb.num_sequences for mb in mbs] == [len(m) for m in plan.microbatches(rank)]
        for mb, samples in zip(mbs, plan.microbatches(rank)):
            assert mb.advantages.tolist() == [float(method.round.advantages[i]) for i in samples]
            assert mb.score_tokens.tolist() == [t for i in samples for t in completions[i]]
            want = [-0.5 - 0.01 * t for i in samples for t in range(len(completions[i]))]
            assert mb.sampler_logps[mb.scored].tolist() == pytest.approx(want)


def test_packed_microbatches_carry_the_padded_samples(tok, monkeypatch):
    """``--training.packing``: each micro-batch one row of its samples back to back, with the same scored
    tokens, sampler log-probs (per sample: the per-sample grid), advantages and counts as the padded ones."""
    from megatron.core import parallel_state as ps

    monkeypatch.setattr(ps, "get_data_parallel_rank", lambda *a, **k: 0)
    monkeypatch.setattr(ps, "get_data_parallel_world_size", lambda *a, **k: 1)
    cfg, method = _method(tok, "--training.packing", "--training.micro_batch_size=2")
    pairs, completions = _round(tok, method, cfg)
    build = dict(pad_id=tok.pad_token_id, micro_batch_size=2, dp_rank=0, dp_size=1, pad_multiple=1)
    packed = build_microbatches(pairs, completions, make=method.microbatches, **build)
    cfg.training.packing = False
    padded = build_microbatches(pairs, completions, make=method.microbatches, **build)
    assert len(packed) == len(padded) == 2
    for p, q in zip(packed, padded):
        assert (p.batch_size, q.batch_size, p.num_sequences) == (1, 2, 2) and p.layout.packed
        assert p.student_tokens.shape[1] == int(p.layout.lengths.sum())  # no pipeline: each its own length
        assert p.score_tokens.tolist() == q.score_tokens.tolist() and p.num_tokens == q.num_tokens
        assert p.sampler_logps[p.scored].tolist() == q.sampler_logps[q.scored].tolist()
        assert p.advantages.tolist() == q.advantages.tolist() and p.num_items == q.num_items
        assert p.grid_shape == (2, int(p.layout.lengths.max())) and q.grid_shape == tuple(q.student_tokens.shape)
    cfg.training.packing, cfg.model.pipeline_model_parallel_size = True, 2  # a pipeline sends one size
    piped = build_microbatches(pairs, completions, make=method.microbatches, **build)
    lengths = [int(p.layout.lengths.sum()) for p in packed]
    assert lengths[0] != lengths[1] and [p.student_tokens.shape[1] for p in piped] == [max(lengths)] * 2


def test_masked_truncated_completions_still_count_for_dapo(tok):
    cfg, method = _method(tok, "--grpo.mask_truncated_completions=true")
    pairs, completions = _round(tok, method, cfg)
    batch_mbs = build_microbatches(pairs, completions, pad_id=tok.pad_token_id, micro_batch_size=2, dp_rank=0,
                                   dp_size=1, pad_multiple=1, make=lambda b, m, samples: grpo_microbatches(
                                       b, m, method.round.advantages, None, method.round.truncated))
    second = batch_mbs[1]  # samples 2 (truncated) and 3
    assert not bool(second.scored[0].any()) and second.num_tokens == len(completions[3])
    assert second.num_items == len(completions[2]) + len(completions[3])


def test_an_epoch_counts_each_rollout_batch_num_iterations_times():
    assert steps_per_epoch(29434, 4, iterations=1) == 7359  # 32 completions of G = 8: 4 prompts a step
    assert steps_per_epoch(29434, 4, iterations=2) == 2 * 7359


@pytest.mark.parametrize("flags,expected", [
    (("--rollout.n=1",), "--rollout.n: 1: --method=grpo compares G >= 2 completions per prompt"),
    (("--rollout.n=3",), "--training.global_batch_size: 4 rollouts do not split into prompts of rollout.n = 3"),
    (("--data.reason_first",), "--data.reason_first: is a PHF teacher option; --method=grpo has no teacher"),
    (("--teacher.ema_start=after_first_step",), "--teacher.ema_start: after_first_step: --method=grpo has no teacher"),
    (("--rollout.lmbda=0.5",), "--rollout.lmbda: 0.5: --method=grpo trains on its rollouts only"),
    (("--rollout.async_steps=1",), "--rollout.async_steps: is not supported with --method=grpo"),
    (("--ablation=opsd_only",), "--ablation: opsd_only is an ablation of PHF's loss; --method=grpo has no"),
    (("--checkpoint.save_interval=3",), "--checkpoint.save_interval: 3 is not a multiple of grpo.num_iterations = 2"),
    (("--training.train_iters=5",), "--training.train_iters: 5 is not a multiple of grpo.num_iterations = 2"),
    (("--rollout.sync_interval=2",), "--rollout.sync_interval: 2: --method=grpo pushes the weights"),
    (("--grpo.beta=0.04", "--lora.enabled=false"), "--grpo.beta: 0.04: the KL reference is the base model"),
    (("--grpo.vllm_importance_sampling_correction=true", "--rollout.top_k=20"),
     "--grpo.vllm_importance_sampling_correction: compares the engine's log-probs after top-k / top-p"),
    (("--grpo.loss_type=cispo",), "--grpo.loss_type: must be one of grpo, bnpo, dr_grpo, dapo"),
])
def test_bad_grpo_settings_are_one_line(flags, expected):
    with pytest.raises(ConfigError) as err:
        load_config(None, ["--method=grpo", "--rollout.n=2", "--training.global_batch_size=4", "--rollout.top_k=0",
                           "--rollout.top_p=1.0", "--training.train_iters=4", "--checkpoint.save_interval=2", *flags])
    assert err.value.line.startswith(expected) and "\n" not in err.value.line, err.value.line


def _trl_completion_mask(completions, eos_id, pad_id, mask_truncated):
    """TRL 0.26 ``GRPOTrainer._generate_and_score_completions`` on vLLM's completions (grpo_trainer.py:1783-1799):
    ones over each completion's sampled ids, right-padded with 0; ``mask_truncated_completions`` zeroes a
    completion whose last id is neither ``eos_token_id`` nor ``pad_token_id``."""
    width = max(len(c) for c in completions)
    mask = [[1] * len(c) + [0] * (width - len(c)) for c in completions]
    if mask_truncated:
        mask = [row if c[-1] in (eos_id, pad_id) else [0] * width for row, c in zip(mask, completions)]
    return mask


@pytest.mark.parametrize("mask_truncated", [False, True])
def test_every_sampled_token_is_scored_as_trl_does_a_final_pad_id_too(tok, mask_truncated):
    """Qwen3's engines stop on <|im_end|> and on <|endoftext|> (its pad id): TRL scores that final pad id as
    any sampled token; so does the GRPO batch (the PHF batch leaves it out, as official OPSD)."""
    im_end, pad = tok.convert_tokens_to_ids("<|im_end|>"), tok.pad_token_id
    assert pad == tok.convert_tokens_to_ids("<|endoftext|>") != im_end == tok.eos_token_id
    cfg, method = _method(tok)
    method.eos_token_ids = frozenset({im_end, pad})
    body = [tok.encode(t, add_special_tokens=False) for t in ("so \\boxed{1}", "maybe \\boxed{2}", "12 + 19 is 3")]
    completions = [body[0] + [im_end], body[1] + [pad], body[2], body[0] + [pad]]  # the third: cut at max_tokens
    pairs = [method.row_inputs(tok, ROWS[i // 2], PromptConfig()) for i in range(4)]
    truncated = torch.tensor([method_is_truncated(c, method.eos_token_ids) for c in completions])
    assert truncated.tolist() == [False, False, True, False]
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=torch.float64)
    mbs = build_microbatches(pairs, completions, pad_id=pad, micro_batch_size=1, dp_rank=0, dp_size=1,
                             pad_multiple=1, make=lambda b, m, samples: grpo_microbatches(
                                 b, m, advantages[samples], None, truncated[samples] if mask_truncated else None))
    want = _trl_completion_mask(completions, im_end, pad, mask_truncated)
    for mb, c, row in zip(mbs, completions, want):
        assert mb.score_tokens.tolist() == [t for t, m in zip(c, row) if m]
        assert mb.num_tokens == sum(row) and (mb.num_items or mb.num_tokens) == (len(c) if mask_truncated else sum(row))
