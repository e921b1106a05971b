"""Benchmarks by name (aime24, aime25, hmmt25) or any JSONL file with problem/answer fields.

A name resolves to ``<data_dir>/<name>.jsonl`` when that file exists, else (online, with the
``datasets`` package) to the Hugging Face dataset the official OPSD evaluation uses. Rows need
``problem`` and ``answer`` (``question`` / ``gold`` are accepted aliases); ``id`` is optional.
Every problem with a file is reported as ``path:line``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from ..errors import ConfigError, InputFileError

#: name -> (HF dataset, split, id column) — as in OPSD's eval/evaluate_math.py.
KNOWN_BENCHMARKS = {
    "aime24": ("HuggingFaceH4/aime_2024", "train", "id"),
    "aime25": ("yentinglin/aime_2025", "train", "problem_idx"),
    "hmmt25": ("MathArena/hmmt_feb_2025", "train", "problem_idx"),
}
_PROBLEM_KEYS = ("problem", "question")
_ANSWER_KEYS = ("answer", "gold")


@dataclass(frozen=True)
class Problem:
    benchmark: str
    id: str
    problem: str
    answer: str


def load_benchmark(spec: str, data_dir: str | None = None) -> tuple[str, list[Problem]]:
    """Resolve ``spec`` (a known name or a ``.jsonl`` path) to (benchmark name, problems).

    Raises:
        ValueError: unknown name, a bad row (naming ``file:line``), an empty file.
        FileNotFoundError: a ``.jsonl`` path that does not exist.
    """
    if spec.endswith(".jsonl") or os.path.sep in spec:
        if not os.path.isfile(spec):
            raise FileNotFoundError(f"benchmark file {spec!r} does not exist")
        name = os.path.splitext(os.path.basename(spec))[0]
        return name, read_problems_jsonl(spec, name)
    if spec not in KNOWN_BENCHMARKS:
        raise ConfigError("benchmarks", f"unknown benchmark {spec!r}: use one of {sorted(KNOWN_BENCHMARKS)} or a "
                                        "path to a .jsonl file")
    if data_dir is not None:
        path = os.path.join(data_dir, f"{spec}.jsonl")
        if os.path.isfile(path):
            return spec, read_problems_jsonl(path, spec)
    return spec, _load_hf_dataset(spec, data_dir)


def read_problems_jsonl(path: str, benchmark: str) -> list[Problem]:
    """Rows of a JSONL file, validated; blank lines are skipped."""
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputFileError(where, f"invalid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise InputFileError(where, f"expected a JSON object, got {type(row).__name__}")
            problem = _field(row, _PROBLEM_KEYS)
            if not isinstance(problem, str) or not problem.strip():
                raise InputFileError(where, f"missing or empty field 'problem' (keys: {sorted(row)})")
            answer = _field(row, _ANSWER_KEYS)
            if answer is None or (isinstance(answer, str) and not answer.strip()):
                raise InputFileError(where, f"row has no answer (field 'answer' missing, null or empty)")
            if not isinstance(answer, (str, int, float)) or isinstance(answer, bool):
                raise InputFileError(where, f"field 'answer' must be a string or a number, got {type(answer).__name__}")
            pid = str(row.get("id", f"{benchmark}-{lineno}"))
            if pid in seen:
                raise InputFileError(where, f"duplicate id {pid!r} (first on line {seen[pid]})")
            seen[pid] = lineno
            problems.append(Problem(benchmark, pid, problem, str(answer).strip()))
    if not problems:
        raise InputFileError(path, "empty file (no rows)")
    return problems


def _field(row: dict, keys: tuple[str, ...]):
    for k in keys:
        if k in row:
            return row[k]
    return None


def _load_hf_dataset(name: str, data_dir: str | None) -> list[Problem]:
    repo, split, id_col = KNOWN_BENCHMARKS[name]
    where = f"{data_dir}/{name}.jsonl does not exist" if data_dir else "no --data-dir given"
    try:
        import datasets
    except ImportError:
        raise ConfigError("data_dir", f"benchmark {name!r}: {where}, and the `datasets` package is not installed "
                                      f"to fetch {repo} (pip install datasets, or pass --data-dir)") from None
    try:
        rows = datasets.load_dataset(repo, split=split)
    except Exception as exc:
        raise ConfigError("data_dir", f"benchmark {name!r}: {where}, and {repo} could not be loaded "
                                      f"({type(exc).__name__}: {exc})") from exc
    out = []
    for i, row in enumerate(rows):
        answer = row.get("answer")
        if answer is None or not str(answer).strip():
            raise InputFileError(f"{repo}[{i}]", "row has no answer")
        out.append(Problem(name, str(row.get(id_col, i)), row["problem"], str(answer).strip()))
    return out
