"""The GPU benchmark scripts run end to end on a tiny model on CPU (so the GPU run cannot die of a
typo): every variant finishes with the same loss as HF (same weights, same batch), and the
logits check passes."""

import json

from tests.helpers import run_python


def _run(*args):
    proc = run_python(args, timeout=600, CUDA_VISIBLE_DEVICES="")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]


def test_throughput_and_logits_scripts_on_a_tiny_model(tmp_path):
    _run("-m", "benchmarks.model_throughput", "--tiny", "--variant", "hf", "mcore_plain", "mcore_fused",
         "mcore_compiled", "--compile-backend", "aot_eager", "--steps", "2", "--warmup", "1",
         "--chunk-tokens", "24", "--out-dir", str(tmp_path))
    _run("-m", "benchmarks.model_logits_check", "--tiny", "--seq", "16", "--compile-backend", "aot_eager",
         "--out", str(tmp_path / "logits.json"))
    _run("benchmarks/summarize_model_bench.py", str(tmp_path))
    with open(tmp_path / "summary.json") as f:
        summary = json.load(f)
    rows = summary["variants"]
    assert set(rows) == {"hf", "mcore_plain", "mcore_fused", "mcore_compiled"}
    assert all(r["ok"] and r["loss_rel_diff_vs_hf"] < 1e-5 for r in rows.values()), rows
    assert summary["logits_check_ok"] is True
