"""Read an OPSD-format math set from JSONL, Parquet/Arrow, or a HF dataset name/directory.

``load_math_dataset(source)`` picks the reader from the source:

* a ``.jsonl`` / ``.json`` file: one JSON object per line (blank lines ignored);
* a ``.parquet`` or ``.arrow`` file (needs ``pyarrow``);
* a directory written by ``datasets.save_to_disk`` (needs ``datasets``);
* another directory: every ``.jsonl`` / ``.parquet`` / ``.arrow`` file below it, in sorted
  order, restricted to the files whose name contains ``split`` when there are such files
  (a Hub snapshot such as ``data/train-00000-of-00002.parquet``);
* a missing path (a data file's suffix, a leading ``/``, ``.`` or ``~``, or two slashes or more) is
  "does not exist";
* anything else is taken as a HF Hub dataset name, ``owner/name`` (needs ``datasets``), e.g. the
  official ``siyanzhao/Openthoughts_math_30k_opsd`` (29,434 rows, split ``train``).

Every row is validated (:func:`phf_megatron.data.rows.validate_row`). A bad row raises
:class:`BadRowError` naming its file and 1-based line (or row), unless ``skip_bad_rows`` is set:
then it is skipped and counted in ``MathDataset.skipped``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from ..errors import InputFileError, UserError
from ..input_files import numbered_lines, utf8_line
from .rows import BadRowError, FieldNames, MathRow, validate_row

JSONL_SUFFIXES = (".jsonl", ".json")
ARROW_SUFFIXES = (".parquet", ".arrow")
HF_DISK_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
MAX_REPORTED_BAD_ROWS = 20


@dataclass
class MathDataset(Sequence[MathRow]):
    """Validated rows, plus what was skipped. ``skipped_reasons`` keeps the first 20 messages."""

    rows: list[MathRow]
    source: str
    skipped: int = 0
    skipped_reasons: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index):
        return self.rows[index]


class _Unreadable:
    """A record that could not even be parsed (bad JSON): validated as a bad row."""

    def __init__(self, reason: str):
        self.reason = reason


def _require(module: str, what: str):
    try:
        return __import__(module, fromlist=["_"])
    except ImportError as err:
        raise ImportError(f"{what} needs the `{module}` package: pip install {module} "
                          f"(or pip install 'phf-megatron[data]')") from err


def iter_jsonl(path: str) -> Iterator[tuple[str, Any]]:
    """``(origin, record)`` per non-blank line; ``origin = "path:line"`` (1-based)."""
    with open(path, "rb") as f:   # binary: a line that is not UTF-8 is a bad row, not a UnicodeDecodeError
        for line_no, raw in numbered_lines(f):   # a BOM (a file saved by Excel) dropped
            try:
                line = utf8_line(raw)
            except ValueError as err:
                yield f"{path}:{line_no}", _Unreadable(str(err))
                continue
            if not line.strip():
                continue
            try:
                record = json.loads(line.rstrip("\r\n"))   # its column, not "line 2 column 1" past the newline
            except json.JSONDecodeError as err:
                record = _Unreadable(f"invalid JSON ({err.msg} at column {err.colno})")
            yield f"{path}:{line_no}", record


def iter_arrow_file(path: str) -> Iterator[tuple[str, Any]]:
    """``(origin, record)`` per row of a Parquet or Arrow (IPC stream/file) table; a damaged file
    raises ``InputFileError`` naming it (pyarrow's "Parquet magic bytes not found" does not)."""
    try:
        yield from _arrow_rows(path)
    except (ValueError, OSError) as err:   # pyarrow's ArrowInvalid is a ValueError, ArrowIOError an OSError
        if isinstance(err, UserError):
            raise
        kind = "Parquet" if path.endswith(".parquet") else "Arrow"
        raise InputFileError(path, f"not a readable {kind} file, truncated or corrupt ({err})") from None


def _arrow_rows(path: str) -> Iterator[tuple[str, Any]]:
    if path.endswith(".parquet"):
        pq = _require("pyarrow.parquet", f"reading Parquet ({path})")
        batches = pq.ParquetFile(path).iter_batches()
    else:
        ipc = _require("pyarrow.ipc", f"reading Arrow ({path})")
        try:
            batches = iter(ipc.open_stream(path))
        except Exception:  # noqa: BLE001 - not a stream: try the random-access file format
            reader = ipc.open_file(path)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
    row_no = 0
    for batch in batches:
        for record in batch.to_pylist():
            row_no += 1
            yield f"{path} row {row_no}", record


def iter_hf_dataset(dataset, name: str) -> Iterator[tuple[str, Any]]:
    for row_no, record in enumerate(dataset, start=1):
        yield f"{name} row {row_no}", record


def _is_hf_disk_dir(path: str) -> bool:
    return any(os.path.exists(os.path.join(path, m)) for m in HF_DISK_MARKERS)


def _data_files(directory: str, split: str) -> list[str]:
    found = []
    for root, _, files in os.walk(directory):
        found += [os.path.join(root, f) for f in files if f.endswith(JSONL_SUFFIXES + ARROW_SUFFIXES)]
    found.sort()
    in_split = [f for f in found if split in os.path.basename(f)]
    return in_split or found


def _load_hf(source: str, split: str):
    ds_lib = _require("datasets", f"loading the HF dataset {source!r}")
    try:
        if os.path.isdir(source):
            loaded = ds_lib.load_from_disk(source)
        else:
            loaded = ds_lib.load_dataset(source, split=split)
    except ConnectionError as err:  # not cached, and offline mode or no network
        raise ValueError(
            f"source: the HF dataset {source!r} is not in the local cache and the Hub cannot be reached (no network, "
            f"or offline mode: HF_HUB_OFFLINE=1); pass a local copy instead, a JSONL / Parquet / Arrow file or a "
            f"save_to_disk directory with problem and solution fields (made where there is network with "
            f"datasets.load_dataset({source!r}, split={split!r}).to_parquet('train.parquet'))") from err
    except Exception as err:  # noqa: BLE001 - re-raised with the source named
        raise ValueError(f"source: could not load HF dataset {source!r} (split {split!r}): {err}") from err
    if isinstance(loaded, ds_lib.DatasetDict):
        if split not in loaded:
            raise ValueError(f"split: {split!r} is not in {source!r} (splits: {sorted(loaded)})")
        loaded = loaded[split]
    return loaded


def missing_source(source: str) -> str | None:
    """``"'<source>' does not exist"`` when ``source`` is a local path that is not there (a data file's suffix, a
    leading ``/``, ``.`` or ``~``, or two slashes or more: a Hub name is owner/name, runs/x/train.jsnl is a path);
    None when it is there or may be a Hub name. Cheap: the trainer asks before anything heavy loads."""
    if os.path.exists(source) or not (source.endswith(JSONL_SUFFIXES + ARROW_SUFFIXES)
                                      or source.startswith(("/", ".", "~")) or source.count("/") > 1):
        return None
    return f"{source!r} does not exist"


def iter_records(source: str, split: str = "train") -> Iterator[tuple[str, Any]]:
    """``(origin, record)`` for every row of ``source`` (see the module docstring)."""
    if os.path.isfile(source):
        if source.endswith(JSONL_SUFFIXES):
            yield from iter_jsonl(source)
        elif source.endswith(ARROW_SUFFIXES):
            yield from iter_arrow_file(source)
        else:
            raise ValueError(f"source: {source!r} is not .jsonl/.json/.parquet/.arrow")
    elif os.path.isdir(source) and _is_hf_disk_dir(source):
        yield from iter_hf_dataset(_load_hf(source, split), source)
    elif os.path.isdir(source):
        files = _data_files(source, split)
        if not files:
            raise ValueError(f"source: directory {source!r} holds no .jsonl/.parquet/.arrow file")
        for path in files:
            yield from iter_records(path, split)
    elif why := missing_source(source):
        raise ValueError(f"source: {why}")
    else:
        yield from iter_hf_dataset(_load_hf(source, split), source)


def load_math_dataset(
    source: str,
    split: str = "train",
    skip_bad_rows: bool = False,
    fields: FieldNames = FieldNames(),
) -> MathDataset:
    """Read and validate every row of ``source``.

    Raises:
        BadRowError: on the first bad row (its file and 1-based line/row named), unless
            ``skip_bad_rows``; also when no valid row is left.
    """
    if not isinstance(source, str) or not source:
        raise ValueError(f"source: expected a path or a dataset name, got {source!r}")
    out = MathDataset(rows=[], source=source)
    for origin, record in iter_records(source, split):
        try:
            if isinstance(record, _Unreadable):
                raise BadRowError(f"{origin}: {record.reason}")
            out.rows.append(validate_row(record, origin, fields))
        except BadRowError as err:
            if not skip_bad_rows:
                raise
            out.skipped += 1
            if len(out.skipped_reasons) < MAX_REPORTED_BAD_ROWS:
                out.skipped_reasons.append(str(err))
    if not out.rows:
        raise BadRowError(f"{source}: no valid row (skipped {out.skipped} bad row(s))")
    return out
