"""A rank that dies in a run of several (the OOM killer, a failed node: SIGKILL, no last word): the ranks left
end with one line naming what happened, the step and the last checkpoint (exit code non-zero, no traceback:
it was gloo's "Connection reset by peer" on every rank), write nothing more, and the same command resumes.

* one torchrun, rank 1 killed as it writes step 2's checkpoint: rank 0 fails in the save's agreement (its
  files stay in ``tmp-iter_0000002``, never read, removed by the next save), ``iter_0000001`` stays the latest,
  torchrun's SIGTERM to rank 0 (it stops every worker as soon as one dies) does not cut the line short;
* two torchrun agents (two nodes on this machine), the second node killed whole (agent and rank) at step 3:
  the first node's rank says so;
* rank 0 killed as the run starts (before the engines get the first weights): rank 1 says so, ``[rank 1]`` first;
* the rollout engine failing, then rank 1 killed as it writes the checkpoint saved for that failure: the line
  names the engine's failure first (the root cause), then the lost rank;
* each time the line is out before any cleanup starts (the engines' shutdown, the process group's): torchrun
  SIGKILLs the survivors 30 s after a worker dies, which a slow cleanup would outlast, cutting the line;
* what counts as a lost rank (``distributed.lost_contact``): gloo's transport errors as torch 2.13 raises them
  (a plain ``RuntimeError``: matched by their text), a ``DistNetworkError``, NCCL's remote error;
  not a timeout (a stuck rank times out the same way), not gloo's or NCCL's other errors (a bug: its traceback
  stays), nor the same words from anything else.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest
import torch.distributed as dist

from phf_megatron.runtime.process_group import free_port
from phf_megatron.training.checkpoint import list_checkpoints, read_latest
from phf_megatron.training.distributed import lost_contact

from ..helpers import run_python
from ..helpers.tiny_run import assert_ok, read_metrics, train, train_command
from .lost_rank_run import CLEANUP, ENGINE_FAULT, FAULT

RUN = ("--training.train_iters=4", "--checkpoint.save_interval=1")


def _argv(hf: str, data: str, run: str, **torchrun) -> tuple[list[str], dict[str, str]]:
    argv, env = train_command(hf, data, run, *RUN, **torchrun)
    argv[argv.index("phf_megatron.train")] = "tests.training.lost_rank_run"
    return argv, env


def _assert_one_line(out: str, line: str) -> None:
    """``line`` is the run's only ``error:`` line (a regex), out before any cleanup started (``CLEANUP``), and no
    rank printed a traceback (torchrun's own report of its failed worker follows, as for any failed worker)."""
    errors = [x for x in out.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and re.fullmatch(line, errors[0]), out[-6000:]
    assert CLEANUP in out and out.index(errors[0]) < out.index(CLEANUP), out[-6000:]
    assert not re.search(r"\[rank\d+\]:", out) and "gloo" not in out and out.count("Traceback") <= 1, out[-6000:]


@pytest.mark.slow  # two torchrun worlds of 2 ranks (~35 s on 2 cores)
def test_a_killed_rank_stops_the_other_with_one_line_and_the_last_checkpoint_resumes(tiny_inputs, tmp_path):
    hf, data = tiny_inputs
    run = str(tmp_path / "run")
    save = os.path.join(run, "checkpoints")
    argv, _ = _argv(hf, data, run, nproc=2)
    proc = run_python(argv[1:], timeout=600, **{FAULT: "process:save:1:2"})
    assert proc.returncode == 1, proc.stderr[-4000:]
    _assert_one_line(proc.stderr, (
        r"error: lost contact with another rank \(saving step 2: .*(Connection reset by peer|Connection closed by "
        r"peer).*\); a process or node of the run died or stopped answering; the last checkpoint is "
        + re.escape(os.path.join(save, "iter_0000001")) + r", the steps after it are redone; rerun the same "
        r"command to resume"))
    assert list_checkpoints(save) == [1] and read_latest(save) == 1, os.listdir(save)
    assert os.path.isdir(os.path.join(save, "tmp-iter_0000002"))  # the save in flight: rank 0's files, never read
    assert [m["step"] for m in read_metrics(run)] == [1, 2]  # step 2 trained; its save did not finish
    resumed = train(hf, data, run, *RUN[1:], "--training.train_iters=3", nproc=2)
    assert_ok(resumed)
    assert f"resuming from step 1 of 3 ({os.path.join(save, 'iter_0000001')})" in resumed.stdout
    assert [m["step"] for m in read_metrics(run)] == [1, 2, 3] and list_checkpoints(save) == [2, 3]
    assert not [e for e in os.listdir(save) if e.startswith("tmp-")]


@pytest.mark.slow  # ~25 s on 2 cores
def test_a_killed_node_stops_the_other_nodes_ranks_with_one_line(tiny_inputs, tmp_path):
    hf, data = tiny_inputs
    run = str(tmp_path / "run")
    port, procs = free_port(), []
    try:
        for node in (0, 1):
            argv, env = _argv(hf, data, run, torchrun=("--nnodes=2", f"--node-rank={node}", "--master-addr=127.0.0.1",
                                                       f"--master-port={port}"))
            procs.append(subprocess.Popen(argv, env={**env, FAULT: "node:step:1:3"}, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        out, err = procs[0].communicate(timeout=600)
        procs[1].communicate(timeout=60)
    finally:
        for p in procs:
            p.kill()
    assert procs[0].returncode == 1 and procs[1].returncode == -9, err[-4000:]
    save = os.path.join(run, "checkpoints")
    _assert_one_line(err, (
        r"error: lost contact with another rank \(step 3 of 4: .*\); a process or node of the run died or stopped "
        r"answering; the last checkpoint is " + re.escape(os.path.join(save, "iter_0000002"))
        + r", the steps after it are redone; rerun the same command to resume"))
    assert list_checkpoints(save) == [1, 2] and read_latest(save) == 2, os.listdir(save)
    assert not [e for e in os.listdir(save) if e.startswith("tmp-")]


@pytest.mark.slow  # ~20 s on 2 cores
def test_a_rank_killed_as_the_run_starts_stops_the_other_with_one_line(tiny_inputs, tmp_path):
    hf, data = tiny_inputs
    # torchrun polls its workers every 2 s (0.1 s by default): on a loaded machine its SIGTERM (the stop-at-start
    # path, whose line rank 0 says, dead here) could reach rank 1 in the ms between gloo's error and its line
    argv, _ = _argv(hf, data, str(tmp_path / "run"), nproc=2, torchrun=("--standalone", "--monitor-interval=2"))
    proc = run_python(argv[1:], timeout=600, **{FAULT: "process:start:0:0"})
    assert proc.returncode == 1, proc.stderr[-4000:]
    _assert_one_line(proc.stderr, (
        r"error: \[rank 1\] lost contact with another rank \(starting: .*(Connection reset by peer|Connection closed "
        r"by peer).*\); a process or node of the run died or stopped answering; no checkpoint was saved; rerun the "
        r"same command to resume"))


@pytest.mark.slow  # ~30 s on 2 cores
def test_a_rank_lost_saving_after_an_engine_failure_names_both(tiny_inputs, tmp_path):
    hf, data = tiny_inputs
    run = str(tmp_path / "run")
    save = os.path.join(run, "checkpoints")
    argv, _ = _argv(hf, data, run, nproc=2)
    argv.append("--checkpoint.save_interval=2")  # step 3 is saved for the engine's failure only
    proc = run_python(argv[1:], timeout=600, **{FAULT: "process:save:1:3", ENGINE_FAULT: "3"})
    assert proc.returncode == 1, proc.stderr[-4000:]
    _assert_one_line(proc.stderr, (
        r"error: rollout engine 0 \(host rank 0\): sampling failed at step 3 \(RuntimeError\): injected engine fault; "
        r"then lost contact with another rank \(saving step 3: .*(Connection reset by peer|Connection closed by "
        r"peer).*\); a process or node of the run died or stopped answering; the last checkpoint is "
        + re.escape(os.path.join(save, "iter_0000002")) + r", the steps after it are redone; rerun the same "
        r"command to resume"))
    assert list_checkpoints(save) == [2] and read_latest(save) == 2, os.listdir(save)


GLOO = "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/{}] {}"
WATCHDOG = ("[PG ID 0 PG GUID 0(default_pg) Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, "
            "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600021 milliseconds before timing out.")


@pytest.mark.parametrize("err, line", [
    (RuntimeError(GLOO.format("pair.cc:553", "Connection closed by peer [127.0.0.1]:37273. This is typically caused "
                              "by a remote worker crashing. Check the logs of the remote worker before reporting an "
                              "error. GLHF! 🏖️")), "Connection closed by peer [127.0.0.1]:37273"),
    (RuntimeError(GLOO.format("pair.cc:537", "Read error [127.0.0.1]:1963: Connection reset by peer. This is "
                              "typically caused by a remote worker hanging")), "Read error [127.0.0.1]:1963: Connection reset by peer"),
    (dist.DistNetworkError("failed to recv, got 0 bytes"), "failed to recv, got 0 bytes"),
    (dist.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp:3356, remote process exited or there was a network "
                           "error, NCCL version 2.27.5\nncclRemoteError: A call failed possibly due to a network error"),
     "NCCL error in: ProcessGroupNCCL.cpp:3356, remote process exited or there was a network error, NCCL version 2.27.5"),
    # not a lost rank: a timeout (a stuck rank, a deadlock or a mismatched collective, times out the same way:
    # its traceback says where), a bug in the call (sizes that differ), NCCL's invalid usage, the same words
    # from elsewhere
    (RuntimeError(GLOO.format("unbound_buffer.cc:78", "Timed out waiting 3000ms for recv operation to complete")),
     None),
    (RuntimeError("Application timeout caused pair closure"), None),
    (dist.DistBackendError(WATCHDOG), None),
    (RuntimeError("[enforce fail at /__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:446] "
                  "op.preamble.length <= op.nbytes. 16 vs 8"), None),
    (dist.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp:3356, invalid usage (run with NCCL_DEBUG=WARN for "
                           "details), NCCL version 2.27.5"), None),
    (ConnectionResetError("Connection reset by peer"), None),
    (ValueError("Application timeout caused pair closure"), None),
])
def test_what_counts_as_a_lost_rank(err, line):
    assert lost_contact(err) == line
    wrapped = RuntimeError("checkpoint iter_0000002 not saved")
    wrapped.__cause__ = err
    assert lost_contact(wrapped) == line  # found through what it was raised from
