"""Benchmark loading: the sets shipped with the package, a data directory, the Hub; clear errors
naming file and line on bad input, and a missing directory or file as one line at once (the CLI too);
the summary names the data each number came from (a file's sha256, the Hub's revision)."""

import dataclasses
import fnmatch
import json
import os
import shutil
import socket
import sys
import time
import tomllib
import types

import pytest

from phf_megatron.errors import ConfigError, InputFileError
from phf_megatron.eval import EvalConfig
from phf_megatron.eval.benchmarks import (
    KNOWN_BENCHMARKS, PACKAGED_SETS, load_benchmark, load_problems, read_problems_jsonl,
)
from phf_megatron.eval.report import summarize
from phf_megatron.eval.resume import _check_fingerprint
from tests.helpers import REPO, run_python

TOOL = os.path.join(REPO, "tools", "eval_avg_at_k.py")


@pytest.mark.parametrize("name", sorted(KNOWN_BENCHMARKS))
def test_paper_benchmarks_are_shipped_with_the_package(name, tmp_path):
    bench, problems = load_benchmark(name)
    assert bench == name and len(problems) == 30
    with open(os.path.join(PACKAGED_SETS, f"{name}.jsonl"), encoding="utf-8") as f:
        assert [p.id for p in problems] == [json.loads(line)["id"] for line in f]
    shutil.copy(os.path.join(PACKAGED_SETS, f"{name}.jsonl"), tmp_path)
    assert load_benchmark(name, str(tmp_path)) == (name, problems)        # a data directory reads the same
    assert len({p.id for p in problems}) == 30 and all(p.problem and p.answer for p in problems)
    if name != "hmmt25":
        assert all(p.answer.isdigit() and 0 <= int(p.answer) <= 999 for p in problems)


def test_every_packaged_file_is_package_data():
    """``pip install`` (not only a checkout) carries the sets: pyproject's package-data globs cover
    every file of ``sets/``."""
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        globs = tomllib.load(f)["tool"]["setuptools"]["package-data"]["phf_megatron.eval"]
    files = sorted(os.listdir(PACKAGED_SETS))
    assert {f"{name}.jsonl" for name in KNOWN_BENCHMARKS} | {"README.md"} == set(files)
    assert [f for f in files if not any(fnmatch.fnmatch(f"sets/{f}", g) for g in globs)] == []


def _write(tmp_path, lines, name="set.jsonl"):
    path = tmp_path / name
    path.write_bytes(b"".join((line if isinstance(line, bytes) else line.encode()) + b"\n" for line in lines))
    return str(path)


def test_any_jsonl_with_problem_and_answer_fields(tmp_path):
    path = _write(tmp_path, [json.dumps({"problem": "1+1?", "answer": 2}), "",
                             json.dumps({"question": "2+2?", "gold": "4", "id": "q2"})])
    name, problems = load_benchmark(path)
    assert name == "set" and [(p.id, p.answer) for p in problems] == [("set-1", "2"), ("q2", "4")]


def test_a_utf8_bom_at_the_start_is_dropped(tmp_path):
    """A set saved by Windows Notepad or Excel starts with a BOM: it was refused ("Unexpected UTF-8 BOM")."""
    rows = [json.dumps({"problem": "1+1?", "answer": 2}), json.dumps({"problem": "2+2?", "answer": 4})]
    with_bom = read_problems_jsonl(_write(tmp_path, [b"\xef\xbb\xbf" + rows[0].encode(), rows[1]]), "set")
    assert with_bom == read_problems_jsonl(_write(tmp_path, rows, "plain.jsonl"), "set")


@pytest.mark.parametrize("lines,message", [
    ([json.dumps({"problem": "x", "answer": "1"}), json.dumps({"answer": "2"})], r"set.jsonl:2: missing or empty field 'problem'"),
    ([json.dumps({"problem": "x"})], r"set.jsonl:1: row has no answer"),
    ([json.dumps({"problem": "x", "answer": None})], r"set.jsonl:1: row has no answer"),
    ([json.dumps({"problem": "x", "answer": "  "})], r"set.jsonl:1: row has no answer"),
    ([json.dumps({"problem": "x", "answer": [1]})], r"set.jsonl:1: field 'answer' must be"),
    (["{not json"], r"set.jsonl:1: invalid JSON \(Expecting property name enclosed in double quotes at column 2\)"),
    # a file cut short: was "(Unterminated string starting at)", where it starts left out
    ([json.dumps({"problem": "x", "answer": "1"}), '{"problem": "y", "ans'], r"set.jsonl:2: invalid JSON "
                                                                           r"\(Unterminated string starting at column 18\)$"),
    ([json.dumps({"problem": "x", "answer": "1"}), '{"problem": "caf\xe9", "answer": "1"}'.encode("latin-1")],
     r"set.jsonl:2: not UTF-8 text at byte 16 of the line$"),
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
    with pytest.raises(ConfigError, match="unknown benchmark 'aime23'.*aime24"):
        load_benchmark("aime23", str(tmp_path))
    with pytest.raises(InputFileError, match=r"nope.jsonl: does not exist \(a benchmark file: .*problem and answer"):
        load_benchmark(str(tmp_path / "nope.jsonl"))
    (tmp_path / "dir.jsonl").mkdir()   # was "does not exist"
    with pytest.raises(InputFileError, match=r"dir.jsonl: is a directory, not a file \(a benchmark file: "):
        load_benchmark(str(tmp_path / "dir.jsonl"))


@pytest.mark.parametrize("where", ["empty_dir", "no_dir"])
def test_a_data_dir_without_the_file_is_an_error_naming_what_it_should_hold(tmp_path, where):
    """Never a silent fallback to the Hub: the directory was asked for."""
    data_dir = tmp_path if where == "empty_dir" else tmp_path / "missing"
    with pytest.raises(ConfigError) as err:
        load_benchmark("aime25", str(data_dir))
    assert err.value.key == "data_dir" and "aime25.jsonl" in err.value.detail
    assert "problem and answer" in err.value.detail and "leave --data_dir out" in err.value.detail


def test_the_hub_offline_or_unreachable_fails_at_once(monkeypatch):
    """--data_dir=hub: with HF_HUB_OFFLINE and no cached copy, and with the Hub's host refusing
    the connection (a closed local port), one error in well under the retry loop's seconds."""
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match=r"benchmark 'aime24' from the Hub \(HuggingFaceH4/aime_2024\)"):
        load_benchmark("aime24", "hub")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]                 # closed again below: connecting to it is refused
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=rf"127.0.0.1:{port} cannot be reached .*HF_HUB_OFFLINE=1"):
        load_benchmark("hmmt25", "hub")
    assert time.monotonic() - t0 < 2.0


def test_cli_missing_data_dir_is_one_line_before_anything_loads(tmp_path):
    """No torch, no model, no Hub: the config's first check (the subprocess, start to exit, in 2 s)."""
    t0 = time.monotonic()
    out = run_python([TOOL, "--model", str(tmp_path / "no_model"), "--data_dir", str(tmp_path / "nowhere"),
                      "--out_dir", str(tmp_path / "o")], timeout=60, HF_HUB_OFFLINE="0")
    seconds = time.monotonic() - t0
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == [
        f"error: --data_dir: {tmp_path / 'nowhere'} is not a directory: it should hold aime24.jsonl, aime25.jsonl, "
        "hmmt25.jsonl (JSON Lines, one problem per line, with fields problem and answer, id optional); leave "
        "--data_dir out to use the sets shipped with phf-megatron, or --data_dir=hub for the Hugging Face Hub"]
    assert seconds < 2.0 and not os.path.exists(tmp_path / "o")


def test_cli_without_data_dir_evaluates_the_packaged_suite_offline(tmp_path, tiny_dir):
    """The issue's command on a tiny model, offline, no --data_dir: the first 2 problems of each of
    the paper's three sets, with the gold answers of the shipped files."""
    out = tmp_path / "eval"
    run = run_python([TOOL, "--model", tiny_dir, "--n", "1", "--max_new_tokens", "16", "--limit", "2",
                      "--out_dir", str(out), "--backend", "hf", "--dtype", "float32"], timeout=300,
                     HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    assert run.returncode == 0, run.stderr[-2000:]
    with open(out / "samples.rank0.jsonl", encoding="utf-8") as f:
        got = sorted((r["benchmark"], r["problem_id"], r["gold"]) for r in map(json.loads, f))
    want = sorted((name, p.id, p.answer) for name in sorted(KNOWN_BENCHMARKS) for p in load_benchmark(name)[1][:2])
    assert got == want
    with open(out / "summary.json", encoding="utf-8") as f:
        summary = json.load(f)
    assert {b: s["problems"] for b, s in summary["benchmarks"].items()} == {b: 2 for b in KNOWN_BENCHMARKS}


# ----------------------------------------------------------------------------- which data a number came from


class _FakeHubSplit(list):
    """What ``datasets.load_dataset`` returns, as far as the loader reads it: rows and a fingerprint."""

    def __init__(self, rows, fingerprint):
        super().__init__(rows)
        self._fingerprint = fingerprint


@pytest.fixture
def fake_hub(monkeypatch):
    """``datasets`` replaced at its boundary (no network): ``load_dataset``'s calls are recorded and each
    set has two problems whose fingerprint names the repository and revision asked for."""
    calls = []

    def load_dataset(repo, split, revision=None):
        calls.append((repo, split, revision))
        id_col = next(col for r, _, col in KNOWN_BENCHMARKS.values() if r == repo)
        rows = [{id_col: f"{repo}-{i}", "problem": f"problem {i}?", "answer": str(i)} for i in (1, 2)]
        return _FakeHubSplit(rows, f"fp:{repo}@{revision}")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")            # no probe of the Hub's host
    return calls


def _summary_of(config, problems, sources):
    records = {(b, p.id, 0): {"benchmark": b, "problem_id": p.id, "sample_index": 0, "gold": p.answer,
                              "output": f"\\boxed{{{p.answer}}}", "finish_reason": "stop"}
               for b, ps in problems.items() for p in ps}
    return summarize(config, problems, records, duplicates=0, generated=0, seconds=0.0, model_dir="m",
                     backend="hf", data_sources=sources)


@pytest.mark.parametrize("revision", ["0123abcd", None])
def test_the_hub_revision_reaches_load_dataset_and_the_summary(tmp_path, fake_hub, revision):
    """--data_revision is what ``datasets.load_dataset`` gets; summary.json and the printed table say
    which revision (or "main (unpinned)") and fingerprint each set came from."""
    config = EvalConfig(out_dir=str(tmp_path), model="m", benchmarks=("aime24", "hmmt25"), data_dir="hub",
                        data_revision=revision, n=1)
    problems, sources = load_problems(config)
    assert fake_hub == [("HuggingFaceH4/aime_2024", "train", revision), ("MathArena/hmmt_feb_2025", "train", revision)]
    pinned = revision or "main (unpinned)"
    assert sources["aime24"] == {"hub": "HuggingFaceH4/aime_2024", "split": "train", "revision": pinned,
                                 "fingerprint": f"fp:HuggingFaceH4/aime_2024@{revision}"}
    summary = _summary_of(config, problems, sources)
    with open(summary.summary_path) as f:
        assert json.load(f)["data_sources"] == sources
    assert summary.table().splitlines()[-1] == ("data from the Hugging Face Hub: HuggingFaceH4/aime_2024@"
                                                f"{pinned}, MathArena/hmmt_feb_2025@{pinned}")


def test_the_shipped_sets_are_recorded_by_their_sha256(tmp_path):
    """No revision for a file: its path and sha256 (the first 16 hex as sets/README.md lists them)."""
    config = EvalConfig(out_dir=str(tmp_path), model="m", n=1, limit=1)
    problems, sources = load_problems(config)
    readme = open(os.path.join(PACKAGED_SETS, "README.md"), encoding="utf-8").read()
    for name, source in sources.items():
        assert source["file"] == os.path.join(PACKAGED_SETS, f"{name}.jsonl")
        assert f"| `{name}.jsonl` | 30 | `{source['sha256'][:16]}` |" in readme, name
    with open(_summary_of(config, problems, sources).summary_path) as f:
        assert json.load(f)["data_sources"] == sources


def test_a_run_directory_refuses_samples_of_another_hub_revision(tmp_path):
    """Same problem ids, perhaps other problems: a resume under another revision is refused; a run
    directory written before --data_revision existed (no such key) resumes unpinned."""
    unpinned = EvalConfig(out_dir=str(tmp_path), model="m").generation_fingerprint("/models/m", "hf")
    (tmp_path / "run_config.json").write_text(json.dumps({k: v for k, v in unpinned.items() if k != "data_revision"}))
    _check_fingerprint(str(tmp_path), unpinned)
    config = EvalConfig(out_dir=str(tmp_path), model="m", data_dir="hub", data_revision="aaaa")
    _check_fingerprint(str(tmp_path), config.generation_fingerprint("/models/m", "hf"), has_samples=False)
    other = dataclasses.replace(config, data_revision="bbbb")
    with pytest.raises(InputFileError, match=r"'data_revision': \('aaaa', 'bbbb'\)"):
        _check_fingerprint(str(tmp_path), other.generation_fingerprint("/models/m", "hf"))


@pytest.mark.parametrize("content, detail", [
    ('{"model_dir": "/mod', "not valid JSON: Unterminated string"),
    ("[1]", "expected a JSON object (the settings of the samples beside it), got list"),
])
def test_a_damaged_run_config_is_named(tmp_path, content, detail):
    """The resume read run_config.json with json.load: a JSONDecodeError (or a TypeError) traceback."""
    (tmp_path / "run_config.json").write_text(content)
    fingerprint = EvalConfig(out_dir=str(tmp_path), model="m").generation_fingerprint("/models/m", "hf")
    with pytest.raises(InputFileError) as err:
        _check_fingerprint(str(tmp_path), fingerprint)
    assert err.value.path == str(tmp_path / "run_config.json") and err.value.detail.startswith(detail), err.value


def test_a_revision_without_the_hub_is_one_line(tmp_path, capsys):
    from phf_megatron.tools.eval_avg_at_k import main

    assert main(["--model", "m", "--out_dir", str(tmp_path / "o"), "--data_revision", "0123abcd"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: --data_revision: '0123abcd': a Hub revision (commit SHA, tag or branch), only with --data_dir hub "
        "(the shipped sets and data directories have none)"]
