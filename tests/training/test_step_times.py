"""A real run's time keys against each other: an engine's share of a phase lies within the phase's own time."""

from ..helpers.tiny_run import assert_ok, read_metrics, train


def test_the_engines_times_lie_within_the_step_phases_they_belong_to(tiny_inputs, tmp_path):
    """A GRPO rollout batch of two steps samples at its first step and pushes the weights after its last: the
    engine's generation (``time_engine_s``) lies within the rollout phase (``time_rollout_s``) and its push
    (``time_engine_sync_s``) within the sync (``time_sync_s``) at every step, so each is 0 on the step without
    one (they repeated the other step's time: 0.08 s of generation in a 2e-5 s rollout phase)."""
    hf, data = tiny_inputs
    run = str(tmp_path / "grpo")
    assert_ok(train(hf, data, run, "--method=grpo", "--rollout.n=2", "--grpo.num_iterations=2",
                    "--grpo.vllm_importance_sampling_correction=false", "--training.train_iters=2",
                    "--checkpoint.save_interval=0"))
    metrics = read_metrics(run)
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert 0 <= m["time_engine_s"] <= m["time_rollout_s"], m
        assert 0 <= m["time_engine_sync_s"] <= m["time_sync_s"], m
    first, second = metrics
    assert first["time_engine_s"] > 0 and second["time_engine_s"] == 0          # sampled at the batch's first step
    assert first["time_engine_sync_s"] == 0 and second["time_engine_sync_s"] > 0  # pushed after its last
    assert second["sync_probe_diff"] is not None
