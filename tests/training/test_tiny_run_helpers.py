"""The trainer tests' own checks (``tests/helpers/tiny_run.py``) can fail: a check that cannot is no test."""

from __future__ import annotations

import json
import os

import pytest

from ..helpers.tiny_run import assert_same_steps


def _log(run_dir, rows: list[dict]) -> str:
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return str(run_dir)


def test_assert_same_steps_compares_every_step_of_both_runs(tmp_path):
    rows = [{"step": i, "loss": 0.5 * i} for i in (1, 2, 3)]
    straight = _log(tmp_path / "straight", rows)
    assert_same_steps(straight, _log(tmp_path / "same", rows), ("loss",), 3)
    with pytest.raises(AssertionError):   # step 3 differs
        assert_same_steps(straight, _log(tmp_path / "other", rows[:2] + [{"step": 3, "loss": 9.0}]), ("loss",), 3)
    # a straight run that logged fewer steps compares nothing past them: before, zip() stopped there and passed
    with pytest.raises(AssertionError):
        assert_same_steps(_log(tmp_path / "short", rows[:2]), _log(tmp_path / "resumed", rows[:2] + [{"step": 3, "loss": 9.0}]),
                          ("loss",), 3)
