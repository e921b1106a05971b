"""The summary: both graders' Average@k columns, older records regraded, the math-verify version."""

import json
from importlib.metadata import version

import pytest

from phf_megatron.eval import EvalConfig
from phf_megatron.eval.benchmarks import Problem
from phf_megatron.eval.report import summarize

OUTPUTS = {  # output -> (official, extended) verdicts for gold "5"
    "so \\boxed{5}.": (True, True),
    "so \\fbox{5}.": (False, True),
    "so \\boxed 5": (False, True),
    "so \\boxed{6}.": (False, False),
}


def _records(old_format=False):
    """Two problems x two samples; the old format (before two graders) stores one bool."""
    texts = {("p1", 0): "so \\boxed{5}.", ("p1", 1): "so \\fbox{5}.", ("p2", 0): "so \\boxed 5", ("p2", 1): "so \\boxed{6}."}
    out = {}
    for (pid, i), text in texts.items():
        rec = {"benchmark": "b", "problem_id": pid, "sample_index": i, "gold": "5", "output": text,
               "finish_reason": "stop", "require_boxed": True}
        if old_format:
            rec.update(correct=True, pred="stale", boxed=True)          # wrong on purpose: must be regraded
        else:
            official, extended = OUTPUTS[text]
            rec.update(correct={"official": official, "extended": extended}, boxed="\\boxed{" in text)
        out[("b", pid, i)] = rec
    return out


@pytest.mark.parametrize("old_format", [False, True])
@pytest.mark.parametrize("grader", ["official", "extended"])
def test_table_and_summary_report_both_graders(tmp_path, grader, old_format):
    config = EvalConfig(out_dir=str(tmp_path), model="unused", n=2, grader=grader, pass_ks=(1,))
    problems = {"b": [Problem("b", "p1", "?", "5"), Problem("b", "p2", "?", "5")]}
    summary = summarize(config, problems, _records(old_format), duplicates=0, generated=0, seconds=0.0,
                        model_dir="m", backend="hf")
    lines = summary.table().splitlines()
    head = lines[0].split()
    assert head == ["benchmark", "problems", "Avg@2", "(official)", "%", "Avg@2", "(extended)", "%", "pass@1", "%",
                    "pass@2", "%", "boxed", "%", "truncated", "%"]               # every score a percentage
    assert lines[2].split()[:4] == ["b", "2", "25.00", "75.00"]          # 1 of 4 official, 3 of 4 extended
    assert lines[3].split()[:4] == ["suite", "average", "25.00", "75.00"]
    assert f"pass@k by the {grader} grader; math-verify {version('math-verify')} (official: 0.8.0)" in lines[-1]
    with open(summary.summary_path) as f:
        got = json.load(f)
    assert got["grader"] == grader and got["suite_average_at_k"] == {"official": 25.0, "extended": 75.0}[grader]
    assert got["suite_average_at_k_by_grader"] == {"official": 25.0, "extended": 75.0}
    assert (got["math_verify_version"], got["official_math_verify_version"]) == (version("math-verify"), "0.8.0")
    bench = got["benchmarks"]["b"]
    assert bench["pass_at_k"]["2"] == {"official": 50.0, "extended": 100.0}[grader]
    assert bench["boxed_rate"] == 50.0                                   # the official extraction: \fbox, \boxed 5 are none


def _suite_averages(out_dir, records, answer="5"):
    config = EvalConfig(out_dir=str(out_dir), model="unused", n=2, pass_ks=(1,))
    problems = {"b": [Problem("b", "p1", "?", answer), Problem("b", "p2", "?", answer)]}
    summary = summarize(config, problems, records, duplicates=0, generated=0, seconds=0.0, model_dir="m", backend="hf")
    return summary.suite_average_by_grader


def _current(records):
    for rec in records.values():
        rec["math_verify"] = version("math-verify")
    return records


def test_records_are_graded_against_the_benchmarks_answer_not_the_one_stored(tmp_path):
    """A benchmark whose answer changed (a fixed typo) after the samples were drawn: the resumed
    run grades every sample against the answer it has now, not against the one stored with it."""
    assert _suite_averages(tmp_path, _current(_records()), answer="5") == {"official": 25.0, "extended": 75.0}
    assert _suite_averages(tmp_path, _current(_records()), answer="6") == {"official": 25.0, "extended": 25.0}


def test_records_graded_by_another_math_verify_are_regraded(tmp_path):
    """summary.json names the installed math-verify as the one that graded: verdicts stored by
    another version (here wrong on purpose) are graded again, not taken as they are."""
    records = _records()
    for rec in records.values():
        rec.update(correct={"official": True, "extended": True}, math_verify="0.0.1")
    assert _suite_averages(tmp_path, records) == {"official": 25.0, "extended": 75.0}
    assert _suite_averages(tmp_path, _current(_records())) == {"official": 25.0, "extended": 75.0}
