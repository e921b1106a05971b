"""The GPU benchmark's code path runs end to end on CPU (tiny model): a smoke test, not a timing."""

import json

from tests.helpers import run_python


def test_benchmark_tiny_run_writes_results(tmp_path):
    proc = run_python(["-m", "benchmarks.phf_step", str(tmp_path), "--tiny", "--warmup", "1", "--steps", "2"])
    result = json.loads((tmp_path / "phf_step.json").read_text())
    assert result["ok"], result.get("traceback", proc.stderr[-3000:])
    phf, opsd = result["metrics_phf"], result["metrics_opsd"]
    assert phf["loss_opsd"] == opsd["loss_opsd"] and opsd["loss_flow"] == 0 and phf["loss_flow"] > 0
    assert len(phf["layer_flow"]) == result["layers"] and len(phf["pair_flow"]) == result["layers"] - 1
    assert result["ratio_phf_over_opsd"] > 0 and (tmp_path / "phf_step.log").exists()
