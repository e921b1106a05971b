"""benchmarks/packing.py: its token accounting against hand computations and the trainer's own
builder, and the command on a small subset of the real mix, rechecked from the lengths it reports."""

import json

import pytest

from benchmarks.packing import account, main, rollout_length, summarize
from phf_megatron.data import PromptPair
from phf_megatron.training.batches import build_microbatches
from phf_megatron.training.microbatch_plan import fixed_plan, token_budget_plan

from ..helpers import EXAMPLE_MATH, REPO

STUDENT, TEACHER = [3, 5, 4, 8], [10, 7, 9, 12]
LENGTHS = dict(student=STUDENT, teacher=TEACHER)


def test_accounting_of_one_step_by_hand():
    one_rank = fixed_plan(4, dp_size=1, micro_batch_size=2)      # micro-batches (0, 1), (2, 3); TP multiple 2
    padded = account(one_rank, LENGTHS, "padded", 2)              # every micro-batch padded to the rank's longest
    assert padded["computed"] == dict(student=4 * 8, teacher=4 * 12)
    assert padded["peak"] == dict(student=2 * 8, teacher=2 * 12) and padded["microbatches"] == 2
    assert padded["rank_costs"] == [3 * 32 + 48]
    packed = account(one_rank, LENGTHS, "packed", 2)              # 3+5=8, 4+8=12; 10+7=17->18, 9+12=21->22
    assert packed["computed"] == dict(student=8 + 12, teacher=18 + 22)
    assert packed["peak"] == dict(student=12, teacher=22) and packed["rank_costs"] == [3 * 20 + 40]
    two_ranks = account(fixed_plan(4, dp_size=2, micro_batch_size=2), LENGTHS, "padded", 2)
    assert two_ranks["computed"] == dict(student=2 * 6 + 2 * 8, teacher=2 * 10 + 2 * 12)
    assert two_ranks["rank_costs"] == [3 * 12 + 20, 3 * 16 + 24]


def test_summary_by_hand():
    steps = [dict(computed=dict(student=10, teacher=30), peak=dict(student=6, teacher=20), microbatches=2,
                  rank_costs=[30, 30]),
             dict(computed=dict(student=20, teacher=20), peak=dict(student=9, teacher=11), microbatches=3,
                  rank_costs=[20, 60])]
    useful = [dict(student=8, teacher=30), dict(student=16, teacher=16)]
    s = summarize(steps, useful)
    assert s["student"]["tokens_per_step"] == 15 and s["student"]["padding_fraction"] == pytest.approx(1 - 24 / 30)
    assert s["both"]["padding_fraction"] == pytest.approx(1 - 70 / 80) and s["both"]["useful_per_step"] == 35
    assert s["microbatches_per_step"] == 2.5 and s["peak_microbatch_tokens"] == dict(student=9, teacher=20)
    assert s["slowest_rank_over_mean"] == pytest.approx((1 + 1.5) / 2) and s["slowest_rank_cost"] == 45


@pytest.mark.parametrize("dp,mbs,multiple", [(1, 2, 2), (2, 1, 1), (2, 2, 4)])
def test_padded_accounting_is_what_the_trainers_builder_allocates(dp, mbs, multiple):
    pairs = [PromptPair(student_ids=[1] * (s - 2), teacher_ids=[2] * (t - 2)) for s, t in zip(STUDENT, TEACHER)]
    completions = [[3, 4]] * 4
    for rank in range(dp):
        built = build_microbatches(pairs, completions, pad_id=0, micro_batch_size=mbs, dp_rank=rank, dp_size=dp,
                                   pad_multiple=multiple, window_budget=8)
        plan = fixed_plan(4, dp_size=dp, micro_batch_size=mbs)
        only_this_rank = type(plan)((plan.microbatches(rank),))
        counted = account(only_this_rank, LENGTHS, "padded", multiple)
        assert counted["computed"] == dict(student=sum(mb.student_tokens.numel() for mb in built),
                                           teacher=sum(mb.teacher_tokens.numel() for mb in built))


def test_completion_lengths_are_clipped_and_reproducible():
    draws = [rollout_length(0, 3, i, 450, 0.6, 1024) for i in range(400)]
    assert draws == [rollout_length(0, 3, i, 450, 0.6, 1024) for i in range(400)]
    assert 1 <= min(draws) and max(draws) == 1024 and 300 < sorted(draws)[200] < 600
    assert draws != [rollout_length(1, 3, i, 450, 0.6, 1024) for i in range(400)]


def test_the_command_on_a_subset_of_the_real_mix(tmp_path, capsys, monkeypatch):
    """``main`` in this process (the tokenizer loads once); the module's ``__main__`` only calls it."""
    out = tmp_path / "packing.json"
    monkeypatch.chdir(REPO)
    main(["--rows", "64", "--steps", "2", "--out", str(out), "--configs", "configs/phf_qwen3_8b.yaml",
          "configs/phf_qwen3_1p7b.yaml"])
    assert "| phf_qwen3_8b (4, 2, 2, 4096) | padded |" in capsys.readouterr().out
    results = json.loads(out.read_text())
    assert results["meta"]["rows"] == 64

    from phf_megatron.data import build_prompt_pair, load_math_dataset, load_qwen3_tokenizer

    rows, tok = load_math_dataset(EXAMPLE_MATH).rows, load_qwen3_tokenizer()
    for name, res in results["presets"].items():
        lay = res["layout"]
        m, per_rank = lay["pad_multiple"], lay["global_batch_size"] // lay["dp"]
        assert len(res["steps"]) == 2
        computed, useful = {v: 0 for v in res["variants"]}, 0
        for step in res["steps"]:
            for i in (0, 17):       # the lengths are the trainer's prompts + the completion
                pair = build_prompt_pair(tok, rows[step["rows"][i]].problem, rows[step["rows"][i]].solution)
                assert step["student"][i] == len(pair.student_ids) + step["completions"][i]
                assert step["teacher"][i] == len(pair.teacher_ids) + step["completions"][i]
            for side in ("student", "teacher"):
                lengths = step[side]
                useful += sum(lengths)
                for r in range(lay["dp"]):    # padded: each rank's block times its longest, rounded up to m
                    block = lengths[r * per_rank:(r + 1) * per_rank]
                    computed["padded"] += per_rank * (-(-max(block) // m) * m)
                for lo in range(0, len(lengths), lay["micro_batch_size"]):
                    computed["packed"] += -(-sum(lengths[lo:lo + lay["micro_batch_size"]]) // m) * m
                plan = token_budget_plan(step["student"], step["teacher"], dp_size=lay["dp"],
                                         max_tokens=lay["max_tokens"], pad_multiple=m)
                computed["packed+budget"] += sum(-(-sum(lengths[i] for i in mb) // m) * m
                                                 for rank in plan.ranks for mb in rank)
        for v, summary in res["variants"].items():
            assert summary["both"]["tokens_per_step"] == computed[v] / 2, (name, v)
            assert summary["both"]["padding_fraction"] == pytest.approx(1 - useful / computed[v]), (name, v)
            assert max(summary["peak_microbatch_tokens"].values()) <= (lay["max_tokens"] if v == "packed+budget"
                                                                      else float("inf"))
        fractions = [res["variants"][v]["both"]["padding_fraction"] for v in ("padded", "packed", "packed+budget")]
        assert fractions[0] > 0.05 and fractions[1] < 0.01 and fractions[2] < 0.01


@pytest.mark.parametrize("argv, line", [
    (["--gpus", "0"], "error: --gpus: must be >= 1, got 0"),   # was a ValueError traceback from the plan
    (["--rollout-median", "nan"], "error: --rollout-median: must be a finite number > 0, got nan"),
    (["--out", "configs"], "error: --out: configs is a directory (give the JSON file to write)"),
    (["--data", "/nonexistent.jsonl"], "error: --data: '/nonexistent.jsonl' does not exist"),
    (["--gpus", "3"], "error: configs/tiny_cpu.yaml: --training.global_batch_size: 4 samples do not split over 3 "
                      "data-parallel ranks"),   # a preset's setting: named with its file
])
def test_the_command_reports_bad_flags_as_one_line(argv, line):
    """The script as a user runs it: one line, exit code 2 (each was a traceback)."""
    from ..helpers import run_python

    proc = run_python(["benchmarks/packing.py", "--configs", "configs/tiny_cpu.yaml", "--rows", "8", *argv])
    assert (proc.returncode, proc.stderr.splitlines()) == (2, [line]), proc.stderr[-2000:]
