"""The whole trainer on CPU: a PHF update at TP=2, and two at PP=2 x VPP=2, equal the single-process ones, resume is exact
(a finished full fine-tuning run resumed to train longer exports its last step), and a failing
rollout engine leaves a checkpoint behind (at the last weight push: the resume is exact)."""

import os
import re

import pytest
import torch
from safetensors.torch import load_file

from ..helpers.tiny_run import assert_ok as _ok
from ..helpers.tiny_qwen3 import make_tiny_hf
from ..helpers.tiny_run import assert_same_steps, make_toy_jsonl, read_metrics, train, train_failing_engine
from .wandb_files import wandb_config, wandb_history, wandb_runs

LR = "--lr=1e-3"  # large enough that one step visibly moves the adapters


def _adapters(run_dir):
    return load_file(os.path.join(run_dir, "export", "peft_adapter", "adapter_model.safetensors"))


def test_one_update_at_tp2_with_sp_equals_single_process(tiny_inputs, tmp_path):
    hf, data = tiny_inputs
    # adam_eps well above |g|: Adam's first step is then linear in the gradient, not lr * sign(g),
    # so a 1e-9 difference in a near-zero gradient element cannot flip an update.
    common = ("--training.train_iters=1", "--training.global_batch_size=4", "--training.micro_batch_size=2", LR,
              "--optimizer.adam_eps=1e-4")
    _ok(train(hf, data, str(tmp_path / "tp1"), *common))
    _ok(train(hf, data, str(tmp_path / "tp2"), *common, "--model.tensor_model_parallel_size=2",
              "--model.sequence_parallel=true", nproc=2))
    m1, m2 = read_metrics(str(tmp_path / "tp1"))[0], read_metrics(str(tmp_path / "tp2"))[0]
    for key in ("loss", "loss_opsd", "loss_flow", "grad_norm"):
        assert m2[key] == pytest.approx(m1[key], rel=1e-5), key
    assert m1["num_tokens"] == m2["num_tokens"] and m1["flow_samples"] == m2["flow_samples"]
    a1, a2 = _adapters(str(tmp_path / "tp1")), _adapters(str(tmp_path / "tp2"))
    assert a1.keys() == a2.keys()
    moved = 0
    for k in a1:
        torch.testing.assert_close(a2[k], a1[k], rtol=0, atol=1e-6)
        moved += int("lora_B" in k and a1[k].abs().max() > 0)  # B starts at 0: the update moved it
    assert moved > 0


def test_two_steps_at_pp2_vpp2_with_four_micro_batches_equal_single_process(tmp_path):
    """An interleaved pipeline (PP=2 x VPP=2, 4 layers) over more micro-batches than stages (4) on CPU: gloo's
    batched p2p paired the interleaved schedule's messages wrongly (next rank = previous rank), and the loss
    came out 8% off and the gradient norm 6x (2 micro-batches, all warm-up, were right). Both steps equal
    one process's: the same rollouts, loss and gradient norm."""
    hf, data = make_tiny_hf(str(tmp_path / "hf"), num_layers=4), make_toy_jsonl(str(tmp_path / "toy.jsonl"))
    common = ("--training.train_iters=2", "--training.global_batch_size=4", "--training.micro_batch_size=1",
              "--checkpoint.save_interval=0", "--rollout.max_tokens=8", "--optimizer.adam_eps=1e-4")
    _ok(train(hf, data, str(tmp_path / "pp1"), *common))
    _ok(train(hf, data, str(tmp_path / "vpp"), *common, "--model.pipeline_model_parallel_size=2",
              "--model.virtual_pipeline_model_parallel_size=2", nproc=2))
    for m1, m2 in zip(read_metrics(str(tmp_path / "pp1")), read_metrics(str(tmp_path / "vpp")), strict=True):
        assert m2["rollout_digest"] == m1["rollout_digest"], m1["step"]
        for key in ("loss", "loss_opsd", "loss_flow", "grad_norm"):
            assert m2[key] == pytest.approx(m1[key], rel=1e-5), (m1["step"], key)


def test_full_recompute_gives_the_same_update_to_the_adapters(tiny_inputs, tmp_path):
    """Full activation recompute with a frozen base (LoRA) must not cut the adapters' gradient."""
    hf, data = tiny_inputs
    common = ("--training.train_iters=2", "--checkpoint.save_interval=0", LR, "--optimizer.adam_eps=1e-4")
    _ok(train(hf, data, str(tmp_path / "plain"), *common))
    _ok(train(hf, data, str(tmp_path / "recompute"), *common, "--model.recompute_granularity=full",
              "--model.recompute_method=uniform", "--model.recompute_num_layers=1"))
    plain, recompute = read_metrics(str(tmp_path / "plain")), read_metrics(str(tmp_path / "recompute"))
    for a, b in zip(plain, recompute):
        assert a["grad_norm"] > 0
        for key in ("loss", "loss_opsd", "loss_flow", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-6), (a["step"], key)
    for k, v in _adapters(str(tmp_path / "plain")).items():
        torch.testing.assert_close(_adapters(str(tmp_path / "recompute"))[k], v, rtol=0, atol=1e-7)


def test_resume_reproduces_the_straight_run(tiny_inputs, tmp_path):
    hf, data = tiny_inputs
    common = ("--training.train_iters=4", "--checkpoint.save_interval=2", LR)
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    _ok(train(hf, data, straight, *common, "--logging.wandb", "--logging.wandb_offline"))
    _ok(train(hf, data, resumed, "--training.train_iters=2", "--checkpoint.save_interval=2", LR))
    _ok(train(hf, data, resumed, *common))  # resumes from iter 2 of the same run dir
    s, r = read_metrics(straight), read_metrics(resumed)
    assert [m["step"] for m in r] == [1, 2, 3, 4]
    for a, b in zip(s, r):
        for key in ("loss", "loss_opsd", "loss_flow", "grad_norm", "lr"):
            assert b[key] == pytest.approx(a[key], rel=1e-9, abs=1e-12), (a["step"], key)
    for k, v in _adapters(straight).items():
        torch.testing.assert_close(_adapters(resumed)[k], v, rtol=0, atol=0)
    [wandb_run] = wandb_runs(straight)  # logging.wandb: the run's metrics, offline, under run_dir/wandb
    history = wandb_history(wandb_run)
    assert sorted(history) == [1, 2, 3, 4]
    for m in s:
        assert history[m["step"]]["loss"] == pytest.approx(m["loss"], rel=1e-12)
    assert wandb_config(wandb_run)["optimizer"]["lr"] == 1e-3


def _hf_export(run_dir):
    out = os.path.join(run_dir, "export", "hf")
    return {k: v for f in sorted(os.listdir(out)) if f.endswith(".safetensors")
            for k, v in load_file(os.path.join(out, f)).items()}


def test_a_finished_full_fine_tuning_run_resumed_to_train_longer_exports_its_last_step(tiny_inputs, tmp_path):
    """Without LoRA the export is a HF model; a rerun with more steps replaces the finished run's."""
    hf, data = tiny_inputs
    full = ("--no-lora.enabled", LR)
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    _ok(train(hf, data, straight, "--training.train_iters=2", *full))
    _ok(train(hf, data, resumed, "--training.train_iters=1", *full))
    first = _hf_export(resumed)
    proc = train(hf, data, resumed, "--training.train_iters=2", *full)
    _ok(proc)
    assert "resuming from step 1 of 2" in proc.stdout
    last, want = _hf_export(resumed), _hf_export(straight)
    assert sorted(last) == sorted(want)
    assert any(not torch.equal(first[k], want[k]) for k in want)  # step 2 moved the weights
    for k, v in want.items():
        torch.testing.assert_close(last[k], v, rtol=0, atol=0)


def test_rollout_failure_saves_a_checkpoint_first(tiny_inputs, tmp_path):
    hf, data = tiny_inputs
    run = str(tmp_path / "fail")
    # the probe after the initial sync (24 tokens) fits in the timeout; a 600-token generate does not
    proc = train(hf, data, run, "--training.train_iters=3", "--checkpoint.save_interval=0",
                 "--rollout.timeout_s=0.5", "--rollout.max_tokens=600", "--rollout.top_k=0",
                 "--data.max_prompt_length=400")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert open(os.path.join(run, "checkpoints", "latest_checkpointed_iteration.txt")).read().strip() == "0"
    # one line: the engine, the cause, what is kept, what to do (no traceback)
    [line] = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert "Traceback" not in proc.stderr
    assert line.startswith("error: rollout engine 0 (host rank 0): sampling failed at step 0 (GenerationTimeoutError)")
    assert line.endswith(f"; the last checkpoint is {run}/checkpoints/iter_0000000; rerun the same command to resume")


PUSH_EVERY_2 = ("--training.train_iters=4", "--checkpoint.save_interval=2", "--rollout.sync_interval=2", LR)


@pytest.fixture(scope="module")
def push_every_2(tiny_inputs, tmp_path_factory):
    """The run directory of an uninterrupted run of ``PUSH_EVERY_2``."""
    hf, data = tiny_inputs
    run = str(tmp_path_factory.mktemp("straight"))
    _ok(train(hf, data, run, *PUSH_EVERY_2))
    return run


@pytest.mark.parametrize("where, step, line", [
    # sampling step 3's rollouts (3 steps done): between the pushes after steps 2 and 4, not saved
    ("sample", 3, "sampling failed at step 3 (RuntimeError): injected engine fault; not saved at step 3, between "
                  "weight pushes (rollout.sync_interval = 2); the last checkpoint is {ckpt}, the steps after it are "
                  "redone; rerun the same command to resume"),
    # the push after step 2 failed: saved there (the resumed run pushes at its start)
    ("sync", 2, "weight sync to version 2 failed (RuntimeError): injected engine fault; the last checkpoint is "
                "{ckpt}; rerun the same command to resume"),
])
def test_an_engine_failure_between_weight_pushes_resumes_from_the_last_push(tiny_inputs, tmp_path, push_every_2,
                                                                            where, step, line):
    """With rollout.sync_interval = 2 the engine samples steps 3 and 4 with the weights of step 2: the failed run
    keeps iter 2 (a checkpoint at step 3 would resume with the engine holding step 3's weights), and the rerun
    ends bit for bit as the uninterrupted run."""
    hf, data = tiny_inputs
    straight, run = push_every_2, str(tmp_path / "failed")
    proc = train_failing_engine(hf, data, run, where, step, *PUSH_EVERY_2)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert sorted(os.listdir(os.path.join(run, "checkpoints"))) == ["iter_0000002", "latest_checkpointed_iteration.txt"]
    assert [x for x in proc.stderr.splitlines() if x.startswith("error:")] == [
        "error: rollout engine 0 (host rank 0): " + line.format(ckpt=os.path.join(run, "checkpoints", "iter_0000002"))]
    resumed = train(hf, data, run, *PUSH_EVERY_2)
    _ok(resumed)
    assert "resuming from step 2 of 4" in resumed.stdout
    assert_same_steps(straight, run, ("rollout_digest", "rollout_staleness", "loss", "grad_norm"), 4)
    for k, v in _adapters(straight).items():
        assert torch.equal(_adapters(run)[k], v), k


@pytest.mark.slow  # ~75 s: a torchrun world of 2 ranks with vLLM on 2 cores
@pytest.mark.vllm
def test_tp2_run_under_torchrun_with_vllm_on_rank0(tiny_inputs, tmp_path):
    """vLLM started by rank 0 of a torchrun world (its engine process spawned), synced from the
    TP=2 shards every step and verified by the probe against the trainer's logits."""
    pytest.importorskip("vllm")
    hf, data = tiny_inputs
    run = str(tmp_path / "tp2_vllm")
    proc = train(hf, data, run, "--training.train_iters=2", "--checkpoint.save_interval=0",
                 "--model.tensor_model_parallel_size=2", "--model.sequence_parallel=true", "--rollout.backend=vllm",
                 "--rollout.enforce_eager=true",
                 "--logging.verbose", nproc=2)
    _ok(proc)
    log = proc.stdout + proc.stderr   # --logging.verbose: the third-party warnings the default hides
    assert "Transformer Engine and Apex are not installed" in log and re.search(r"\bWARNING\b", log), log[-3000:]
    metrics = read_metrics(run)
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:   # fp32 engine and trainer: the probe's logprobs agree after every sync
        assert m["sync_probe_diff"] is not None and m["sync_probe_diff"] <= 1e-4, m


def test_an_engine_failure_without_save_interval_saves_between_pushes(tiny_inputs, tmp_path, push_every_2):
    """checkpoint.save_interval = 0 puts no checkpoint at a push: an engine failing at step 3 (rollout.sync_interval
    = 2) left no checkpoint at all ("no checkpoint was saved"), and the rerun trained from step 0. Now step 3 is saved
    and the line says what the resume changes: step 4 sampled with step 3's weights (staleness 0), not step 2's."""
    hf, data = tiny_inputs
    run = str(tmp_path / "failed")
    flags = (*PUSH_EVERY_2, "--checkpoint.save_interval=0")
    proc = train_failing_engine(hf, data, run, "sample", 3, *flags)
    assert proc.returncode == 1, proc.stderr[-3000:]
    ckpt = os.path.join(run, "checkpoints", "iter_0000003")
    assert [x for x in proc.stderr.splitlines() if x.startswith("error:")] == [
        "error: rollout engine 0 (host rank 0): sampling failed at step 3 (RuntimeError): injected engine fault; saved "
        "at step 3, between weight pushes (rollout.sync_interval = 2, checkpoint.save_interval = 0): the resumed run "
        "samples the steps to the next push with step 3's weights, not step 2's as this run did; the last checkpoint "
        f"is {ckpt}; rerun the same command to resume"]
    resumed = train(hf, data, run, *flags)
    _ok(resumed)
    assert f"resuming from step 3 of 4 ({ckpt})" in resumed.stdout
    straight, metrics = read_metrics(push_every_2), read_metrics(run)
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    for a, b in zip(straight[:3], metrics[:3]):   # the steps before the failure: kept as the uninterrupted run's
        assert all(a[k] == b[k] for k in ("rollout_digest", "loss", "grad_norm")), a["step"]
    assert [m["rollout_staleness"] for m in metrics] == [0, 1, 0, 0]   # uninterrupted: [0, 1, 0, 1]
