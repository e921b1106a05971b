"""Benchmarks by name (aime24, aime25, hmmt25) or any JSONL file with problem/answer fields.

Where a name's problems come from (``data_dir``):

* left out: the copy shipped with the package, ``sets/<name>.jsonl`` (provenance and licence in
  ``sets/README.md``): no network, no extra package;
* a directory: ``<data_dir>/<name>.jsonl``, which must exist;
* ``hub``: the Hugging Face dataset the official OPSD evaluation uses (needs ``datasets`` and the
  Hub, or its cache with ``HF_HUB_OFFLINE=1``), at ``revision`` (None: the Hub's main, which moves).

Rows need ``problem`` and ``answer`` (``question`` / ``gold`` are accepted aliases); ``id`` is
optional. Every problem with a file is reported as ``path:line``. A missing directory or file is
one line at once (``check_benchmarks``, before anything heavy is imported or the Hub is tried).
``load_benchmark_source`` also says where the problems came from (the file and its sha256, or the
Hub dataset, its revision and ``datasets``' fingerprint): summary.json's ``data_sources``.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from dataclasses import dataclass
from urllib.parse import urlparse

from ..errors import ConfigError, InputFileError
from ..input_files import numbered_lines, utf8_line

#: name -> (HF dataset, split, id column) — as in OPSD's eval/evaluate_math.py.
KNOWN_BENCHMARKS = {
    "aime24": ("HuggingFaceH4/aime_2024", "train", "id"),
    "aime25": ("yentinglin/aime_2025", "train", "problem_idx"),
    "hmmt25": ("MathArena/hmmt_feb_2025", "train", "problem_idx"),
}
#: The paper's three sets as shipped with the package (``sets/README.md``: sources and licences).
PACKAGED_SETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sets")
#: ``data_dir`` value that loads the names from the Hugging Face Hub (a directory named so: ``./hub``).
HUB = "hub"
ROW_FIELDS = "JSON Lines, one problem per line, with fields problem and answer, id optional"
_PROBLEM_KEYS = ("problem", "question")
_ANSWER_KEYS = ("answer", "gold")
#: Seconds to wait for the Hub's host before saying it cannot be reached (never a retry loop).
HUB_PROBE_TIMEOUT = 1.5
#: What a Hub set's recorded revision says when none was pinned (``--data_revision`` left out).
UNPINNED = "main (unpinned)"


@dataclass(frozen=True)
class Problem:
    benchmark: str
    id: str
    problem: str
    answer: str


def load_benchmark(spec: str, data_dir: str | None = None, revision: str | None = None) -> tuple[str, list[Problem]]:
    """Resolve ``spec`` (a known name or a ``.jsonl`` path) to (benchmark name, problems); ``revision``:
    the Hub's (with ``data_dir="hub"``).

    Raises:
        ConfigError: an unknown name, a missing data directory or file in it, the Hub unreachable.
        InputFileError: a ``.jsonl`` path that does not exist, a bad row (naming ``file:line``), an empty file.
    """
    return load_benchmark_source(spec, data_dir, revision)[:2]


def load_benchmark_source(spec: str, data_dir: str | None = None,
                          revision: str | None = None) -> tuple[str, list[Problem], dict]:
    """``load_benchmark`` and where the problems came from: ``{"file", "sha256"}``, or ``{"hub", "split",
    "revision", "fingerprint"}`` (revision ``UNPINNED`` when none was given; fingerprint: ``datasets``'
    own of the loaded split, None where it has none)."""
    path = benchmark_file(spec, data_dir)
    name = os.path.splitext(os.path.basename(spec))[0] if _is_path(spec) else spec
    if path is None:
        return (name, *_load_hf_dataset(name, revision))
    with open(path, "rb") as f:
        source = {"file": os.path.abspath(path), "sha256": hashlib.sha256(f.read()).hexdigest()}
    return name, read_problems_jsonl(path, name), source


def load_problems(config) -> tuple[dict[str, list[Problem]], dict[str, dict]]:
    """All benchmarks of ``config`` (an ``EvalConfig``: not imported, it imports this module), validated before any
    model is loaded, and where each came from (summary.json's ``data_sources``)."""
    out: dict[str, list[Problem]] = {}
    sources: dict[str, dict] = {}
    for spec in config.benchmarks:
        name, problems, source = load_benchmark_source(spec, config.data_dir, config.data_revision)
        if name in out:
            raise ConfigError("benchmarks", f"{name!r} given twice")
        sources[name] = source
        out[name] = problems[:config.limit] if config.limit else problems
    return out, sources


def check_benchmarks(benchmarks: tuple[str, ...], data_dir: str | None) -> None:
    """Every benchmark's file exists (or it comes from the Hub): cheap, a config's first check."""
    for spec in benchmarks:
        benchmark_file(spec, data_dir, benchmarks)


def benchmark_file(spec: str, data_dir: str | None, benchmarks: tuple[str, ...] = ()) -> str | None:
    """The JSONL file ``spec`` is read from (None: the Hub); a missing one is a one-line error
    naming the files and fields expected (``benchmarks``: all the names asked for, for the message)."""
    if _is_path(spec):
        if not os.path.isfile(spec):
            what = "is a directory, not a file" if os.path.isdir(spec) else "does not exist"
            raise InputFileError(spec, f"{what} (a benchmark file: {ROW_FIELDS})")
        return spec
    if spec not in KNOWN_BENCHMARKS:
        raise ConfigError("benchmarks", f"unknown benchmark {spec!r}: use one of {sorted(KNOWN_BENCHMARKS)} or a "
                                        "path to a .jsonl file")
    if data_dir == HUB:
        return None
    if data_dir is None:
        return os.path.join(PACKAGED_SETS, f"{spec}.jsonl")
    names = [b for b in benchmarks if b in KNOWN_BENCHMARKS] or [spec]
    expected = (f"it should hold {', '.join(f'{b}.jsonl' for b in names)} ({ROW_FIELDS}); leave --data_dir out "
                f"to use the sets shipped with phf-megatron, or --data_dir={HUB} for the Hugging Face Hub")
    if not os.path.isdir(data_dir):
        raise ConfigError("data_dir", f"{data_dir} is not a directory: {expected}")
    path = os.path.join(data_dir, f"{spec}.jsonl")
    if not os.path.isfile(path):
        raise ConfigError("data_dir", f"{path} does not exist: {expected}")
    return path


def _is_path(spec: str) -> bool:
    return spec.endswith(".jsonl") or os.path.sep in spec


def read_problems_jsonl(path: str, benchmark: str) -> list[Problem]:
    """Rows of a JSONL file, validated; blank lines are skipped."""
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    with open(path, "rb") as f:   # binary: a line that is not UTF-8 is named, not a UnicodeDecodeError
        for lineno, raw in numbered_lines(f):   # a BOM (a file saved by Excel) dropped
            where = f"{path}:{lineno}"
            try:
                line = utf8_line(raw)
            except ValueError as exc:
                raise InputFileError(where, str(exc)) from None
            if not line.strip():
                continue
            try:
                row = json.loads(line.rstrip("\r\n"))   # its column, not "line 2 column 1" past the newline
            except json.JSONDecodeError as exc:   # "Unterminated string starting at": where, not a dangling "at"
                msg = exc.msg.removesuffix(" at")
                raise InputFileError(where, f"invalid JSON ({msg} at column {exc.colno})") from None
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


def _load_hf_dataset(name: str, revision: str | None) -> tuple[list[Problem], dict]:
    repo, split, id_col = KNOWN_BENCHMARKS[name]
    where = f"benchmark {name!r} from the Hub ({repo}{'' if revision is None else '@' + revision})"
    try:
        import datasets
    except ImportError:
        raise ConfigError("data_dir", f"{where} needs the `datasets` package (pip install datasets); leave "
                                      "--data_dir out to use the sets shipped with phf-megatron") from None
    if not _hub_offline():
        _probe_hub(where)
    try:
        rows = datasets.load_dataset(repo, split=split, revision=revision)
    except Exception as exc:
        detail = str(exc).splitlines()[0] if str(exc) else ""
        raise ConfigError("data_dir", f"{where} could not be loaded ({type(exc).__name__}: {detail}); leave "
                                      "--data_dir out to use the sets shipped with phf-megatron") from exc
    out = []
    for i, row in enumerate(rows):
        answer = row.get("answer")
        if answer is None or not str(answer).strip():
            raise InputFileError(f"{repo}[{i}]", "row has no answer")
        out.append(Problem(name, str(row.get(id_col, i)), row["problem"], str(answer).strip()))
    source = {"hub": repo, "split": split, "revision": revision or UNPINNED,
              "fingerprint": getattr(rows, "_fingerprint", None)}   # a Dataset's; no public name for it
    return out, source


def _hub_offline() -> bool:
    """HF_HUB_OFFLINE / HF_DATASETS_OFFLINE: the cache only (``datasets`` then fails at once when a set is not in it)."""
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def _probe_hub(where: str) -> None:
    """One connection to the Hub's host, ``HUB_PROBE_TIMEOUT`` seconds at most: without network
    ``datasets`` would retry for half a minute before a vague error."""
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=HUB_PROBE_TIMEOUT).close()
    except OSError as exc:
        raise ConfigError("data_dir", f"{where}: {host}:{port} cannot be reached ({exc.strerror or exc}); "
                                      "leave --data_dir out to use the sets shipped with phf-megatron, or set "
                                      "HF_HUB_OFFLINE=1 to read the datasets cache") from None
