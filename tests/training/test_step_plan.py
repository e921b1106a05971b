"""The step plan's pure parts: reading ahead leaves the sampler alone; the rollout digest ignores the layout; a
row whose longest sequence is over the token budget alone is named at load, with the smallest budget that fits;
each text is tokenized once at load."""

import re
from types import SimpleNamespace

import pytest

from phf_megatron.data import PromptConfig
from phf_megatron.data.prompts import (encode_prompt, generation_prompt, render_student_prompt, render_teacher_prompt,
                                       teacher_continuation)
from phf_megatron.data.reason_first import analysis_prompt_ids, analysis_prompt_text, reason_first_teacher_ids
from phf_megatron.data.rows import MathRow
from phf_megatron.data.sampler import EpochSampler
from phf_megatron.data.toy import toy_row
from phf_megatron.errors import ConfigError
from phf_megatron.tokenizer import load_qwen3_tokenizer
from phf_megatron.training import step_plan
from phf_megatron.training.config_io import load_config
from phf_megatron.training.methods.grpo import GrpoMethod
from phf_megatron.training.methods.phf import PhfMethod
from phf_megatron.training.methods.sft import SftMethod
from phf_megatron.training.microbatch_plan import token_budget_plan
from phf_megatron.training.step_plan import StepPlan, StepPlanner, local_rollout_record, peek_rows, rollout_stats


def test_peek_reads_ahead_without_moving_the_sampler():
    sampler, reference = EpochSampler(10, seed=3), EpochSampler(10, seed=3)
    first, second = reference.take(4), reference.take(4)
    assert peek_rows(sampler, 4, 4) == second and peek_rows(sampler, 0, 4) == first
    assert sampler.state_dict() == EpochSampler(10, seed=3).state_dict()
    assert peek_rows(sampler, 8, 4) == reference.take(4)  # across the epoch boundary


def test_rollout_digest_and_length_do_not_depend_on_the_data_parallel_split():
    completions = [[i, i + 1] * (1 + i % 3) for i in range(8)]
    whole = rollout_stats([local_rollout_record(completions, 0, 1)])
    # two data-parallel ranks, each record sent by its two tensor-parallel ranks
    halves = [local_rollout_record(completions, dp, 2) for dp in (0, 0, 1, 1)]
    assert rollout_stats(halves) == whole
    assert whole["rollout_tokens"] == sum(map(len, completions)) / 8 and 0 <= whole["rollout_digest"] < 2**52
    changed = [list(c) for c in completions]
    changed[5][0] += 1
    assert rollout_stats([local_rollout_record(changed, 0, 1)])["rollout_digest"] != whole["rollout_digest"]


# --- the token budget checked at load (StepPlanner.check_rows): a row over it alone is named before any step --


@pytest.fixture(scope="module")
def tok():
    return load_qwen3_tokenizer()


LONG = MathRow("Recall 1 + 1 = 2. " * 20 + toy_row(12, 19).problem, toy_row(12, 19).solution + " 1 + 1 = 2." * 40, "1",
               "long.jsonl:3")
ROWS = [toy_row(a, a + 7) for a in range(10, 14)]


def _planner(tok, *flags, rows=(LONG,)):
    cfg = load_config(None, ["--training.packing", "--rollout.max_tokens=64", *flags])
    method = {"sft": SftMethod, "grpo": GrpoMethod}.get(cfg.method, PhfMethod)
    rows = [*ROWS[:2], *rows, *ROWS[2:]]
    return method, StepPlanner(cfg, SimpleNamespace(rows=rows), tok, PromptConfig(), 1, row_inputs=method.row_inputs)


def _longest(tok, planner, method) -> int:
    """The longest sequence of the rows, as the step builds it (prompt pairs; SFT: its own samples)."""
    cfg, rows = planner.cfg, planner.dataset.rows
    pairs = [method.row_inputs(tok, r, PromptConfig()) for r in rows]
    if cfg.method == "sft":
        plan = StepPlan(0, list(range(len(rows))), rows, pairs, None)
        pairs, completions = SftMethod(cfg).training_samples(planner, plan, None, range(len(rows)))
        return max(len(p.student_ids) + len(c) for p, c in zip(pairs, completions))
    if cfg.data.reason_first:
        analysis = [0] * cfg.data.reason_first_max_tokens
        teachers = [reason_first_teacher_ids(tok, analysis_prompt_ids(tok, r.problem, r.solution), analysis)
                    for r in rows]
    else:
        teachers = [p.teacher_ids for p in pairs]
    return max(max(len(p.student_ids), len(t)) for p, t in zip(pairs, teachers)) + cfg.rollout.max_tokens


@pytest.mark.parametrize("flags", [(), ("--data.reason_first",), ("--method=grpo", "--rollout.n=2", "--rollout.top_k=0", "--rollout.top_p=1.0"),
                                   ("--method=sft", "--rollout.n=1", "--sft.max_length=100000"),
                                   ("--method=sft", "--rollout.n=1", "--sft.max_length=300")])
def test_a_row_over_the_token_budget_alone_is_named_at_load_with_the_smallest_budget(tok, flags):
    """One long row: a budget one under its longest sequence (the teacher's prompt + rollout.max_tokens; with
    data.reason_first, + the analysis bound; GRPO: the student's; SFT: prompt + solution + EOS, cut at
    sft.max_length) stops at load naming it and that length; that length itself passes. The step-time plan
    (token_budget_plan) agrees: it takes that sequence alone at that budget, not one under."""
    method, planner = _planner(tok, *flags)
    need = _longest(tok, planner, method)
    planner.cfg.training.max_tokens_per_microbatch = need
    method.check_rows(planner)
    token_budget_plan([need], [need], dp_size=1, max_tokens=need)
    planner.cfg.training.max_tokens_per_microbatch = need - 1
    with pytest.raises(ConfigError) as err:
        method.check_rows(planner)
    limits = {"--data.reason_first": "rollout.max_tokens, data.reason_first_max_tokens",
              "--method=sft": "sft.max_length"}.get(flags[0] if flags else "", "rollout.max_tokens")
    assert re.fullmatch(rf"--training\.max_tokens_per_microbatch: 1 row\(s\) make a sequence over the budget of "
                        rf"{need - 1} tokens alone, which would stop the run when its step came: long\.jsonl:3 makes "
                        rf"\d+ prompt \+ \d+ completion tokens \({limits}\) = {need}; the smallest budget every row "
                        rf"fits is {need}: raise it to that, lower {limits}, or remove the row\(s\)",
                        err.value.line), err.value.line
    with pytest.raises(ConfigError):
        token_budget_plan([need], [need], dp_size=1, max_tokens=need - 1)


def test_the_budget_error_pads_as_the_layout_and_names_the_longest_row_first(tok):
    """Under sequence parallelism (TP 2) a packed sequence is padded to a multiple of 2: an odd longest sequence
    needs one more token, and passes at that. Several rows over: the longest is detailed, the others listed."""
    longer = MathRow(LONG.problem, LONG.solution * 2, "1", "long.jsonl:9")
    method, planner = _planner(tok, "--model.tensor_model_parallel_size=2", "--model.sequence_parallel",
                               "--training.max_tokens_per_microbatch=300", rows=(LONG, longer))
    planner.cfg.rollout.max_tokens += 1 - _longest(tok, planner, method) % 2
    need = _longest(tok, planner, method)
    assert need % 2 == 1
    with pytest.raises(ConfigError) as err:
        method.check_rows(planner)
    line = err.value.line
    assert "2 row(s) make a sequence over" in line and "long.jsonl:9 makes" in line, line
    assert f"(rollout.max_tokens, padded to a multiple of 2) = {need + 1}; also long.jsonl:3; the smallest " \
           f"budget every row fits is {need + 1}:" in line, line
    planner.cfg.training.max_tokens_per_microbatch = need
    with pytest.raises(ConfigError):
        method.check_rows(planner)
    planner.cfg.training.max_tokens_per_microbatch = need + 1
    method.check_rows(planner)


def test_rows_under_the_budget_in_bytes_are_not_tokenized(tok):
    """A token covers at least one byte: rows whose prompt bytes + rollout.max_tokens fit the budget are not
    tokenized at load (only the long one is)."""
    method, planner = _planner(tok, "--training.max_tokens_per_microbatch=100000")
    counted = []

    class Counting:
        def __getattr__(self, name):
            return getattr(tok, name)

        def __call__(self, text, **kw):
            counted.append(text)
            return tok(text, **kw)

    planner.tokenizer = Counting()
    method.check_rows(planner)
    assert counted == []
    planner.cfg.training.max_tokens_per_microbatch = len(render_teacher_prompt(tok, LONG.problem, LONG.solution))
    method.check_rows(planner)
    assert len(counted) == 2 and LONG.solution in counted[0]  # the long row's two prompts only


@pytest.mark.parametrize("reason_first", [False, True])
def test_each_text_is_tokenized_once_at_load(tok, reason_first, monkeypatch):
    """The length check and the budget check share a row's texts: a prompt over data.max_prompt_length in bytes
    (not in tokens) is tokenized once, not again for the budget; with data.reason_first the continuation every
    teacher prompt ends in is tokenized once for all rows. The texts tokenized are exactly every row's two
    prompts (and that continuation), and the result is the same error as the step-time lengths give."""
    method, planner = _planner(tok, *(("--data.reason_first",) if reason_first else ()))
    rows, counted = planner.dataset.rows, []

    def counting(tokenizer, text):
        counted.append(text)
        return encode_prompt(tokenizer, text)
    monkeypatch.setattr(step_plan, "encode_prompt", counting)
    measured = [analysis_prompt_text(tok, r.problem, r.solution) if reason_first else
                render_teacher_prompt(tok, r.problem, r.solution) for r in rows]
    students = [render_student_prompt(tok, r.problem) for r in rows]
    planner.cfg.data.max_prompt_length = max(len(encode_prompt(tok, t)) for t in measured)
    assert max(len(t.encode()) for t in measured) > planner.cfg.data.max_prompt_length  # the long one tokenized
    planner.cfg.training.max_tokens_per_microbatch = 1  # every row over: every prompt tokenized for it too
    with pytest.raises(ConfigError) as err:
        method.check_rows(planner)
    continuation = [teacher_continuation(), generation_prompt(tok, False)] if reason_first else []
    assert sorted(counted) == sorted(measured + students + continuation)
    assert f"{len(rows)} row(s) make a sequence over" in err.value.line
    assert f"the smallest budget every row fits is {_longest(tok, planner, method)}:" in err.value.line
