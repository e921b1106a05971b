"""The trainer as a user runs it, on the tiny CPU preset: ``python -m phf_megatron.train`` (under
torchrun for several ranks) on a toy math JSONL; its metrics; the warning lines of a job's log; the
final student's logits (``train_recording_logits``); an engine failing at a chosen step (``train_failing_engine``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from . import REPO, python_env, run_python

#: Lines that are warnings: Python's (``...: UserWarning: ...``), vLLM's (``(EngineCore pid=1) WARNING
#: 11-24 ...``) and torch's own log (``[rank0]:W1124 04:19:02.41 ...``, ``[W1124 ... utils.cpp:68] Warning:``).
WARNING_LINE = re.compile(r"\b\w*Warning: |\bWARNING\b|(^|\]:)\[?W\d{4} \d\d:\d\d")


def warning_lines(log: str) -> list[str]:
    """The lines of a job's log that are warnings (none at the default verbosity)."""
    return [line for line in log.splitlines() if WARNING_LINE.search(line)]


def make_toy_jsonl(path: str, rows: int = 16) -> str:
    from phf_megatron.data.toy import toy_row

    with open(path, "w") as f:
        for a in range(10, 10 + rows):
            r = toy_row(a, a + 7)
            f.write(json.dumps({"problem": r.problem, "solution": r.solution, "answer": r.answer}) + "\n")
    return path


def train_command(hf_dir: str, data: str, run_dir: str, *overrides: str, nproc: int = 1,
                  torchrun: tuple[str, ...] = ()) -> tuple[list[str], dict[str, str]]:
    """``(argv, env)`` of ``python -m phf_megatron.train`` on the tiny CPU preset: a plain process for
    nproc 1, else under torchrun (``--standalone``, or the agent options ``torchrun``)."""
    args = ["--config", os.path.join(REPO, "configs", "tiny_cpu.yaml"), f"--model.hf_dir={hf_dir}",
            f"--data.path={data}", f"--run_dir={run_dir}", "--logging.tensorboard=false",
            "--logging.progress_bar=false", "--rollout.backend=hf", "--rollout.max_tokens=12", *overrides]
    launcher = ["-m", "phf_megatron.train"] if nproc == 1 and not torchrun else [
        "-m", "torch.distributed.run", *(torchrun or ("--standalone",)), f"--nproc-per-node={nproc}",
        "-m", "phf_megatron.train"]
    return [sys.executable, *launcher, *args], python_env()


def train(hf_dir: str, data: str, run_dir: str, *overrides: str, nproc: int = 1, timeout: int = 600,
          **env: str) -> subprocess.CompletedProcess:
    """``python -m phf_megatron.train`` (under torchrun for nproc > 1) on the tiny CPU preset (``env``: variables
    set for it)."""
    argv, _env = train_command(hf_dir, data, run_dir, *overrides, nproc=nproc)
    return run_python(argv[1:], timeout=timeout, **env)


#: ``python -c``: the trainer's command line (``sys.argv[3:]``), and before the trainer closes, its
#: final student's logits on the token ids ``json(sys.argv[2])`` ([b, s], fp32 [b, s, V]) saved to ``sys.argv[1]``.
_RECORD_LOGITS = """
import json, sys, torch
from phf_megatron.models.provider import unwrap
from phf_megatron.training import loop
out, ids = sys.argv[1], torch.tensor(json.loads(sys.argv[2]))
close = loop.Trainer.close
def record_then_close(self):
    model = unwrap(self.student.chunks[0]).eval()
    with torch.no_grad():
        logits = model(ids, torch.arange(ids.shape[1])[None].expand_as(ids), attention_mask=None)
    torch.save(logits.float(), out)
    close(self)
loop.Trainer.close = record_then_close
from phf_megatron.train import main
sys.exit(main(sys.argv[3:]))
"""


def train_recording_logits(hf_dir: str, data: str, run_dir: str, logits_path: str, ids: list[list[int]],
                           *overrides: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """``train`` in one process, also saving the final student's logits on ``ids`` to ``logits_path``
    (the trainer's own model, as it is when the run ends)."""
    argv, _env = train_command(hf_dir, data, run_dir, *overrides)
    return run_python(["-c", _RECORD_LOGITS, logits_path, json.dumps(ids), *argv[3:]], timeout=timeout)


#: ``python -c``: the trainer's command line (``sys.argv[3:]``), its engine failing (through the real error path:
#: the host's exception, then ``RolloutFailure`` on every rank) when sampling the rollouts of step ``sys.argv[2]``
#: (0-based, as the error names it) or when pushing weights version ``sys.argv[2]`` (``sys.argv[1]``: sample, sync;
#: ``sample+SIGTERM``: the process gets the signal as its engine fails, as Slurm signals the trainer and engine together).
_FAILING_ENGINE = """
import os, signal, sys
from phf_megatron.training import rollouts
(where, _, sig), step = sys.argv[1].partition("+"), int(sys.argv[2])
def fail(*args, **kwargs):
    if sig:
        os.kill(os.getpid(), getattr(signal, sig))
    raise RuntimeError("injected engine fault")
Driver, sample, sync, push = rollouts.RolloutDriver, rollouts.RolloutDriver.sample, rollouts.RolloutDriver.sync, rollouts.sync_weights
def failing_sample(self, requests):
    return fail() if requests.step == step else sample(self, requests)
def failing_sync(self, version):
    rollouts.sync_weights = fail if version == step else push
    return sync(self, version)
if where == "sample":
    Driver.sample = failing_sample
else:
    Driver.sync = failing_sync
from phf_megatron.train import main
sys.exit(main(sys.argv[3:]))
"""


def train_failing_engine(hf_dir: str, data: str, run_dir: str, where: str, step: int, *overrides: str,
                         timeout: int = 600) -> subprocess.CompletedProcess:
    """``train`` in one process whose engine fails at ``step``: sampling its rollouts (``where`` = "sample") or
    pushing the weights of that many steps (``where`` = "sync"); ``"sample+SIGTERM"``: the signal comes with it."""
    argv, _env = train_command(hf_dir, data, run_dir, *overrides)
    return run_python(["-c", _FAILING_ENGINE, where, str(step), *argv[3:]], timeout=timeout)


def assert_ok(proc: subprocess.CompletedProcess) -> None:
    """Fail with the run's exit code and the tails of its output unless it exited 0."""
    assert proc.returncode == 0, f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-6000:]}"


def read_metrics(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def assert_same_steps(straight_dir: str, run_dir: str, keys: tuple[str, ...], steps: int) -> None:
    """The run's metrics.jsonl logged steps 1..steps, each with ``keys`` bit-equal to the straight run's."""
    s, r = read_metrics(straight_dir), read_metrics(run_dir)
    assert [m["step"] for m in r] == [m["step"] for m in s] == list(range(1, steps + 1))
    for a, b in zip(s, r, strict=True):
        for key in keys:
            assert b[key] == a[key], (a["step"], key)
