"""Per-sample records: append-only JSONL shards, fsynced, deduplicated on load.

A run directory holds ``samples.rank<r>.jsonl`` (one shard per data-parallel worker; rank 0
alone without data parallelism). Each finished sample is one line, written and fsynced before
the next chunk starts, so a kill loses at most the chunk in flight. A line cut short by a kill
is cut off (truncated to the last newline) before the shard is appended to again. On load,
the first record of each key ``(benchmark, problem_id, sample_index)`` wins; later duplicates
(impossible unless shards were copied around) are ignored and counted.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import hashlib
import json
import os
from collections.abc import Iterable
from importlib.metadata import version

from ..errors import InputFileError
from ..input_files import read_lines
from ..output_files import writing
from .config import GRADERS
from .grading import grade, official_boxed_answer

SHARD_GLOB = "samples.rank*.jsonl"


@functools.cache
def grader_version() -> str:
    """The installed math-verify's version (records store the one that graded them)."""
    return version("math-verify")


def grade_record(record: dict, require_boxed: bool) -> dict:
    """``record`` with its answer (the official extraction; ``boxed``: one was found), both
    graders' verdicts, ``correct = {"official": ..., "extended": ...}``, and the math-verify
    version that gave them."""
    pred = official_boxed_answer(record["output"])
    return {**record, "pred": pred, "boxed": pred is not None, "require_boxed": require_boxed,
            "correct": grade(record["output"], record["gold"], require_boxed=require_boxed),
            "math_verify": grader_version()}


def needs_grading(record: dict, require_boxed: bool, gold: str | None = None) -> bool:
    """True for a record graded under another rule, against another answer than ``gold`` (the
    benchmark's now; None: the one stored), by another math-verify, or before both graders were recorded."""
    correct = record.get("correct")
    return (record.get("require_boxed") != require_boxed or not isinstance(correct, dict)
            or set(correct) != set(GRADERS) or (gold is not None and record.get("gold") != gold)
            or record.get("math_verify") != grader_version())


def problem_digest(text: str) -> str:
    """A record's ``problem_sha256``: the first 16 hex digits of its problem text's SHA-256 (a resume
    keeps a sample only for the problem it was generated for: ``other_problems``)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def other_problems(records: dict, digests: dict[tuple[str, str], str]) -> list[tuple[str, str]]:
    """The ``(benchmark, problem_id)`` whose records were generated for another problem text than
    ``digests`` says (an edited file, another --data_dir: same ids, other problems); records written
    before they stored the digest are taken as they are."""
    return sorted({key[:2] for key, rec in records.items()
                   if key[:2] in digests and rec.get("problem_sha256", digests[key[:2]]) != digests[key[:2]]})


def sample_key(record: dict) -> tuple[str, str, int]:
    return record["benchmark"], record["problem_id"], int(record["sample_index"])


def shard_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, f"samples.rank{rank}.jsonl")


def _complete_size(f) -> tuple[int, int]:
    """``(size, bytes up to and with the last newline)`` of a shard open in binary: what is left of it once a
    trailing partial line (a kill mid-write) is cut."""
    size = f.seek(0, os.SEEK_END)
    pos = size
    while pos > 0:                                   # scan back for the last newline
        step = min(1 << 16, pos)
        f.seek(pos - step)
        nl = f.read(step).rfind(b"\n")
        if nl >= 0:
            return size, pos - step + nl + 1
        pos -= step
    return size, 0


def complete_size(path: str) -> int:
    """The bytes of shard ``path`` before its torn tail, if any (``repair_torn_tail`` cuts there); 0 without it."""
    if not os.path.isfile(path):
        return 0
    with open(path, "rb") as f:
        return _complete_size(f)[1]


def repair_torn_tail(path: str) -> int:
    """Drop a trailing partial line (no final newline); returns the bytes removed."""
    if not os.path.isfile(path):
        return 0
    with open(path, "rb+") as f:
        size, keep = _complete_size(f)
        if keep == size:
            return 0
        f.truncate(keep)
        f.flush()
        os.fsync(f.fileno())
        return size - keep


class SampleWriter:
    """Appends records to one shard; each ``write`` is flushed and fsynced."""

    def __init__(self, path: str):
        repair_torn_tail(path)
        self.path = path
        self._f = open(path, "a", encoding="utf-8")

    def write(self, records: Iterable[dict]) -> None:
        lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        if lines:
            with writing(self.path):            # a full disk names the shard (a torn line is cut on resume)
                self._f.write(lines)
                self._f.flush()
                os.fsync(self._f.fileno())

    def close(self) -> None:
        with contextlib.suppress(OSError):      # the failed flush of a full disk is already reported
            self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def load_records(run_dir: str) -> tuple[dict[tuple[str, str, int], dict], int]:
    """All finished samples of a run, keyed; returns (records, duplicates ignored).

    A torn final line of a shard (a kill mid-write) is skipped; a malformed line elsewhere is
    an error naming ``file:line``.
    """
    records: dict[tuple[str, str, int], dict] = {}
    duplicates = 0
    for path in sorted(glob.glob(os.path.join(run_dir, SHARD_GLOB))):
        lines = read_lines(path)                     # a kill may cut a line inside a character
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                key = sample_key(rec)
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                if lineno == len(lines):             # torn tail: no newline after it
                    continue
                raise InputFileError(f"{path}:{lineno}", f"corrupt sample record ({exc})") from None
            if key in records:
                duplicates += 1
                continue
            records[key] = rec
    return records, duplicates
