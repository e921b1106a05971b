"""The overlapped mode (``rollout.async_steps = 1``) and the engine settings, on the transformers engine.

The engines sample step k+1 while the trainer runs step k: every rollout but the first step's is one
update stale (logged), and a checkpoint carries the prefetched rollouts, so a resumed run equals
the uninterrupted one. (vLLM engines: ``test_engine_groups.py``; the toy's learning curve with the
overlap and its step time: ``benchmarks/rollout_overlap.py``.)
"""

import pytest

from phf_megatron.errors import ConfigError
from phf_megatron.training.config_io import load_config

from ..helpers.tiny_run import assert_ok, read_metrics, train

KEYS = ("loss", "loss_opsd", "loss_flow", "grad_norm", "rollout_digest", "rollout_staleness")


@pytest.mark.parametrize("flags, field, words", [
    (["--rollout.num_engines=two"], "rollout.num_engines", "a positive count or 'auto'"),
    (["--rollout.num_engines=0"], "rollout.num_engines", "a positive count or 'auto'"),
    (["--rollout.backend=vllm_server", "--rollout.server_url=http://h:1", "--rollout.num_engines=2"],
     "rollout.num_engines", "one server"),
    (["--rollout.async_steps=2"], "rollout.async_steps", "not one of (0, 1)"),
    (["--rollout.async_steps=1", "--rollout.enable_sleep_mode=true"], "rollout.async_steps", "enable_sleep_mode"),
    (["--rollout.async_steps=1", "--rollout.sync_interval=2"], "rollout.async_steps", "sync_interval=1"),
])
def test_engine_settings_are_checked(flags, field, words):
    with pytest.raises(ConfigError) as err:
        load_config(None, flags)
    assert err.value.key == field and words in err.value.line


def test_num_engines_takes_a_count_or_auto(tmp_path):
    assert load_config(None, ["--rollout.num_engines=auto"]).rollout.num_engines == "auto"
    assert load_config(None, ["--rollout.num_engines", "4"]).rollout.num_engines == 4
    preset = tmp_path / "p.yaml"
    preset.write_text("rollout:\n  num_engines: 2\n  async_steps: 1\n")
    cfg = load_config(str(preset))
    assert (cfg.rollout.num_engines, cfg.rollout.async_steps) == (2, 1)


@pytest.mark.slow
def test_overlapped_rollouts_are_one_step_stale_and_a_resume_is_exact(tiny_inputs, tmp_path):
    hf, data = tiny_inputs
    common = ("--checkpoint.save_interval=2", "--lr=1e-3")
    straight, resumed, on_policy = (str(tmp_path / n) for n in ("straight", "resumed", "on_policy"))
    assert_ok(train(hf, data, straight, *common, "--training.train_iters=4", "--rollout.async_steps=1"))
    # the last step prefetches too, so the checkpoint at 2 holds step 3's rollouts
    assert_ok(train(hf, data, resumed, *common, "--training.train_iters=2", "--rollout.async_steps=1"))
    assert_ok(train(hf, data, resumed, *common, "--training.train_iters=4", "--rollout.async_steps=1"))
    assert_ok(train(hf, data, on_policy, *common, "--training.train_iters=1"))
    s, r, p = read_metrics(straight), read_metrics(resumed), read_metrics(on_policy)
    assert [m["rollout_staleness"] for m in s] == [0, 1, 1, 1]
    assert [m["step"] for m in r] == [1, 2, 3, 4]
    for a, b in zip(s, r):
        for key in KEYS:
            assert b[key] == pytest.approx(a[key], rel=1e-12), (a["step"], key)
    for key in KEYS:  # the first step samples on-policy, as the on-policy run does
        assert s[0][key] == pytest.approx(p[0][key], rel=1e-12), key
    assert all(m["time_prefetch_wait_s"] >= 0 for m in s)
