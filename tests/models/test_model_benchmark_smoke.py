"""The GPU benchmark scripts run end to end on a tiny model on CPU (so the GPU run cannot die of a
typo): every variant finishes with the same loss as HF (same weights, same batch), and the
logits check passes."""

import json
import os
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _run(*args):
    path = os.pathsep.join([os.path.abspath(REPO)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]


def test_throughput_and_logits_scripts_on_a_tiny_model(tmp_path):
    _run("benchmarks/model_throughput.py", "--tiny", "--variant", "hf", "mcore_plain", "mcore_fused",
         "mcore_compiled", "--compile-backend", "aot_eager", "--steps", "2", "--warmup", "1",
         "--chunk-tokens", "24", "--out-dir", str(tmp_path))
    _run("benchmarks/model_logits_check.py", "--tiny", "--seq", "16", "--compile-backend", "aot_eager",
         "--out", str(tmp_path / "logits.json"))
    _run("benchmarks/summarize_model_bench.py", str(tmp_path))
    with open(tmp_path / "summary.json") as f:
        summary = json.load(f)
    rows = summary["variants"]
    assert set(rows) == {"hf", "mcore_plain", "mcore_fused", "mcore_compiled"}
    assert all(r["ok"] and r["loss_rel_diff_vs_hf"] < 1e-5 for r in rows.values()), rows
    assert summary["logits_check_ok"] is True
