"""The official OPSD options in the whole trainer on CPU: each runs a step with a non-zero gradient,
the loss-by-token file is written, and the official EMA start resumes exactly."""

import json
import math
import os

import pytest
import torch
from safetensors.torch import load_file

from phf_megatron.data import load_qwen3_tokenizer

from ..helpers.tiny_run import assert_ok as _ok
from ..helpers.tiny_run import read_metrics, train


OPTIONS = {
    "top_k_loss": ("--objective.top_k_loss=20",),
    "use_tinker_loss": ("--objective.use_tinker_loss=true", "--objective.jsd_clip=null"),
    "lmbda_0": ("--rollout.lmbda=0",),
    "reason_first": ("--data.reason_first=true", "--data.reason_first_max_tokens=8"),
}


@pytest.mark.parametrize("option", list(OPTIONS))
def test_a_step_with_the_option_has_a_gradient(tiny_inputs, tmp_path, option):
    hf, data = tiny_inputs
    run = str(tmp_path / option)
    _ok(train(hf, data, run, "--training.train_iters=1", "--checkpoint.save_interval=0",
              "--logging.loss_tokens_interval=1", *OPTIONS[option]))
    (m,) = read_metrics(run)
    assert math.isfinite(m["loss"]) and m["grad_norm"] > 0, m
    if option == "use_tinker_loss":
        assert "clip_frac_tokens" not in m  # the sampled-token loss has nothing to clip
    else:
        # (the tiny model's divergences sit far below the cap: equal up to the float32 sums' rounding)
        assert 0 <= m["clip_frac_tokens"] <= 1 and m["opsd_unclipped"] >= m["loss_opsd"] * (1 - 1e-6) > 0
    assert ("on_policy_fraction" in m) == (option == "lmbda_0") and m.get("on_policy_fraction", 0) == 0
    with open(os.path.join(run, "loss_tokens.jsonl"), encoding="utf-8") as f:
        (record,) = [json.loads(line) for line in f]
    tokens = record["tokens"]
    assert record["step"] == 1 and 0 < len(tokens) <= 20
    shares = [t["share"] for t in tokens]
    assert [abs(s) for s in shares] == sorted((abs(s) for s in shares), reverse=True)
    assert sum(abs(s) for s in shares) <= 1 + 1e-9 and max(abs(s) for s in shares) > 0
    if option != "use_tinker_loss":  # divergences are >= 0: plain shares of their sum
        assert all(s >= 0 for s in shares)
    tok = load_qwen3_tokenizer(hf)
    assert all(t["token"] == tok.decode([t["id"]]) and t["count"] >= 1 for t in tokens)


def _adapters(run_dir):
    return load_file(os.path.join(run_dir, "export", "peft_adapter", "adapter_model.safetensors"))


@pytest.mark.slow
def test_official_ema_start_resumes_exactly(tiny_inputs, tmp_path):
    """``teacher.ema_start=after_first_step``: a run interrupted after step 1 (the EMA just copied
    theta_1) continues as the straight run; the loss-by-token file keeps one record per step."""
    hf, data = tiny_inputs
    common = ("--teacher.ema_start=after_first_step", "--checkpoint.save_interval=0", "--lr=1e-3",
              "--logging.loss_tokens_interval=1")
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    _ok(train(hf, data, straight, "--training.train_iters=3", *common))
    _ok(train(hf, data, resumed, "--training.train_iters=1", *common))
    _ok(train(hf, data, resumed, "--training.train_iters=3", *common))
    s, r = read_metrics(straight), read_metrics(resumed)
    assert [m["step"] for m in r] == [1, 2, 3] and all(m["grad_norm"] > 0 for m in s)
    for a, b in zip(s, r):
        for key in ("loss", "loss_opsd", "loss_flow", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-9, abs=1e-12), (a["step"], key)
    for k, v in _adapters(straight).items():
        torch.testing.assert_close(_adapters(resumed)[k], v, rtol=0, atol=0)
    with open(os.path.join(resumed, "loss_tokens.jsonl"), encoding="utf-8") as f:
        assert [json.loads(line)["step"] for line in f] == [1, 2, 3]
    # the start is part of the run's math: resuming with the other one is refused, naming the field
    proc = train(hf, data, resumed, "--training.train_iters=4", "--checkpoint.save_interval=0", "--lr=1e-3")
    assert proc.returncode != 0 and "teacher.ema_start" in proc.stderr
