"""The toy prototype runs end to end, and with a teacher that sees the student's own prompt its
first OPSD and flow losses are zero: prompts, rollouts, masks and windows line up exactly."""

import importlib.util
import json
import os
import sys


SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "toy_opsd_prototype.py")


def test_self_teacher_gives_zero_losses(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("toy_opsd_prototype", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    argv = ["prog", "--warmup-steps", "3", "--opsd-steps", "1", "--batch", "8", "--eval-every", "100",
            "--teacher-reference", "none", "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv)
    module.main()
    records = json.load(open(tmp_path / "curve.json"))["records"]
    first = next(r for r in records if r["phase"] == "opsd")
    # Teacher = a frozen copy of the student on the same prompt: identical distributions and rows.
    assert abs(first["opsd"]) < 1e-6 and abs(first["flow"]) < 1e-5
    assert {"noref_unseen", "ref_unseen", "noref_seen", "ref_seen"} <= set(first)
    assert all(0.0 <= first[k] <= 1.0 for k in ("noref_unseen", "ref_unseen"))
