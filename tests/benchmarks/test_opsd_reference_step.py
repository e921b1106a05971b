"""The official-style OPSD step benchmark runs on CPU (tiny) and its three losses agree where they must."""

import json

import pytest

from tests.helpers import run_python


def test_reference_and_our_opsd_losses_are_equal_at_fp32_and_phf_adds_alpha_flow(tmp_path):
    proc = run_python(["-m", "benchmarks.opsd_reference_step", str(tmp_path), "--tiny", "--warmup", "0", "--steps", "1"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((tmp_path / "opsd_reference_step.json").read_text())["shapes"]["tiny"]
    assert r["checks"]["ours_opsd_vs_reference_rel"] < 1e-5 and r["checks"]["ours_phf_jsd_vs_reference_rel"] < 1e-5
    assert r["checks"]["ours_phf_loss_minus_jsd"] == pytest.approx(0.05 * r["ours_phf"]["first_flow"], rel=1e-5)
    assert r["ours_phf"]["first_flow"] > 0 and r["reference"]["first_loss"] > 0
    for kind in ("reference", "ours_opsd", "ours_phf"):
        assert r[kind]["tokens_per_s"] > 0 and 0 < r[kind]["mfu"] < 1


def test_our_bf16_step_runs_the_optimizer_on_bf16_adapters(tmp_path):
    """The GPU dtype on CPU: DDP's float32 main_grad reaches a bf16 adapter as a bf16 .grad (assigning the
    float32 one is refused: the H100 lease of 2026-11-26 lost the reference stage to it)."""
    proc = run_python(["-m", "benchmarks.opsd_reference_step", str(tmp_path), "--tiny", "--warmup", "0", "--steps", "1",
                       "--dtype", "bfloat16"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((tmp_path / "opsd_reference_step.json").read_text())["shapes"]["tiny"]
    assert r["dtype"] == "torch.bfloat16" and r["checks"]["ours_opsd_vs_reference_rel"] < 0.05
    assert r["ours_phf"]["step_s_median"] > 0
