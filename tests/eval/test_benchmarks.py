"""Benchmark loading: the shared files, and clear errors naming file and line on bad input."""

import json

import pytest

from phf_megatron.eval.benchmarks import KNOWN_BENCHMARKS, load_benchmark, read_problems_jsonl


@pytest.mark.parametrize("name", sorted(KNOWN_BENCHMARKS))
def test_paper_benchmarks_load_from_the_data_dir(name, shared_data):
    bench, problems = load_benchmark(name, shared_data)
    assert bench == name and len(problems) == 30
    assert len({p.id for p in problems}) == 30 and all(p.problem and p.answer for p in problems)
    if name != "hmmt25":
        assert all(p.answer.isdigit() and 0 <= int(p.answer) <= 999 for p in problems)


def _write(tmp_path, lines, name="set.jsonl"):
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def test_any_jsonl_with_problem_and_answer_fields(tmp_path):
    path = _write(tmp_path, [json.dumps({"problem": "1+1?", "answer": 2}), "",
                             json.dumps({"question": "2+2?", "gold": "4", "id": "q2"})])
    name, problems = load_benchmark(path)
    assert name == "set" and [(p.id, p.answer) for p in problems] == [("set-1", "2"), ("q2", "4")]


@pytest.mark.parametrize("lines,message", [
    ([json.dumps({"problem": "x", "answer": "1"}), json.dumps({"answer": "2"})], r"set.jsonl:2: missing or empty field 'problem'"),
    ([json.dumps({"problem": "x"})], r"set.jsonl:1: row has no answer"),
    ([json.dumps({"problem": "x", "answer": None})], r"set.jsonl:1: row has no answer"),
    ([json.dumps({"problem": "x", "answer": "  "})], r"set.jsonl:1: row has no answer"),
    ([json.dumps({"problem": "x", "answer": [1]})], r"set.jsonl:1: field 'answer' must be"),
    (["{not json"], r"set.jsonl:1: invalid JSON"),
    (["[1, 2]"], r"set.jsonl:1: expected a JSON object"),
    ([json.dumps({"id": "a", "problem": "x", "answer": 1})] * 2, r"set.jsonl:2: duplicate id 'a' \(first on line 1\)"),
    ([], r"set.jsonl: empty file"),
    (["", "  "], r"set.jsonl: empty file"),
])
def test_bad_rows_are_named_by_file_and_line(tmp_path, lines, message):
    path = _write(tmp_path, lines)
    with pytest.raises(ValueError, match=message):
        read_problems_jsonl(path, "set")


def test_unknown_benchmark_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match="unknown benchmark 'aime23'.*aime24"):
        load_benchmark("aime23", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_benchmark(str(tmp_path / "nope.jsonl"))


def test_known_name_without_data_dir_file_needs_datasets_or_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match=r"benchmark 'aime24': .*aime24.jsonl does not exist"):
        load_benchmark("aime24", str(tmp_path))
