"""Math-set loading: per-row validation names file and 1-based line; skipping counts; readers."""

import json
import sys

import pytest

from phf_megatron.data import BadRowError, FieldNames, MathRow, load_math_dataset, validate_row
from tests.helpers import EXAMPLE_MATH

GOOD = {"problem": "What is 1+1?", "solution": "1+1=2, so \\boxed{2}.", "answer": "2"}


def write_jsonl(path, lines):
    with open(path, "wb") as f:   # a bytes line is written as it is (not UTF-8: a latin-1 file)
        for line in lines:
            f.write(line if isinstance(line, bytes) else (line if isinstance(line, str) else json.dumps(line)).encode())
            f.write(b"\n")
    return str(path)


def test_good_rows_are_read_in_order_with_their_origin(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [GOOD, "", {**GOOD, "problem": "P2", "answer": 7}])
    ds = load_math_dataset(path)
    assert len(ds) == 2 and ds.skipped == 0
    assert ds[0] == MathRow(GOOD["problem"], GOOD["solution"], "2", f"{path}:1")
    assert ds[1].problem == "P2" and ds[1].answer == "7" and ds[1].origin == f"{path}:3"  # blank line 2 counted


@pytest.mark.parametrize("bad, reason", [
    ({"solution": "s"}, "missing field 'problem'"),
    ({"problem": "p"}, "missing field 'solution'"),
    ({"problem": 3, "solution": "s"}, "field 'problem' must be a string"),
    ({"problem": "  ", "solution": "s"}, "field 'problem' is empty"),
    ({"problem": "p", "solution": "s", "answer": [1]}, "field 'answer' must be a string or a number"),
    ({"problem": "p", "solution": "s", "answer": True}, "got bool"),
    ([1, 2], "expected a JSON object"),
    ("{not json", "invalid JSON"),
    ('{"problem": "p",', "invalid JSON (Expecting property name enclosed in double quotes at column 17)"),  # was 1
    ('{"problem": "caf\xe9", "solution": "s"}'.encode("latin-1"), "not UTF-8 text at byte 16 of the line"),
])
def test_bad_row_error_names_file_and_line(tmp_path, bad, reason):
    path = write_jsonl(tmp_path / "train.jsonl", [GOOD, GOOD, GOOD, bad, GOOD])
    with pytest.raises(BadRowError) as err:
        load_math_dataset(path)
    assert str(err.value).startswith(f"{path}:4: ") and reason in str(err.value)


def test_a_utf8_bom_at_the_start_is_dropped(tmp_path):
    """A file saved by Windows Notepad or Excel starts with a BOM: json.loads refused the first row
    ("Unexpected UTF-8 BOM"). Only the file's start is a BOM's place: inside a line it is data."""
    path = write_jsonl(tmp_path / "train.jsonl", [b"\xef\xbb\xbf" + json.dumps(GOOD).encode(), GOOD])
    plain = write_jsonl(tmp_path / "plain.jsonl", [GOOD, GOOD])
    assert [(r.problem, r.solution, r.answer) for r in load_math_dataset(path)] == \
           [(r.problem, r.solution, r.answer) for r in load_math_dataset(plain)]
    path = write_jsonl(tmp_path / "train.jsonl", [GOOD, b"\xef\xbb\xbf" + json.dumps(GOOD).encode()])
    with pytest.raises(BadRowError, match=f"{path}:2: .*BOM"):
        load_math_dataset(path)


def test_skip_bad_rows_counts_and_reports(tmp_path):
    lines = [GOOD, {"problem": "p"}, "garbage", GOOD, {"problem": "", "solution": "s"}, GOOD]
    path = write_jsonl(tmp_path / "train.jsonl", lines)
    ds = load_math_dataset(path, skip_bad_rows=True)
    assert len(ds) == 3 and ds.skipped == 3
    assert [r.split(": ")[0] for r in ds.skipped_reasons] == [f"{path}:{i}" for i in (2, 3, 5)]
    assert [r.origin for r in ds] == [f"{path}:{i}" for i in (1, 4, 6)]


def test_all_rows_bad_is_an_error_even_when_skipping(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"x": 1}, {"y": 2}])
    with pytest.raises(BadRowError, match="no valid row.*skipped 2"):
        load_math_dataset(path, skip_bad_rows=True)


def test_custom_field_names():
    row = validate_row({"question": "q", "reference": "r"}, "mem:1", FieldNames("question", "reference", None))
    assert (row.problem, row.solution, row.answer) == ("q", "r", None)
    with pytest.raises(ValueError, match="solution: the field name"):
        FieldNames("problem", "problem")


def test_directory_reads_split_files_in_sorted_order(tmp_path):
    (tmp_path / "data").mkdir()
    write_jsonl(tmp_path / "data" / "train-00001.jsonl", [{**GOOD, "problem": "B"}])
    write_jsonl(tmp_path / "data" / "train-00000.jsonl", [{**GOOD, "problem": "A"}])
    write_jsonl(tmp_path / "data" / "test-00000.jsonl", [{**GOOD, "problem": "T"}])
    assert [r.problem for r in load_math_dataset(str(tmp_path))] == ["A", "B"]
    assert [r.problem for r in load_math_dataset(str(tmp_path), split="test")] == ["T"]


def test_missing_paths_and_unknown_suffixes_are_named(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_math_dataset(str(tmp_path / "nope.jsonl"))
    # a relative path with a mistyped suffix was read as a Hub name: "could not load HF dataset 'runs/x/train.jsnl'"
    with pytest.raises(ValueError, match=r"^source: 'runs/phf_tiny/toy/train.jsnl' does not exist$"):
        load_math_dataset("runs/phf_tiny/toy/train.jsnl")
    other = tmp_path / "rows.csv"
    other.write_text("problem,solution\n")
    with pytest.raises(ValueError, match="rows.csv.*is not"):
        load_math_dataset(str(other))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no .jsonl/.parquet/.arrow"):
        load_math_dataset(str(tmp_path / "empty"))


def test_parquet_without_pyarrow_is_a_clear_error(tmp_path, monkeypatch):
    path = tmp_path / "train.parquet"
    path.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ImportError, match="reading Parquet .*needs the `pyarrow.parquet` package"):
        load_math_dataset(str(path))


def test_hf_name_without_datasets_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ImportError, match="siyanzhao/Openthoughts_math_30k_opsd.*needs the `datasets` package"):
        load_math_dataset("siyanzhao/Openthoughts_math_30k_opsd")


def test_parquet_rows_name_file_and_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    rows = [GOOD, {"problem": "p", "solution": None, "answer": None}, GOOD]
    path = str(tmp_path / "train.parquet")
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=2)
    with pytest.raises(BadRowError, match=f"{path} row 2: field 'solution' must be a string"):
        load_math_dataset(path)
    ds = load_math_dataset(path, skip_bad_rows=True)
    assert len(ds) == 2 and ds.skipped == 1 and ds[1].origin == f"{path} row 3"


@pytest.mark.parametrize("name, kind, keep", [("train.parquet", "Parquet", 0.5), ("train.arrow", "Arrow", 0.02)])
def test_a_damaged_parquet_or_arrow_file_is_named(tmp_path, name, kind, keep):
    """pyarrow's "Parquet magic bytes not found in footer" named no file (the trainer printed it after
    --data.path, which may be a directory of many)."""
    import pyarrow as pa
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    from phf_megatron.errors import InputFileError

    path = tmp_path / "data" / name
    path.parent.mkdir()
    table = pa.Table.from_pylist([GOOD] * 50)
    pq.write_table(table, path) if kind == "Parquet" else feather.write_feather(table, path, compression="uncompressed")
    assert len(load_math_dataset(str(tmp_path / "data"))) == 50
    with open(path, "r+b") as f:
        f.truncate(int(path.stat().st_size * keep))
    with pytest.raises(InputFileError) as err:
        load_math_dataset(str(tmp_path / "data"))
    assert err.value.path == str(path) and err.value.detail.startswith(f"not a readable {kind} file, truncated or "
                                                                      "corrupt ("), err.value


@pytest.fixture(scope="module")
def opsd_rows():
    """40 rows of the OPSD schema (problem, solution; no answer column), from the example math set."""
    with open(EXAMPLE_MATH, encoding="utf-8") as f:
        rows = [json.loads(line) for _, line in zip(range(40), f)]
    return [{"problem": r["problem"], "solution": r["solution"]} for r in rows]


def _as_read(ds):
    return [(r.problem, r.solution, r.answer) for r in ds]


def test_opsd_rows_read_the_same_from_jsonl_parquet_arrow_and_save_to_disk(tmp_path, opsd_rows):
    """Every reader of the data extra (pyarrow, datasets) gives the JSONL reader's rows, in order."""
    import datasets
    import pyarrow as pa
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    want = _as_read(load_math_dataset(write_jsonl(tmp_path / "train.jsonl", opsd_rows)))
    assert len(want) == 40 and all(answer is None for _, _, answer in want)    # the OPSD schema has no answer
    table = pa.Table.from_pylist(opsd_rows)
    pq.write_table(table, tmp_path / "train.parquet", row_group_size=16)
    with ipc.new_file(tmp_path / "file.arrow", table.schema) as w:      # Arrow IPC file format
        w.write_table(table, max_chunksize=16)
    with ipc.new_stream(tmp_path / "stream.arrow", table.schema) as w:  # IPC stream (datasets' shards)
        w.write_table(table, max_chunksize=16)
    datasets.Dataset.from_list(opsd_rows).save_to_disk(str(tmp_path / "disk"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(opsd_rows),
                          "test": datasets.Dataset.from_list(opsd_rows[:3])}).save_to_disk(str(tmp_path / "dict"))
    hub = tmp_path / "snapshot" / "data"                                 # a Hub snapshot's layout
    hub.mkdir(parents=True)
    pq.write_table(table.slice(0, 25), hub / "train-00000-of-00002.parquet")
    pq.write_table(table.slice(25), hub / "train-00001-of-00002.parquet")
    pq.write_table(table.slice(0, 3), hub / "test-00000-of-00001.parquet")

    for source in ("train.parquet", "file.arrow", "stream.arrow", "disk", "dict", "snapshot"):
        ds = load_math_dataset(str(tmp_path / source))
        assert _as_read(ds) == want, source
        assert ds.skipped == 0 and ds[39].origin.endswith(("row 40", "row 15")), (source, ds[39].origin)
    assert _as_read(load_math_dataset(str(tmp_path / "dict"), split="test")) == want[:3]
    assert _as_read(load_math_dataset(str(tmp_path / "snapshot"), split="test")) == want[:3]
    with pytest.raises(ValueError, match=r"split: 'validation' is not in .*dict.* \(splits: \['test', 'train'\]\)"):
        load_math_dataset(str(tmp_path / "dict"), split="validation")


def test_hub_name_without_network_is_a_one_line_error(tmp_path, monkeypatch):
    """The launchers' default DATA is a Hub name: offline (CI) it must say what to do instead."""
    import datasets
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path))   # nothing cached
    name = "siyanzhao/Openthoughts_math_30k_opsd"                              # data.path's default
    with pytest.raises(ValueError) as err:
        load_math_dataset(name)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"source: the HF dataset '{name}' is not in the local cache")
    assert "no network, or offline mode" in msg and "pass a local copy instead" in msg and ".to_parquet(" in msg


def test_hf_save_to_disk_directory(tmp_path):
    import datasets
    import pyarrow as pa
    table = datasets.table.InMemoryTable(pa.Table.from_pylist([GOOD, {**GOOD, "problem": "P2"}]))
    datasets.Dataset(table, fingerprint="test").save_to_disk(str(tmp_path / "ds"))  # no dill hashing
    ds = load_math_dataset(str(tmp_path / "ds"))
    assert [r.problem for r in ds] == [GOOD["problem"], "P2"] and ds[1].origin.endswith("ds row 2")
    # The shard itself is an Arrow IPC stream, readable without `datasets`.
    shard = next(str(p) for p in (tmp_path / "ds").iterdir() if p.suffix == ".arrow")
    assert [r.origin for r in load_math_dataset(shard)] == [f"{shard} row 1", f"{shard} row 2"]


def test_example_math_set_loads():
    ds = load_math_dataset(EXAMPLE_MATH)
    assert len(ds) == 399 and ds.skipped == 0 and all(r.answer for r in ds)
