"""The micro-batch planner: every sample exactly once, the budget kept, LPT's 4/3 bound against a
brute-force optimum, one deterministic plan, and the fixed mode equal to the trainer's split today."""

import itertools
import random

import pytest

from phf_megatron.errors import ConfigError
from phf_megatron.training.batches import build_microbatches
from phf_megatron.training.microbatch_plan import (fixed_plan, microbatch_tokens, plan_microbatches, sample_cost,
                                                   token_budget_plan)
from phf_megatron.data import PromptPair

from ..helpers import run_python


def random_lengths(seed: int, n: int, longest: int = 400) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    student = [rng.randint(1, longest) for _ in range(n)]
    return student, [s + rng.randint(1, longest) for s in student]


def assert_partition(plan, n: int) -> None:
    seen = sorted(i for r in range(plan.dp_size) for mb in plan.microbatches(r) for i in mb)
    assert seen == list(range(n))
    assert all(len(mb) > 0 for r in plan.ranks for mb in r)


CASES = [(seed, n, dp, layout, m) for seed in range(6) for n, dp in ((5, 1), (16, 4), (33, 8))
         for layout in ("packed", "padded") for m in (1, 2)]


@pytest.mark.parametrize("seed,n,dp,layout,m", CASES)
def test_every_sample_once_and_every_microbatch_within_the_budget(seed, n, dp, layout, m):
    student, teacher = random_lengths(seed, n)
    budget = 900
    plan = token_budget_plan(student, teacher, dp_size=dp, max_tokens=budget, layout=layout, pad_multiple=m)
    assert plan.dp_size == dp and all(len(r) >= 1 for r in plan.ranks)
    assert_partition(plan, n)
    for r in plan.ranks:
        for mb in r:
            assert list(mb) == sorted(mb)
            assert microbatch_tokens([student[i] for i in mb], layout, m) <= budget
            assert microbatch_tokens([teacher[i] for i in mb], layout, m) <= budget


def test_token_accounting_by_hand():
    assert microbatch_tokens([3, 5, 4], "packed", 1) == 12
    assert microbatch_tokens([3, 5, 4], "packed", 4) == 12 and microbatch_tokens([3, 5, 5], "packed", 4) == 16
    assert microbatch_tokens([3, 5, 4], "padded", 1) == 15
    assert microbatch_tokens([3, 5, 4], "padded", 2) == 18
    assert microbatch_tokens([], "packed") == 0
    assert sample_cost(10, 30) == 60
    with pytest.raises(ValueError, match="layout"):
        microbatch_tokens([1], "thd")


def brute_force_makespan(costs: list[int], bins: int) -> int:
    best = sum(costs)
    for assignment in itertools.product(range(bins), repeat=len(costs)):
        loads = [0] * bins
        for c, b in zip(costs, assignment):
            loads[b] += c
        best = min(best, max(loads))
    return best


@pytest.mark.parametrize("seed", range(25))
def test_rank_balance_within_lpt_bound_of_the_optimum(seed):
    rng = random.Random(1000 + seed)
    dp, n = rng.choice([2, 3]), rng.randint(4, 8)
    student, teacher = random_lengths(seed, n, longest=rng.choice([20, 300]))
    plan = token_budget_plan(student, teacher, dp_size=dp, max_tokens=10_000)
    costs = [sample_cost(s, t) for s, t in zip(student, teacher)]
    makespan = max(sum(costs[i] for i in plan.local_samples(r)) for r in range(dp))
    opt = brute_force_makespan(costs, dp)
    assert opt <= makespan <= (4 / 3 - 1 / (3 * dp)) * opt + 1e-9


def test_lpt_on_grahams_tight_case_is_exactly_at_the_bound():
    # costs 30, 30, 20, 20, 20 on 2 ranks: the optimum is 60 (30+30 | 20+20+20), LPT gives 70 = (4/3 - 1/6)·60
    plan = token_budget_plan([1, 1, 1, 1, 1], [27, 27, 17, 17, 17], dp_size=2, max_tokens=100)
    loads = sorted(sum(sample_cost(1, [27, 27, 17, 17, 17][i]) for i in plan.local_samples(r)) for r in range(2))
    assert loads == [50, 70] and brute_force_makespan([30, 30, 20, 20, 20], 2) == 60


def test_equal_costs_go_round_robin_by_index():
    plan = token_budget_plan([10] * 8, [30] * 8, dp_size=4, max_tokens=80)
    assert plan.ranks == (((0, 4),), ((1, 5),), ((2, 6),), ((3, 7),))


def test_a_long_sample_gets_a_microbatch_of_its_own_and_the_short_ones_share():
    student = [50, 900, 60, 40, 70]
    teacher = [100, 1000, 120, 80, 140]
    plan = token_budget_plan(student, teacher, dp_size=1, max_tokens=1000)
    assert plan.microbatches(0) == ((1,), (0, 2, 3, 4))


def test_first_fit_decreasing_fills_the_earliest_microbatch_that_fits():
    # decreasing cost: 0 (600), 1 (500), 2 (400), 3 (300), 4 (100): 0 opens, 1 opens, 2 -> #0 (1000), 3 -> #1, 4 -> #1
    plan = token_budget_plan([600, 500, 400, 300, 100], [600, 500, 400, 300, 100], dp_size=1, max_tokens=1000)
    assert plan.microbatches(0) == ((0, 2), (1, 3, 4))


def test_padded_accounting_counts_the_longest_times_the_count():
    # packed: 600 + 300 + 100 fits in 1000; padded: 3 x 600 does not, 2 x 600 does
    s = [600, 300, 100]
    assert token_budget_plan(s, s, dp_size=1, max_tokens=1000).microbatches(0) == ((0, 1, 2),)
    assert token_budget_plan(s, s, dp_size=1, max_tokens=1200, layout="padded").microbatches(0) == ((0, 1), (2,))


def test_a_sample_over_the_budget_alone_is_one_line_naming_it_and_the_setting():
    with pytest.raises(ConfigError) as err:
        token_budget_plan([100, 200, 300], [150, 1201, 400], dp_size=1, max_tokens=1200)
    assert err.value.key == "training.max_tokens_per_microbatch"
    assert "sample 1" in err.value.line and "1201 teacher tokens" in err.value.line and "\n" not in err.value.line
    with pytest.raises(ConfigError, match="sample 0 alone needs 8 student"):   # rounded up to TP=4
        token_budget_plan([7], [5], dp_size=1, max_tokens=7, pad_multiple=4)


def test_a_budget_with_several_engine_groups_is_one_line():
    """With ``rollout.num_engines`` > 1 a rank holds only its group's samples (the others are None): the step's
    plan cannot be made, and the budget says so in one line naming the setting."""
    pairs = [PromptPair(student_ids=[1, 2], teacher_ids=[1, 2, 3]), None]
    with pytest.raises(ConfigError) as err:
        build_microbatches(pairs, [[4], None], pad_id=0, micro_batch_size=1, dp_rank=0, dp_size=1, pad_multiple=1,
                           max_tokens=64)
    assert err.value.key == "training.max_tokens_per_microbatch" and "rollout.num_engines" in err.value.line
    assert "\n" not in err.value.line


def test_wrong_inputs_are_refused():
    with pytest.raises(ValueError, match="per data-parallel rank"):
        token_budget_plan([1, 2], [1, 2], dp_size=4, max_tokens=10)
    with pytest.raises(ValueError, match="teacher_lengths"):
        token_budget_plan([1, 2], [1], dp_size=1, max_tokens=10)
    with pytest.raises(ConfigError, match="positive"):
        token_budget_plan([1], [1], dp_size=1, max_tokens=0)
    with pytest.raises(ValueError, match=">= 1"):
        token_budget_plan([0], [1], dp_size=1, max_tokens=10)


def test_the_plan_does_not_depend_on_the_hash_seed():
    code = ("from phf_megatron.training.microbatch_plan import token_budget_plan; import random; "
            "r = random.Random(7); s = [r.randint(1, 50) for _ in range(40)]; t = [x + r.randint(1, 50) for x in s]; "
            "print(token_budget_plan(s, t, dp_size=4, max_tokens=300).ranks)")
    outs = {run_python(["-c", code], PYTHONHASHSEED=h, timeout=60).stdout for h in ("0", "1", "12345")}
    assert len(outs) == 1 and outs.pop().startswith("((")


def test_fixed_mode_is_a_partition_in_order():
    plan = fixed_plan(12, dp_size=3, micro_batch_size=2)
    assert plan.ranks == (((0, 1), (2, 3)), ((4, 5), (6, 7)), ((8, 9), (10, 11)))
    assert_partition(plan, 12)
    with pytest.raises(ConfigError, match="training.global_batch_size"):
        fixed_plan(10, dp_size=3, micro_batch_size=1)
    with pytest.raises(ConfigError, match="training.micro_batch_size"):
        fixed_plan(12, dp_size=3, micro_batch_size=3)


@pytest.mark.parametrize("n,dp,mbs", [(8, 2, 2), (12, 3, 4), (6, 1, 3), (8, 4, 1)])
def test_fixed_mode_equals_the_trainers_split(n, dp, mbs):
    """``build_microbatches`` (the trainer's builder) on samples that each start with their own
    token: the rows of each micro-batch it builds are the samples the fixed plan names, in order."""
    rng = random.Random(n * 100 + dp)
    pairs = [PromptPair(student_ids=[1000 + i] + [5] * rng.randint(0, 4), teacher_ids=[2000 + i] + [6] * rng.randint(0, 9))
             for i in range(n)]
    completions = [[7 + i] * rng.randint(1, 6) for i in range(n)]
    plan = fixed_plan(n, dp_size=dp, micro_batch_size=mbs)
    for rank in range(dp):
        mbs_built = build_microbatches(pairs, completions, pad_id=0, micro_batch_size=mbs, dp_rank=rank, dp_size=dp,
                                       pad_multiple=1, window_budget=8)
        built = [tuple(int(row[0]) - 1000 for row in mb.student_tokens) for mb in mbs_built]
        assert built == [tuple(mb) for mb in plan.microbatches(rank)]
        assert [tuple(int(row[0]) - 2000 for row in mb.teacher_tokens) for mb in mbs_built] == built


@pytest.mark.parametrize("n,dp,mbs", [(8, 3, 1), (8, 2, 3)])
def test_fixed_mode_refuses_what_the_trainers_split_refuses(n, dp, mbs):
    pairs, completions = [PromptPair([1], [2])] * n, [[3]] * n
    with pytest.raises(ValueError) as builder:
        build_microbatches(pairs, completions, pad_id=0, micro_batch_size=mbs, dp_rank=0, dp_size=dp, pad_multiple=1,
                           window_budget=8)
    with pytest.raises(ConfigError) as planner:
        fixed_plan(n, dp_size=dp, micro_batch_size=mbs)
    assert str(builder.value).split(":")[0] == planner.value.key


def test_one_call_picks_the_mode_by_the_budget():
    student, teacher = random_lengths(3, 12)
    assert plan_microbatches(student, teacher, dp_size=3, micro_batch_size=2) == fixed_plan(12, dp_size=3,
                                                                                          micro_batch_size=2)
    assert plan_microbatches(student, teacher, dp_size=3, micro_batch_size=2, max_tokens=900, layout="padded",
                             pad_multiple=2) == token_budget_plan(student, teacher, dp_size=3, max_tokens=900,
                                                                  layout="padded", pad_multiple=2)


@pytest.mark.parametrize("dp,multiple", [(1, 1), (2, 1), (3, 2)])
def test_budget_mode_is_what_the_trainers_builder_builds(dp, multiple):
    """``build_microbatches(max_tokens=...)`` with SFT's packed micro-batches: each rank's micro-batches hold the
    samples the budget plan names (in its order, each its own packed segment), within the budget."""
    from phf_megatron.training.batches import Packing, sft_microbatches

    rng = random.Random(dp)
    prompts = [[1000 + i] + [5] * rng.randint(0, 6) for i in range(12)]
    pairs = [PromptPair(student_ids=p, teacher_ids=p) for p in prompts]      # SFT: one sequence per sample
    completions = [[7] * rng.randint(1, 9) for _ in range(12)]
    lengths = [len(p.student_ids) + len(c) for p, c in zip(pairs, completions)]
    plan = token_budget_plan(lengths, lengths, dp_size=dp, max_tokens=24, pad_multiple=multiple)
    make = lambda batch, sizes, samples: sft_microbatches(batch, sizes, loss_on_prompt=False,  # noqa: E731
                                                          packing=Packing(True, multiple))
    for rank in range(dp):
        built = build_microbatches(pairs, completions, pad_id=0, micro_batch_size=2, dp_rank=rank, dp_size=dp,
                                   pad_multiple=multiple, make=make, max_tokens=24)
        assert [tuple(int(mb.student_tokens[0, s]) - 1000 for s in mb.layout.start) for mb in built] == \
            [tuple(mb) for mb in plan.microbatches(rank)]
        assert all(int(mb.layout.lengths.sum()) <= 24 and mb.layout.seq_len % multiple == 0 for mb in built)


def test_the_builder_names_the_sample_over_the_budget_by_its_origin():
    pairs, completions = [PromptPair([1] * 3, [1] * 3), PromptPair([1] * 30, [1] * 30)], [[2], [2]]
    with pytest.raises(ConfigError) as err:
        build_microbatches(pairs, completions, pad_id=0, micro_batch_size=1, dp_rank=0, dp_size=1, pad_multiple=1,
                           max_tokens=16, origins=["train.jsonl:4", "train.jsonl:9"])
    assert err.value.key == "training.max_tokens_per_microbatch"
    assert "sample 1 (train.jsonl:9) alone needs 31 student tokens, over the budget of 16" in err.value.line


def _planner(flags, dp):
    from phf_megatron.data import PromptConfig, load_qwen3_tokenizer
    from phf_megatron.data.toy import toy_row
    from phf_megatron.training.config_io import load_config
    from phf_megatron.training.step_plan import StepPlanner

    cfg = load_config(None, ["--method=phf", "--rollout.n=1", "--training.global_batch_size=8", *flags])
    rows = [toy_row(10 + a, 17 + a) for a in range(8)]
    return StepPlanner(cfg, rows, load_qwen3_tokenizer(), PromptConfig(), dp), len(rows)


def test_a_budget_plans_a_step_whatever_the_micro_batch_size():
    """Under ``training.max_tokens_per_microbatch`` nothing is cut by ``training.micro_batch_size``: 2 samples per
    rank (dp 4) under its 8 plan their step (rollout.lmbda = 1 needs no draw slots; before, an IndexError)."""
    from phf_megatron.data.sampler import EpochSampler

    planner, n = _planner(["--training.micro_batch_size=8", "--training.packing",
                           "--training.max_tokens_per_microbatch=4096"], 4)
    plan = planner.plan(0, EpochSampler(n, shuffle=False))
    assert plan.indices == list(range(8)) and plan.requests.on_policy == [True] * 8


@pytest.mark.parametrize("flags,dp,key,says", [
    (["--training.micro_batch_size=4"], 4, "training.micro_batch_size", "does not divide the 2 samples"),
    (["--training.micro_batch_size=1"], 3, "training.global_batch_size", "do not split over 3"),
    (["--training.micro_batch_size=1", "--training.packing", "--training.max_tokens_per_microbatch=4096"], 3,
     "training.global_batch_size", "do not split over 3"),
    (["--training.micro_batch_size=4", "--training.packing", "--training.max_tokens_per_microbatch=4096",
      "--rollout.lmbda=0.5"], 4, "training.micro_batch_size", "rollout.lmbda's one draw per micro-batch"),
])
def test_the_step_split_is_one_line_when_the_planner_starts(flags, dp, key, says):
    """A split a step cannot take is named when the trainer builds its planner, before any rollout (before: an
    IndexError at the first step's plan, from rollout.lmbda's draw slots, or a ValueError after the rollouts)."""
    with pytest.raises(ConfigError) as err:
        _planner(flags, dp)
    assert err.value.key == key and says in err.value.line and "\n" not in err.value.line


def test_an_interleaved_pipeline_needs_a_multiple_of_pp_micro_batches_at_start():
    """Megatron's interleaved schedule refuses a per-rank micro-batch count that is not a multiple of PP: said in
    one line when the planner starts (8 / (2 x dp 2) = 2 micro-batches pass at PP 2; 6 / 2 = 3 do not)."""
    vpp = ["--model.pipeline_model_parallel_size=2", "--model.virtual_pipeline_model_parallel_size=2",
           "--training.micro_batch_size=2"]
    _planner(vpp, 2)
    with pytest.raises(ConfigError) as err:
        _planner([*vpp, "--training.global_batch_size=6"], 1)
    assert err.value.key == "training.micro_batch_size" and "\n" not in err.value.line
    assert "3 micro-batches per data-parallel rank" in err.value.line
    assert "pipeline_model_parallel_size = 2" in err.value.line
