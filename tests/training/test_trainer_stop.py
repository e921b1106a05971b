"""Stopping a run from outside, as a scheduler or a user does, on the tiny CPU preset:

* SIGTERM (``checkpoint.exit_signal``, a preemption; twice, as Slurm and torchrun both send it): the
  step in flight finishes, a checkpoint is written there, one line says so, exit code 143 (128 + 15);
  the same command resumes from that step, with ``--checkpoint.load`` too (its own checkpoints first);
* SIGTERM delivered to one rank only under torchrun: every rank agrees and saves;
* SIGTERM that stops the engine too (Slurm signals every process of the job): still the signal's stop;
* SIGTERM with ``rollout.sync_interval`` = 2: the stop waits for the step after which the weights are
  pushed, so the resumed run's engine holds the weights the uninterrupted run's would;
* Ctrl-C (SIGINT): one line naming the last checkpoint, exit code 130, no traceback;
* a rank lost while the run starts, then torchrun's SIGTERM in the teardown: ignored (exit code 1, its line);
* SIGTERM in the cleanup after an error (a failed start's, the teardown): ignored, the error keeps its line and code;
* ``--checkpoint.load`` naming a directory without a checkpoint: one line, before any model is built.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from ..helpers.tiny_run import assert_ok, read_metrics, train, train_command, train_failing_engine

LONG = ("--training.train_iters=200", "--checkpoint.save_interval=0")


def _start(hf: str, data: str, run_dir: str, *overrides: str, nproc: int = 1) -> tuple[subprocess.Popen, str]:
    """The trainer started in the background (output in ``<run_dir>.log``), once it has logged 2 steps."""
    argv, env = train_command(hf, data, run_dir, *LONG, *overrides, nproc=nproc)
    log = f"{run_dir}.log"
    proc = subprocess.Popen(argv, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    metrics = os.path.join(run_dir, "metrics.jsonl")
    while not (os.path.isfile(metrics) and len(open(metrics).readlines()) >= 2):
        assert proc.poll() is None and time.monotonic() < deadline, open(log).read()[-4000:]
        time.sleep(0.2)
    return proc, log


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        kids = [int(p) for p in f.read().split()]
    return kids + [g for k in kids for g in _children(k)]


def _worker(torchrun_pid: int, rank: int) -> int:
    """The pid of torchrun's worker of global rank ``rank``."""
    for pid in _children(torchrun_pid):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
        except OSError:
            continue
        if env.get(b"RANK") == str(rank).encode() and env.get(b"LOCAL_RANK") is not None:
            return pid
    raise AssertionError(f"no worker of rank {rank} under torchrun {torchrun_pid}")


def test_sigterm_saves_the_step_in_flight_and_the_same_command_resumes(tiny_inputs, tmp_path):
    hf, data = tiny_inputs
    run = str(tmp_path / "run")
    proc, log = _start(hf, data, run)
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGTERM)  # Slurm's and torchrun's: a repeat is noted again, not a kill
    assert proc.wait(timeout=300) == 128 + signal.SIGTERM, open(log).read()[-4000:]
    out = open(log).read()
    steps = [m["step"] for m in read_metrics(run)]
    stopped = steps[-1]
    assert steps == list(range(1, stopped + 1)) and stopped >= 2
    line = (f"phf_megatron.train: SIGTERM received: stopped after step {stopped} of 200, saved as "
            f"{os.path.join(run, 'checkpoints', f'iter_{stopped:07d}')}; rerun the same command to resume")
    assert line in out.splitlines() and "Traceback" not in out, out[-4000:]
    assert sorted(os.listdir(os.path.join(run, "checkpoints"))) == [f"iter_{stopped:07d}",
                                                                     "latest_checkpointed_iteration.txt"]
    assert not os.path.exists(os.path.join(run, "export"))  # not finished: nothing exported
    resumed = train(hf, data, run, f"--training.train_iters={stopped + 1}", "--checkpoint.save_interval=0")
    assert_ok(resumed)
    assert f"resuming from step {stopped} of {stopped + 1}" in resumed.stdout
    assert [m["step"] for m in read_metrics(run)] == list(range(1, stopped + 2))


def test_sigterm_to_one_rank_stops_and_saves_every_rank(tiny_inputs, tmp_path):
    """torchrun may pass a signal to one worker before the other: the ranks agree at the step's end."""
    hf, data = tiny_inputs
    run = str(tmp_path / "run")
    proc, log = _start(hf, data, run, nproc=2)
    os.kill(_worker(proc.pid, 1), signal.SIGTERM)
    proc.wait(timeout=300)
    out = open(log).read()
    match = re.search(r"SIGTERM received: stopped after step (\d+) of 200, saved as (\S+);", out)
    assert match and not re.search(r"\[rank\d\]:.*Traceback", out), out[-4000:]  # (torchrun's own report follows)
    files = os.listdir(match.group(2))
    assert "rank_tp00_pp000_dp000.pt" in files and "rank_tp00_pp000_dp001.pt" in files, files
    assert read_metrics(run)[-1]["step"] == int(match.group(1))


@pytest.mark.parametrize("where", ["sample", "sync"])
def test_sigterm_that_also_stops_the_engine_is_still_a_signal_stop(tiny_inputs, tmp_path, where):
    """Slurm signals every process of the job step, the engine's too (vLLM's engine core and the watcher
    that stops it exit on SIGTERM): the engine's failure in the step in flight is then the signal's
    stop, saved as an engine failure saves (here at step 2, a push), exit code 143 (it was an engine error with
    exit code 1)."""
    hf, data = tiny_inputs
    run = str(tmp_path / "run")
    proc = train_failing_engine(hf, data, run, f"{where}+SIGTERM", 2, "--training.train_iters=4",
                                "--checkpoint.save_interval=0")
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    saved = os.path.join(run, "checkpoints", "iter_0000002")
    failed = "sampling failed at step 2" if where == "sample" else "weight sync to version 2 failed"
    line = (f"phf_megatron.train: SIGTERM received: stopped after step 2 of 4, the rollout engines stopped on it too "
            f"(rollout engine 0 (host rank 0): {failed} (RuntimeError): injected engine fault); the last checkpoint "
            f"is {saved}; rerun the same command to resume")
    assert line in proc.stdout.splitlines() and "error:" not in proc.stderr, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(os.listdir(os.path.join(run, "checkpoints"))) == ["iter_0000002", "latest_checkpointed_iteration.txt"]
    resumed = train(hf, data, run, "--training.train_iters=3", "--checkpoint.save_interval=0")
    assert_ok(resumed)
    assert "resuming from step 2 of 3" in resumed.stdout and [m["step"] for m in read_metrics(run)] == [1, 2, 3]


def test_ctrl_c_is_one_line_naming_the_last_checkpoint(tiny_inputs, tmp_path):
    hf, data = tiny_inputs
    run = str(tmp_path / "run")
    proc, log = _start(hf, data, run, "--checkpoint.save_interval=1")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=300) == 130, open(log).read()[-4000:]
    out = open(log).read()
    assert "Traceback" not in out, out[-4000:]
    [line] = [line for line in out.splitlines() if line.startswith("error: ")]
    with open(os.path.join(run, "checkpoints", "latest_checkpointed_iteration.txt")) as f:  # (Ctrl-C may cut
        last = os.path.join(run, "checkpoints", f"iter_{int(f.read()):07d}")                # a save short)
    assert re.fullmatch(rf"error: interrupted during step \d+ of 200; the last checkpoint is {re.escape(last)}; "
                        "rerun the same command to resume", line), line


def test_a_run_started_from_another_runs_checkpoint_resumes_its_own(tiny_inputs, tmp_path):
    """``--checkpoint.load`` names where a run starts; once it has saved, the same command resumes its own."""
    hf, data = tiny_inputs
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    assert_ok(train(hf, data, first, "--training.train_iters=2"))
    start = ("--checkpoint.save_interval=0", f"--checkpoint.load={os.path.join(first, 'checkpoints')}")
    proc = train(hf, data, second, *start, "--training.train_iters=3")
    assert_ok(proc)
    assert "resuming from step 2 of 3" in proc.stdout
    proc = train(hf, data, second, *start, "--training.train_iters=4")
    assert_ok(proc)
    assert f"resuming from step 3 of 4 ({os.path.join(second, 'checkpoints', 'iter_0000003')})" in proc.stdout
    assert [m["step"] for m in read_metrics(second)] == [3, 4]


_NO_CHECKPOINT = "{load} holds no checkpoint (no latest_checkpointed_iteration.txt): "


@pytest.mark.parametrize("where, detail", [
    ("missing", "{load} does not exist"),   # as every other path setting says it, not 'holds no checkpoint'
    ("run", _NO_CHECKPOINT + "did you mean {run}/checkpoints?"),
    ("iter", _NO_CHECKPOINT + "pass the directory above it, {run}/checkpoints (a run resumes from its latest)"),
    ("file", _NO_CHECKPOINT + "it is a file: pass the checkpoints directory that holds it"),
])
def test_a_load_directory_without_a_checkpoint_is_one_line(tiny_inputs, tmp_path, where, detail):
    hf, data = tiny_inputs
    run = str(tmp_path / "done")
    os.makedirs(os.path.join(run, "checkpoints", "iter_0000002"))
    with open(os.path.join(run, "checkpoints", "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("2")
    load = {"missing": str(tmp_path / "nope"), "run": run, "iter": os.path.join(run, "checkpoints", "iter_0000002"),
            "file": os.path.join(run, "checkpoints", "latest_checkpointed_iteration.txt")}
    proc = train(hf, data, str(tmp_path / "new"), f"--checkpoint.load={load[where]}")
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and lines == [
        "error: --checkpoint.load: " + detail.format(load=load[where], run=run)], proc.stderr[-3000:]


def test_sigterm_between_weight_pushes_stops_after_the_next_push(tiny_inputs, tmp_path):
    """With rollout.sync_interval=2 the engine samples step 2k+2 with the weights of step 2k: a stop after
    an odd step would resume with the engine holding newer weights than the run it continues. The run
    stops after an even step, and its resumed steps are sampled one and zero pushes behind as before."""
    hf, data = tiny_inputs
    run = str(tmp_path / "run")
    proc, log = _start(hf, data, run, "--rollout.sync_interval=2")
    proc.send_signal(signal.SIGTERM)  # (after step 2 is logged: step 3 is in flight)
    assert proc.wait(timeout=300) == 128 + signal.SIGTERM, open(log).read()[-4000:]
    stopped = read_metrics(run)[-1]["step"]
    assert stopped % 2 == 0, stopped
    assert_ok(train(hf, data, run, "--checkpoint.save_interval=0", f"--training.train_iters={stopped + 2}",
                    "--rollout.sync_interval=2"))
    assert [m["rollout_staleness"] for m in read_metrics(run)] == [0, 1] * (stopped // 2 + 1)


#: ``python -c``: the trainer's command line (``sys.argv[3:]``), with SIGTERM sent twice (Slurm's and torchrun's) as
#: the function ``sys.argv[2]`` of the module ``sys.argv[1]`` runs: a preemption while the run starts.
_SIGTERM_WHILE_STARTING = """
import importlib, os, signal, sys, time
def preempted(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(120)  # what a long model build would be: the signal must not wait for it
setattr(importlib.import_module(sys.argv[1]), sys.argv[2], preempted)
from phf_megatron.train import main
sys.exit(main(sys.argv[3:]))
"""


@pytest.mark.parametrize("during", ["phf_megatron.training.loop.build_student",   # the process group is up
                                    "phf_megatron.training.checkpoint.require_checkpoint"])   # before it
def test_sigterm_while_the_run_starts_is_one_line_and_143(tiny_inputs, tmp_path, during):
    """A preemption before the first step (the checkpoint's checks, model build, resume, the engines' start:
    minutes at 8B) killed the process without a word; now it stops at once, one line naming what is kept, exit
    code 128 + 15, as a stop after a step, and the same command resumes."""
    hf, data = tiny_inputs
    run = str(tmp_path / "run")
    assert_ok(train(hf, data, run, "--training.train_iters=2"))
    argv, env = train_command(hf, data, run, "--training.train_iters=4")
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _SIGTERM_WHILE_STARTING, *during.rsplit(".", 1), *argv[3:]],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM and time.monotonic() - t0 < 100, proc.stderr[-4000:]
    checkpoint = os.path.join(run, "checkpoints", "iter_0000002")
    assert proc.stderr.splitlines()[-1:] == [
        f"error: SIGTERM received while the run was starting: stopped before its first step; the last checkpoint is "
        f"{checkpoint}; rerun the same command to resume"], proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr and [m["step"] for m in read_metrics(run)] == [1, 2]


#: ``python -c``: the model build fails as ``sys.argv[1]`` says (``stop``: a SIGTERM, which stops the start; ``lost``:
#: another rank gone, a collective's ``DistNetworkError``, which ``distributed.lost_rank`` makes the ``LostRank``),
#: then a second SIGTERM (torchrun's, passed on after Slurm's, or sent to the survivors as a worker died) comes as
#: the run tears down its process group.
_SIGTERM_IN_THE_TEARDOWN = """
import os, signal, sys, time
import torch.distributed as dist
from phf_megatron.training import distributed, loop
def build_student(*args, **kwargs):
    if sys.argv[1] == "lost":
        raise dist.DistNetworkError("Connection reset by peer")
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(120)
loop.build_student = build_student
shutdown = distributed.shutdown_distributed
def shutdown_distributed():
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(1)
    shutdown()
distributed.shutdown_distributed = shutdown_distributed
from phf_megatron.train import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("start, code, line", [
    ("stop", 128 + signal.SIGTERM, "SIGTERM received while the run was starting: stopped before its first step"),
    ("lost", 1, "lost contact with another rank (starting: Connection reset by peer); a process or node of the run "
                "died or stopped answering")])
def test_a_second_sigterm_while_a_stopped_start_unwinds_is_ignored(tiny_inputs, tmp_path, start, code, line):
    """Slurm's SIGTERM and torchrun's reach a worker a few ms apart: the second one, coming once the first has
    stopped the start, must not kill the process by the signal on its way out (the handler's signal was restored
    to the default as the stop left ``stopping_at_once``: rc -15, not 143). Nor torchrun's after another rank was
    lost as the run started: ``lost_rank`` ignores it to the exit, and ``stopping_at_once``, left by the
    ``LostRank``, set its own ``previous`` back over that (rc -15, not 1)."""
    hf, data = tiny_inputs
    argv, env = train_command(hf, data, str(tmp_path / "run"), "--training.train_iters=2")
    proc = subprocess.run([sys.executable, "-c", _SIGTERM_IN_THE_TEARDOWN, start, *argv[3:]], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == code, proc.stderr[-4000:]
    assert proc.stderr.splitlines()[-1:] == [
        f"error: {line}; no checkpoint was saved; rerun the same command to resume"], proc.stderr[-4000:]


#: ``python -c``: the run fails as ``sys.argv[1]`` says, then SIGTERM (a preemption) comes in the cleanup that follows:
#: ``engine``: the engine does not start, the signal as the process group shuts down; ``resume``: the resume is refused
#: once the engines run, the signal as they stop; ``run``: sampling fails in step 1, the signal as the trainer closes.
_SIGTERM_IN_AN_ERRORS_CLEANUP = """
import os, signal, sys, time
from phf_megatron.errors import ConfigError
from phf_megatron.rollout import EngineStartError
from phf_megatron.training import distributed, loop, rollouts
def signalled(cleanup):
    def with_sigterm(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)
        return cleanup(*args, **kwargs)
    return with_sigterm
def fail(error):
    def failing(*args, **kwargs):
        raise error
    return failing
if sys.argv[1] == "engine":
    rollouts.build_engine = fail(EngineStartError("injected: the engine did not start"))
    distributed.shutdown_distributed = signalled(distributed.shutdown_distributed)
elif sys.argv[1] == "resume":
    loop.Trainer._maybe_resume = fail(ConfigError("checkpoint.load", "injected refusal"))
    rollouts.RolloutDriver.close = signalled(rollouts.RolloutDriver.close)
else:
    rollouts.RolloutDriver.sample = fail(RuntimeError("injected engine fault"))
    loop.Trainer.close = signalled(loop.Trainer.close)
from phf_megatron.train import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("failure, code, line", [
    # the engine's own failure to start: one line (was the RolloutFailure traceback: engine_start.py)
    ("engine", 1, "error: rollout engine 0 (host rank 0): failed to start: injected: the engine did not start; "
                  "no checkpoint was saved; rerun the same command to resume"),
    ("resume", 2, "error: --checkpoint.load: injected refusal"),
    ("run", 1, "error: rollout engine 0 (host rank 0): sampling failed at step 0 (RuntimeError): injected engine "
               "fault; the last checkpoint is {run}/checkpoints/iter_0000000; rerun the same command to resume")])
def test_a_sigterm_in_the_cleanup_after_an_error_does_not_take_its_place(tiny_inputs, tmp_path, failure, code, line):
    """A preemption that comes while the run cleans up after its error (the engines' stop, the process group's
    shutdown) is ignored: the error stays the one said, with its exit code. Before, the signal took its place:
    the start's handler raised its own line (143) over a refused resume, and in the teardown, the start's
    handler gone, the signal killed the process without a line (rc -15)."""
    hf, data = tiny_inputs
    run = str(tmp_path / "run")
    argv, env = train_command(hf, data, run, "--training.train_iters=2")
    proc = subprocess.run([sys.executable, "-c", _SIGTERM_IN_AN_ERRORS_CLEANUP, failure, *argv[3:]], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == code, proc.stderr[-4000:]
    assert proc.stderr.splitlines()[-1:] == [line.format(run=run)], proc.stderr[-4000:]
