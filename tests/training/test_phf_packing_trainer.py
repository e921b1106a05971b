"""PHF with ``--training.packing`` through the whole trainer on the tiny CPU preset: packed micro-batches and
token-budget micro-batches give the padded run's update, resume with packing is exact, the start line names
the packed attention. (That every layout's packed step equals the float64 oracle: ``tests/parallel/test_phf_step``.)
"""

import os

import pytest
import torch
from safetensors.torch import load_file

from ..helpers.tiny_run import assert_ok, read_metrics, train

COMMON = ("--lr=1e-3", "--training.micro_batch_size=2", "--checkpoint.save_interval=2",
          "--optimizer.adam_eps=1e-4")  # adam_eps above |g|: the first steps are linear in the gradient
PACKED = ("--training.packing",)
# the tiny preset's samples are 55 student and 165 teacher tokens: a budget of 500 groups the step's 4 samples
# 3 + 1 (the teacher's 495 tokens, then the rest), not 2 + 2
BUDGET = ("--training.packing", "--training.max_tokens_per_microbatch=500")


def _adapters(run_dir):
    return load_file(os.path.join(run_dir, "export", "peft_adapter", "adapter_model.safetensors"))


@pytest.mark.slow  # ~90 s: three trainer runs and a resume on 2 cores
def test_packed_and_token_budget_runs_give_the_padded_update_and_resume_exactly(tiny_inputs, tmp_path):
    hf, data = tiny_inputs
    runs, procs = {}, {}
    for name, iters, extra in (("padded", 2, ("--training.packing=false",)), ("packed", 2, PACKED), ("budget", 4, BUDGET),
                               ("resumed", 2, BUDGET), ("resumed", 4, BUDGET)):
        procs[name] = train(hf, data, str(tmp_path / name), *COMMON, f"--training.train_iters={iters}", *extra)
        assert_ok(procs[name])
        runs[name] = read_metrics(str(tmp_path / name))
    padded = runs["padded"]
    assert len(padded) == 2 and all(m["grad_norm"] > 0 and m["loss_flow"] > 0 for m in padded)
    for name in ("packed", "budget"):
        for a, b in zip(padded, runs[name][:2]):
            for key in ("num_tokens", "flow_samples", "rollout_digest"):
                assert b[key] == a[key], (name, key)
            for key in ("loss", "loss_opsd", "loss_flow"):
                assert b[key] == pytest.approx(a[key], rel=1e-5), (name, key)
            assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4), name
    straight, resumed = runs["budget"], runs["resumed"]
    assert [m["step"] for m in resumed] == [1, 2, 3, 4]
    for a, b in zip(straight, resumed):
        for key in ("loss", "loss_flow", "grad_norm", "num_tokens", "rollout_digest"):
            assert b[key] == a[key], (a["step"], key)
    for k, v in _adapters(str(tmp_path / "budget")).items():
        torch.testing.assert_close(_adapters(str(tmp_path / "resumed"))[k], v, rtol=0, atol=0)
    line = "packed sequences: SDPA per sequence, causal (flash kernel on CPU)"
    assert line in procs["packed"].stdout + procs["packed"].stderr
    assert "packed sequences" not in procs["padded"].stdout + procs["padded"].stderr
