"""Sample records: a torn last line is cut off, duplicates are ignored, corruption is named."""

import json
import os

import pytest

from phf_megatron.eval.records import SampleWriter, load_records, repair_torn_tail, shard_path


def _rec(pid, i, **extra):
    return {"benchmark": "b", "problem_id": pid, "sample_index": i, **extra}


def test_torn_tail_is_ignored_on_load_and_cut_before_appending(tmp_path):
    path = shard_path(str(tmp_path), 0)
    with SampleWriter(path) as w:
        w.write([_rec("p", 0), _rec("p", 1)])
    with open(path, "a") as f:
        f.write('{"benchmark": "b", "problem_id": "p", "sampl')      # killed mid-write
    records, dups = load_records(str(tmp_path))
    assert sorted(records) == [("b", "p", 0), ("b", "p", 1)] and dups == 0
    with SampleWriter(path) as w:                                       # the rerun appends
        w.write([_rec("p", 2)])
    with open(path) as f:
        assert [json.loads(line)["sample_index"] for line in f] == [0, 1, 2]
    assert repair_torn_tail(path) == 0


def test_a_line_cut_inside_a_character_is_a_torn_tail(tmp_path):
    """Records are written with ensure_ascii=False (outputs hold ≤, π, ...): a kill could cut a line
    inside a character, and the rerun stopped on a UnicodeDecodeError traceback before resuming."""
    path = shard_path(str(tmp_path), 0)
    with SampleWriter(path) as w:
        w.write([_rec("p", 0, output="x ≤ π"), _rec("p", 1, output="x ≤ π")])
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[:data.rindex("≤".encode()) + 2])                   # killed inside sample 1's ≤
    records, _ = load_records(str(tmp_path))
    assert sorted(records) == [("b", "p", 0)] and records[("b", "p", 0)]["output"] == "x ≤ π"
    with SampleWriter(path) as w:                                           # the rerun redoes sample 1
        w.write([_rec("p", 1, output="y")])
    assert [r["output"] for _, r in sorted(load_records(str(tmp_path))[0].items())] == ["x ≤ π", "y"]
    with open(path, "wb") as f:                                             # not UTF-8 in a whole line: named
        f.write(data.replace("≤".encode(), b"\xe2", 1))
    at = data.index("≤".encode())
    with pytest.raises(ValueError, match=f"{os.path.basename(path)}:1: not UTF-8 text at byte {at} of the line$"):
        load_records(str(tmp_path))


def test_first_record_of_a_key_wins_across_shards(tmp_path):
    with SampleWriter(shard_path(str(tmp_path), 0)) as w:
        w.write([_rec("p", 0, output="first")])
    with SampleWriter(shard_path(str(tmp_path), 1)) as w:
        w.write([_rec("p", 0, output="second"), _rec("q", 0)])
    records, dups = load_records(str(tmp_path))
    assert records[("b", "p", 0)]["output"] == "first" and dups == 1 and len(records) == 2


def test_corrupt_line_in_the_middle_is_named(tmp_path):
    path = shard_path(str(tmp_path), 0)
    with open(path, "w") as f:
        f.write(json.dumps(_rec("p", 0)) + "\nGARBAGE\n" + json.dumps(_rec("p", 1)) + "\n")
    with pytest.raises(ValueError, match=f"{os.path.basename(path)}:2: corrupt sample record"):
        load_records(str(tmp_path))
