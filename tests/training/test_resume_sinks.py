"""What a researcher watches across a kill and resume: the trainer killed (SIGKILL-like, no cleanup) right
after logging step 3, its last checkpoint at step 2, then the same command. metrics.jsonl and TensorBoard
hold each step once with the resumed run's values; W&B continues the same run from the step after the
killed run's last."""

from __future__ import annotations

import glob
import os

import pytest

from phf_megatron.training.metrics import scalars

from ..helpers.tiny_run import assert_ok, read_metrics, run_python, train_command
from .wandb_files import wandb_complete, wandb_history, wandb_run_id

#: ``python -c``: the trainer (``sys.argv[2:]``), ended by os._exit right after it logged step ``sys.argv[1]``.
_KILLED_AFTER_LOGGING = """
import os, sys
from phf_megatron.training import metrics
step, log = int(sys.argv[1]), metrics.MetricsLogger.log
def log_then_die(self, s, values):
    log(self, s, values)
    if s == step:
        os._exit(137)
metrics.MetricsLogger.log = log_then_die
from phf_megatron.train import main
sys.exit(main(sys.argv[2:]))
"""


def test_a_killed_and_resumed_run_shows_each_step_once_in_every_sink(tiny_inputs, tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # offline: nothing may reach the network
    _use_wandb_here(tmp_path)
    hf, data = tiny_inputs
    run = str(tmp_path / "run")
    argv, _ = train_command(hf, data, run, "--training.train_iters=4", "--checkpoint.save_interval=2",
                            "--logging.tensorboard=true", "--logging.wandb", "--logging.wandb_offline")
    killed = run_python(["-c", _KILLED_AFTER_LOGGING, "3", *argv[3:]], timeout=600)
    assert killed.returncode == 137, killed.stderr[-3000:]
    assert [m["step"] for m in read_metrics(run)] == [1, 2, 3]
    assert_ok(run_python(argv[1:], timeout=600))   # the same command: resumes from step 2

    records = read_metrics(run)
    assert [m["step"] for m in records] == [1, 2, 3, 4]
    acc = EventAccumulator(os.path.join(run, "tensorboard"))
    acc.Reload()
    for record in records:
        for key, value in scalars(record).items():
            events = [e.value for e in acc.Scalars(key) if e.step == record["step"]]
            assert events == [pytest.approx(value, rel=1e-6)], (record["step"], key)  # once, the resumed run's
    # W&B names each part's file after its run id (the killed part's file may hold no record yet)
    paths = sorted(glob.glob(os.path.join(run, "wandb", "offline-run-*", "run-*.wandb")))
    assert len(paths) == 2 and os.path.basename(paths[0]) == os.path.basename(paths[1]), paths
    resumed_path = wandb_complete(paths[1])
    assert wandb_run_id(resumed_path) + ".wandb" == os.path.basename(resumed_path).removeprefix("run-")
    resumed = wandb_history(resumed_path)
    assert sorted(resumed) == [4]
    assert resumed[4] == pytest.approx(scalars(records[3]), rel=1e-12)


def _use_wandb_here(tmp_path) -> None:
    """A W&B run in this process, as a notebook or an earlier test makes one: wandb leaves its service
    running and names it in WANDB_SERVICE, which the trainer processes inherit. The killed trainer's run id
    stays registered in that service (the trainer must start its own, or the resume fails: 'in use')."""
    import wandb

    wandb.teardown()  # a fresh service, named in WANDB_SERVICE (an earlier test's may be running unnamed)
    wandb.init(project="phf-test", dir=str(tmp_path), mode="offline",
               settings=wandb.Settings(silent=True, console="off", x_disable_stats=True)).finish()
    assert os.environ.get("WANDB_SERVICE")
