"""A real PHF run's metrics against the definitions they claim (docs/metrics.md, the paper's Section 3.6), each
computed here from the run's other numbers and settings."""

import math

import pytest

from ..helpers.tiny_run import assert_ok, read_metrics, train

ALPHA, LR, DECAY = 0.1, 1e-3, 8


def test_a_runs_losses_energy_lr_and_times_follow_their_definitions(tiny_inputs, tmp_path):
    hf, data = tiny_inputs
    run = str(tmp_path / "run")
    assert_ok(train(hf, data, run, "--training.train_iters=2", "--checkpoint.save_interval=0", f"--lr={LR}",
                    f"--objective.flow_alpha={ALPHA}", f"--optimizer.lr_decay_iters={DECAY}",
                    "--logging.log_layer_energy=true"))
    metrics = read_metrics(run)
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        # L_PHF = L_OPSD + alpha L_flow; the paper's L_flow = 1/2 L_local + 1/2 L_adj, L_local the mean over layers
        assert m["loss"] == pytest.approx(m["loss_opsd"] + ALPHA * m["loss_flow"], rel=1e-12)
        local, adjacent = (sum(v) / len(v) for v in (m["layer_flow"], m["pair_flow"]))
        assert m["loss_flow"] == pytest.approx(0.5 * local + 0.5 * adjacent, rel=1e-6)
        # the layer energy: e = layer_flow, p = e / sum e
        e = m["flow_energy"]
        p = [x / sum(e) for x in e]
        assert e == m["layer_flow"] and m["flow_energy_max_share"] == pytest.approx(max(p), rel=1e-12)
        assert m["flow_energy_argmax"] == p.index(max(p))
        entropy = -sum(x * math.log(x) for x in p if x > 0)
        assert m["flow_energy_entropy"] == pytest.approx(entropy, rel=1e-9)
        assert m["flow_energy_entropy_norm"] == pytest.approx(entropy / math.log(len(e)), rel=1e-9)
        # every sample is a full 12-token rollout (the tiny model writes no EOS): 4 samples x 12 scored tokens
        assert m["rollout_tokens"] == 12 and m["num_tokens"] == 4 * 12 and m["flow_samples"] == 4
        # the cosine from lr to 0 over DECAY steps, the first step at lr (HF's schedule without warm-up)
        assert m["lr"] == pytest.approx(LR * 0.5 * (1 + math.cos(math.pi * (m["step"] - 1) / DECAY)), rel=1e-12)
        # the step's time is its rollouts, update and sync; the update holds the teacher, student and optimizer
        assert m["step_time"] == pytest.approx(m["time_rollout_s"] + m["time_update_s"] + m["time_sync_s"], rel=1e-9)
        assert m["time_teacher_s"] + m["time_student_s"] + m["time_optimizer_s"] <= m["time_update_s"]
        assert 0 <= m["grad_norm"] and m["update_skipped"] is False and m["nonfinite_steps"] == 0
