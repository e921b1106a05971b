"""benchmarks/sdpa_plans.py on CPU (``--tiny``): both measurements run, each over lengths no earlier call met (the
plan-build cost it looks for is a first meeting), our attention's backends (models/attention.py) recorded by name."""

import json

from benchmarks.sdpa_plans import main


def test_each_measurement_meets_only_new_lengths_and_the_json_is_written(tmp_path):
    out = main(["--tiny", "--lengths", "4", "--out", str(tmp_path / "sdpa.json")])
    all_backends, segment = out["runs"]
    assert all_backends["backends"] == "all"
    assert segment["backends"] == ["FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"]   # no cuDNN (models/attention.py)
    first, second = set(all_backends["lengths"]), set(segment["lengths"])
    assert len(first) == len(second) == 4 and not first & second
    assert all(r["new_s"] > 0 and r["again_s"] > 0 for r in out["runs"])
    assert json.loads((tmp_path / "sdpa.json").read_text())["runs"][1]["lengths"] == segment["lengths"]
