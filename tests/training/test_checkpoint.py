"""Checkpoints, single process: exact resume, atomicity under a failing writer, pruning, checks."""

from __future__ import annotations

import os
import random
import shutil

import numpy as np
import pytest
import torch

from phf_megatron.errors import InputFileError
from phf_megatron.training import checkpoint as ckpt
from phf_megatron.training.checkpoint_parts import (
    Part, RankLayout, Scope, rng_part, stateful_part, tensors_part,
)
from phf_megatron.training.config import OptimizerConfig
from phf_megatron.training.distributed import seed_everything
from phf_megatron.training.schedule import build_scheduler, load_scheduler_state

from .toy_run import ToySampler, ema_step, noisy_batch

DIM = 6


class ToyRun:
    """Model with dropout + AdamW + Megatron LR scheduler + sampler + EMA copy."""

    def __init__(self, seed: int):
        seed_everything(seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(DIM, 16), torch.nn.Dropout(0.2), torch.nn.Tanh(),
                                         torch.nn.Linear(16, 1))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1.0, weight_decay=0.01)
        optim = OptimizerConfig(lr=1e-2, lr_decay_iters=6)
        self.sched = build_scheduler(self.opt, optim, 4, 40)
        self.sampler = ToySampler(num_rows=10, seed=3)
        self.ema = {n: p.detach().clone() for n, p in self.model.named_parameters()}

    def step(self) -> float:
        x, y = noisy_batch(self.sampler.take(4), DIM)
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.sched.step(1)
        ema_step(self.ema, dict(self.model.named_parameters()), decay=0.9)
        return loss.item()

    def parts(self) -> dict[str, Part]:
        return {
            "model": tensors_part(dict(self.model.named_parameters())),
            "optimizer": stateful_part(self.opt, Scope.MODEL_PARALLEL),
            "ema": tensors_part(self.ema),
            "scheduler": Part(Scope.GLOBAL, self.sched.state_dict, lambda s: load_scheduler_state(self.sched, s)),
            "data": stateful_part(self.sampler, Scope.GLOBAL),
            "rng": rng_part(),
        }

    def snapshot(self) -> dict[str, torch.Tensor]:
        out = {f"p.{n}": p.detach().clone() for n, p in self.model.named_parameters()}
        out.update({f"ema.{n}": t.clone() for n, t in self.ema.items()})
        for i, state in self.opt.state_dict()["state"].items():
            out.update({f"opt.{i}.{k}": v.clone() for k, v in state.items()})
        out["lr"] = torch.tensor(self.opt.param_groups[0]["lr"], dtype=torch.float64)
        out["next_rand"] = torch.tensor([random.random(), float(np.random.rand())], dtype=torch.float64)
        out["next_torch"] = torch.rand(3)
        return out


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_four_steps_equal_two_plus_resume_plus_two(tmp_path):
    straight = ToyRun(seed=0)
    losses_straight = [straight.step() for _ in range(4)]
    expected = straight.snapshot()

    first = ToyRun(seed=0)
    losses = [first.step() for _ in range(2)]
    ckpt.save_checkpoint(str(tmp_path), 2, first.parts(), RankLayout(), fingerprint={"lr": 1e-2})
    del first
    torch.rand(7), random.random(), np.random.rand()  # the new process's generators are elsewhere

    resumed = ToyRun(seed=99)  # different init: everything must come from the checkpoint
    info = ckpt.load_checkpoint(str(tmp_path), resumed.parts(), RankLayout(), fingerprint={"lr": 1e-2})
    assert info.iteration == 2 and info.meta["config_hash"] is not None
    losses += [resumed.step() for _ in range(2)]
    assert losses == losses_straight  # bit-exact floats
    assert_same(resumed.snapshot(), expected)


def test_layout_on_disk_follows_megatron_convention(tmp_path):
    run = ToyRun(seed=0)
    path = ckpt.save_checkpoint(str(tmp_path), 7, run.parts(), RankLayout())
    assert os.path.basename(path) == "iter_0000007"
    assert open(tmp_path / ckpt.LATEST_FILE).read() == "7"
    assert sorted(os.listdir(path)) == ["global.pt", "meta.json", "model_parallel_tp00_pp000.pt",
                                        "rank_tp00_pp000_dp000.pt"]
    assert not [e for e in os.listdir(tmp_path) if e.startswith("tmp-")]


def _failing_writer(obj, path):
    with open(path, "wb") as f:
        f.write(b"half a checkpoint")
    raise OSError("disk full (simulated)")


@pytest.mark.parametrize("where", ["_write_torch", "fsync_tree"])
def test_failed_save_leaves_previous_checkpoint_and_latest(tmp_path, monkeypatch, where):
    run = ToyRun(seed=0)
    run.step()
    ckpt.save_checkpoint(str(tmp_path), 1, run.parts(), RankLayout())
    saved = run.snapshot()
    run.step()
    if where == "_write_torch":
        monkeypatch.setattr(ckpt, "_write_torch", _failing_writer)
    else:  # fails at publishing time, after every file was written
        monkeypatch.setattr(ckpt, "fsync_tree", lambda root: (_ for _ in ()).throw(OSError("fsync failed")))
    with pytest.raises(ckpt.CheckpointSaveError, match="previous checkpoint iter_0000001 is intact"):
        ckpt.save_checkpoint(str(tmp_path), 2, run.parts(), RankLayout())
    monkeypatch.undo()
    assert ckpt.read_latest(str(tmp_path)) == 1
    assert sorted(os.listdir(tmp_path)) == ["iter_0000001", ckpt.LATEST_FILE]
    fresh = ToyRun(seed=5)
    assert ckpt.load_checkpoint(str(tmp_path), fresh.parts(), RankLayout()).iteration == 1
    assert_same(fresh.snapshot(), saved)


def test_leftovers_of_a_killed_save_are_ignored_then_removed(tmp_path):
    run = ToyRun(seed=0)
    ckpt.save_checkpoint(str(tmp_path), 1, run.parts(), RankLayout())
    (tmp_path / "tmp-iter_0000002").mkdir()
    (tmp_path / "tmp-iter_0000002" / "global.pt").write_bytes(b"\x00garbage")
    assert ckpt.list_checkpoints(str(tmp_path)) == [1]
    assert ckpt.load_checkpoint(str(tmp_path), ToyRun(seed=1).parts(), RankLayout()).iteration == 1
    ckpt.save_checkpoint(str(tmp_path), 2, run.parts(), RankLayout())
    assert sorted(os.listdir(tmp_path)) == ["iter_0000001", "iter_0000002", ckpt.LATEST_FILE]


def test_a_first_save_killed_before_its_latest_file_is_refused_not_trained_over(tmp_path, monkeypatch):
    """Killed between the rename of iter_0000002 and the write of the latest file (the first save): the rerun
    found no latest file and trained from step 0, saving over iter_0000002; now one line names the latest file,
    in the run's save directory and in a --checkpoint.load of another run."""
    from phf_megatron.training.config_io import load_config

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed")   # not an Exception: no rank agreement catches it, as a SIGKILL

    monkeypatch.setattr(ckpt, "write_text", killed)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save_checkpoint(str(tmp_path / "checkpoints"), 2, ToyRun(seed=0).parts(), RankLayout())
    monkeypatch.undo()
    assert os.listdir(tmp_path / "checkpoints") == ["iter_0000002"]
    latest = tmp_path / "checkpoints" / ckpt.LATEST_FILE
    line = (f"{latest}: missing, but {tmp_path / 'checkpoints'} holds checkpoints (iter_0000002): write the "
            "iteration to resume from into it (the last: 2), or use a new --checkpoint.save directory to start afresh")
    other_run = [f"--run_dir={tmp_path / 'other'}", f"--checkpoint.load={tmp_path / 'checkpoints'}"]
    for flags in ([f"--run_dir={tmp_path}"], other_run):
        with pytest.raises(InputFileError) as err:
            ckpt.require_checkpoint(load_config(argv=flags))
        assert err.value.line == line
    latest.write_text("2")   # as the line says
    assert ckpt.load_checkpoint(str(tmp_path / "checkpoints"), ToyRun(seed=1).parts(), RankLayout()).iteration == 2


def test_keep_last_prunes_oldest(tmp_path):
    run = ToyRun(seed=0)
    for it in range(1, 6):
        ckpt.save_checkpoint(str(tmp_path), it, run.parts(), RankLayout(), keep_last=2)
    assert ckpt.list_checkpoints(str(tmp_path)) == [4, 5]
    assert ckpt.read_latest(str(tmp_path)) == 5
    assert not [e for e in os.listdir(tmp_path) if e.startswith("tmp-")]


def test_resaving_an_iteration_replaces_it(tmp_path):
    run = ToyRun(seed=0)
    ckpt.save_checkpoint(str(tmp_path), 3, run.parts(), RankLayout())
    run.step()
    ckpt.save_checkpoint(str(tmp_path), 3, run.parts(), RankLayout())
    saved = run.snapshot()
    fresh = ToyRun(seed=1)
    ckpt.load_checkpoint(str(tmp_path), fresh.parts(), RankLayout())
    assert_same(fresh.snapshot(), saved)


def test_no_checkpoint_means_fresh_start(tmp_path):
    assert ckpt.load_checkpoint(str(tmp_path / "nothing"), ToyRun(seed=0).parts(), RankLayout()) is None


def test_layout_change_of_per_rank_parts_is_refused(tmp_path):
    run = ToyRun(seed=0)
    ckpt.save_checkpoint(str(tmp_path), 1, run.parts(), RankLayout())
    tp2 = RankLayout(rank=0, world_size=2, tp_size=2)
    with pytest.raises(ValueError, match=r"part 'model' is stored per model-parallel rank.*tp_size 1 -> 2.*"
                                         r"--model.tensor_model_parallel_size=1 --model.pipeline_model_parallel_size=1, "
                                         r"1 ranks\)$"):   # was "or save with --checkpoint.model_format=torch_dist",
        # a setting the trainer ignored (LoRA adapters and the teacher are saved per model-parallel rank only)
        ckpt.load_checkpoint(str(tmp_path), run.parts(), tp2)
    dp2 = RankLayout(rank=0, world_size=2, dp_size=2)
    only_rng = {"rng": rng_part()}
    with pytest.raises(ValueError, match=r"part 'rng' is stored per rank and cannot.*dp_size 1 -> 2.*or skip it "
                                                     r"\(--checkpoint.no_load_rng\)$"):
        ckpt.load_checkpoint(str(tmp_path), only_rng, dp2)
    global_parts = {k: v for k, v in run.parts().items() if k in ("data", "scheduler")}
    assert ckpt.load_checkpoint(str(tmp_path), global_parts, dp2).iteration == 1  # global state reshards


def test_config_fingerprint_mismatch_lists_the_settings(tmp_path):
    run = ToyRun(seed=0)
    ckpt.save_checkpoint(str(tmp_path), 1, run.parts(), RankLayout(), fingerprint={"optimizer.lr": 5e-6, "lora.r": 64})
    with pytest.raises(ValueError, match=r"optimizer.lr: 5e-06 -> 1e-05.*--checkpoint.strict_config=false"):
        ckpt.load_checkpoint(str(tmp_path), run.parts(), RankLayout(), fingerprint={"optimizer.lr": 1e-5, "lora.r": 64})
    info = ckpt.load_checkpoint(str(tmp_path), run.parts(), RankLayout(),
                                fingerprint={"optimizer.lr": 1e-5, "lora.r": 64}, strict_config=False)
    assert info.iteration == 1


@pytest.mark.parametrize("content, shown", [(b"\xff\xfe\x00", "'\ufffd\ufffd\\x00'"), ("\u00b2".encode(), "'\u00b2'"),
                                            (b"", "''")])
def test_a_damaged_latest_file_is_named(tmp_path, content, shown):
    """Bytes that are not UTF-8 were a UnicodeDecodeError traceback, a superscript digit int()'s ValueError."""
    (tmp_path / ckpt.LATEST_FILE).write_bytes(content)
    with pytest.raises(InputFileError) as err:
        ckpt.read_latest(str(tmp_path))
    assert str(err.value) == f"{tmp_path / ckpt.LATEST_FILE}: expected an iteration number, found {shown}"


def test_bad_requests_raise_clear_errors(tmp_path):
    run = ToyRun(seed=0)
    ckpt.save_checkpoint(str(tmp_path), 1, run.parts(), RankLayout())
    with pytest.raises(ValueError, match="has no part 'teacher'"):
        ckpt.load_checkpoint(str(tmp_path), {"teacher": tensors_part({})}, RankLayout())
    with pytest.raises(InputFileError) as err:   # no setting changes it: no hint (it named checkpoint.model_format)
        ckpt.load_checkpoint(str(tmp_path), {"data": stateful_part(run.sampler, Scope.RANK)}, RankLayout())
    assert err.value.detail == "part 'data' was saved with scope 'global', the run asks for 'rank'"
    with pytest.raises(InputFileError) as err:   # the optimizer's: optimizer.use_distributed_optimizer, as saved
        ckpt.load_checkpoint(str(tmp_path), {"optimizer": stateful_part(run.opt, Scope.RANK)}, RankLayout())
    assert err.value.detail == ("part 'optimizer' was saved with scope 'model_parallel', the run asks for 'rank': "
                                "resume with --optimizer.use_distributed_optimizer=false (the checkpoint's), or skip "
                                "it (--checkpoint.no_load_optim)")
    other = ToyRun(seed=0)
    other.model[0] = torch.nn.Linear(DIM, 8)
    with pytest.raises(InputFileError, match=r"iter_0000001/model_parallel_tp00_pp000.pt: part 'model' does not fit this "
                                             r"run: checkpoint tensor 0.weight: shape \(16, 6\) in the checkpoint, "
                                             r"\(8, 6\) in the model$"):
        ckpt.load_checkpoint(str(tmp_path), {"model": tensors_part(dict(other.model.named_parameters()))}, RankLayout())
    (tmp_path / ckpt.LATEST_FILE).write_text("release")
    with pytest.raises(ValueError, match="pretrained_checkpoint"):
        ckpt.load_checkpoint(str(tmp_path), run.parts(), RankLayout())
    (tmp_path / ckpt.LATEST_FILE).write_text("9")
    with pytest.raises(FileNotFoundError, match="iter_0000009: no complete checkpoint"):
        ckpt.load_checkpoint(str(tmp_path), run.parts(), RankLayout())


def test_a_latest_file_naming_a_deleted_checkpoint_names_those_there(tmp_path):
    """A resume whose latest_checkpointed_iteration.txt names a deleted iteration: the line named only the
    missing one; it also names the checkpoints there, so the user can write one into the latest file."""
    run = ToyRun(seed=0)
    for iteration in (2, 4, 6):
        ckpt.save_checkpoint(str(tmp_path), iteration, run.parts(), RankLayout())
    shutil.rmtree(tmp_path / "iter_0000006")   # deleted by hand (a full disk)
    latest = tmp_path / ckpt.LATEST_FILE
    with pytest.raises(FileNotFoundError) as err:
        ckpt.load_checkpoint(str(tmp_path), run.parts(), RankLayout())
    assert str(err.value) == (f"{tmp_path}/iter_0000006: no complete checkpoint here (meta.json missing); {latest} "
                              "names it, the checkpoints there: iter_0000002, iter_0000004 (write the iteration of "
                              "one into it, or use a new --checkpoint.save directory to start afresh)")
    latest.write_text("4")   # as the line says: the resume goes on from there
    assert ckpt.load_checkpoint(str(tmp_path), run.parts(), RankLayout()).iteration == 4
