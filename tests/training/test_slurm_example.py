"""The multi-node Slurm example (examples/slurm/train_phf_multinode.sbatch): valid shell, and under a
fake two-node job (Slurm's variables, ``srun`` running one task per node, ``scontrol``) each node's
launcher builds the torchrun command of a two-node run: its node rank, the first node as master."""

from __future__ import annotations

import os
import shlex
import subprocess

import pytest

from ..helpers import REPO

SBATCH = os.path.join(REPO, "examples", "slurm", "train_phf_multinode.sbatch")

#: ``srun [--opt=value ...] CMD ...``: CMD once per node of the job, as Slurm's one task per node; it says how
#: many cores each task gets: Slurm >= 22.05's srun does not inherit sbatch's --cpus-per-task (default 1).
FAKE_SRUN = """#!/usr/bin/env bash
cpus=${SRUN_CPUS_PER_TASK:-1}
while [ "${1#--}" != "$1" ]; do case $1 in --cpus-per-task=*) cpus=${1#*=};; esac; shift; done
for ((i = 0; i < SLURM_JOB_NUM_NODES; i++)); do
  echo "srun task $i: $cpus cores"
  SLURM_NODEID=$i SLURM_PROCID=$i SLURM_STEP_NUM_TASKS=$SLURM_JOB_NUM_NODES "$@" || exit $?
done
"""
FAKE_SCONTROL = """#!/usr/bin/env bash
[ "$1 $2 $3" = "show hostnames gpu[017-018]" ] || { echo "unexpected: scontrol $*" >&2; exit 1; }
# the second name comes late, as from a slow controller: a reader that stops after the first
# line (head -n 1) then kills this with SIGPIPE, which `set -o pipefail` turns into a failed job
echo gpu017; sleep 0.3; echo gpu018
"""


@pytest.mark.parametrize("script", [SBATCH, os.path.join(REPO, "examples", "launch_phf.sh")])
def test_the_scripts_are_valid_bash(script):
    proc = subprocess.run(["bash", "-n", script], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def _fake_job(tmp_path) -> dict[str, str]:
    """A fake two-node job's environment: ``srun`` and ``scontrol`` faked on PATH, a HF directory, DRY_RUN."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    hf = tmp_path / "Qwen3-8B"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "HOME": str(tmp_path), "DRY_RUN": "1",
            "HF_MODEL": str(hf), "DATA": "examples/data/train_math_small.jsonl", "RUN_DIR": str(tmp_path / "run"),
            "SLURM_SUBMIT_DIR": REPO,
            "SLURM_JOB_ID": "14242", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "gpu[017-018]"}


@pytest.mark.parametrize("gpus, want", [
    ({"SLURM_GPUS_ON_NODE": "4"}, "4"),
    # no --gpus-per-node: the node's own GPUs (here its CUDA_VISIBLE_DEVICES), not 8 (the old fallback, refused
    # by the launcher on a node that shows 2)
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, "2"),
])
def test_each_node_runs_torchrun_with_its_rank_and_the_first_node_as_master(tmp_path, gpus, want):
    run = str(tmp_path / "runs" / "phf8b")
    env = {**_fake_job(tmp_path), "RUN_DIR": run, "SLURM_CPUS_PER_TASK": "64", **gpus}
    hf = env["HF_MODEL"]
    proc = subprocess.run(["bash", SBATCH, "--rollout.num_engines=auto"], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    commands = [shlex.split(line[2:]) for line in proc.stdout.splitlines() if line.startswith("+ ")]
    launches = [c for c in commands if c[0] == "torchrun"]
    assert commands[1][:2] == ["python", "tools/convert/hf_to_mcore.py"]   # converted before any node starts
    assert commands.index(launches[0]) > 1
    mcore = os.path.join(run, "mcore_base")
    for rank, argv in enumerate(launches):
        assert argv == ["torchrun", "--nproc-per-node", want, "--nnodes", "2", "--node-rank", str(rank),
                        "--master-addr", "gpu017", "--master-port", str(20000 + 4242),  # job 14242: below the ephemeral ports
                        "-m", "phf_megatron.train", "--config", "configs/phf_qwen3_8b.yaml", f"--run_dir={run}",
                        f"--model.hf_dir={hf}", f"--model.pretrained_checkpoint={mcore}",
                        "--data.path=examples/data/train_math_small.jsonl", "--rollout.num_engines=auto"]
    assert len(launches) == 2
    # each node's task keeps the job's cores (#SBATCH --cpus-per-task=64), not srun's default of one
    assert [line for line in proc.stdout.splitlines() if line.startswith("srun task")] == [
        "srun task 0: 64 cores", "srun task 1: 64 cores"]


@pytest.mark.parametrize("argv, line", [
    (["--checkpoint.exit_signal=SIGUSR1"], "error: --checkpoint.exit_signal=SIGUSR1: Slurm sends this job SIGTERM "
     "(--signal=TERM@300 before its time limit; a preemption's is always SIGTERM), which would stop the run unsaved: "
     "keep SIGTERM"),
    (["--checkpoint.exit_signal=SIGTERM"], None),
    (["--checkpoint.exit_signal_handler=false"], "warning: --checkpoint.exit_signal_handler=false: at the time limit or "
     "a preemption the run is killed without saving; it resumes from its last checkpoint (checkpoint.save_interval)"),
])
def test_a_run_that_saves_on_another_signal_than_slurms_is_refused(tmp_path, argv, line):
    """The job asks Slurm for SIGTERM before its time limit and a preemption sends SIGTERM; a run set to save on
    SIGUSR1 was started and then killed unsaved at either. Now one line before the conversion and the nodes' start."""
    env = {**_fake_job(tmp_path), "SLURM_GPUS_ON_NODE": "4"}
    proc = subprocess.run(["bash", SBATCH, *argv], cwd=str(tmp_path), env=env, capture_output=True, text=True,
                          timeout=60)
    if line is None or line.startswith("warning:"):   # a run that does not save on a signal: said, and started
        assert proc.returncode == 0 and proc.stderr.splitlines() == ([line] if line else []), proc.stderr
        assert "+ torchrun" in proc.stdout
    else:
        assert (proc.returncode, proc.stderr.splitlines(), proc.stdout) == (2, [line], ""), proc.stderr[-3000:]


def test_the_settings_notes_are_said_once_in_a_job(tmp_path):
    """A note of the settings (a run's config.yaml given with another RUN_DIR: a new run there) was said twice in the
    job's log: by the PREPARE_ONLY step's settings check, then by node 0's (d989b45 said it once per launcher)."""
    from phf_megatron.training.config_io import config_from_argv, save_run_config

    recorded = save_run_config(config_from_argv(["--config", os.path.join(REPO, "configs", "phf_qwen3_8b.yaml"),
                                                 f"--run_dir={tmp_path / 'a'}",
                                                 f"--checkpoint.save={tmp_path / 'scratch'}"]))
    env = {**_fake_job(tmp_path), "CONFIG": recorded, "SLURM_GPUS_ON_NODE": "2"}
    proc = subprocess.run(["bash", SBATCH], cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.count("+ torchrun") == 2, proc.stderr[-3000:]
    notes = [line for line in proc.stderr.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and notes[0].startswith(f"note: {recorded} records the run in {tmp_path / 'a'}"), notes


def test_outside_a_slurm_job_it_says_so(tmp_path):
    env = {"PATH": os.environ["PATH"], "SLURM_SUBMIT_DIR": REPO, "HF_MODEL": str(tmp_path)}
    proc = subprocess.run(["bash", SBATCH], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "not inside a Slurm job" in proc.stderr


@pytest.mark.parametrize("knows_the_timeout", [True, False])
def test_a_torchrun_that_ignores_the_shutdown_timeout_is_named_before_the_launch(tmp_path, knows_the_timeout):
    """TORCH_ELASTIC_SHUTDOWN_TIMEOUT (the sbatch's 240 s to finish a step and save after SIGTERM) only
    works with a torchrun that has --shutdown-timeout; an older one kills the workers after 30 s, silently.
    The option comes early in a long help (torchrun's usage line), as a pipe into ``grep -q`` would see it
    before the help is all written: no warning then either (under pipefail the cut help was one)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    option = "  --shutdown-timeout SHUTDOWN_TIMEOUT" if knows_the_timeout else "  --max-restarts MAX_RESTARTS"
    (bin_dir / "torchrun").write_text(f"""#!/usr/bin/env bash
if [ "$1" = --help ]; then printf 'usage: torchrun\\n{option}\\n'; for i in {{1..4000}}; do
  echo "  --option-$i VALUE   help text of option $i, long enough to fill a pipe"; done; exit 0; fi
echo "launched: $*"
""")
    (bin_dir / "torchrun").chmod(0o755)
    hf, mcore = tmp_path / "Qwen3-8B", tmp_path / "mcore_base"
    hf.mkdir()
    mcore.mkdir()   # converted already: the launcher goes straight to torchrun
    (hf / "config.json").write_text("{}")
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "HOME": str(tmp_path), "HF_MODEL": str(hf),
           "MCORE_DIR": str(mcore), "CONFIG": "configs/phf_qwen3_8b.yaml", "RUN_DIR": str(tmp_path / "run"),
           "NGPU": "2", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "240"}   # the 8B preset: TP 2
    proc = subprocess.run(["bash", os.path.join(REPO, "examples", "launch_phf.sh")], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("launched: --nproc-per-node 2 --standalone -m "), proc
    if knows_the_timeout:
        assert proc.stderr == ""
    else:
        assert proc.stderr.startswith("warning: this torchrun has no --shutdown-timeout: it ignores "
                                      "TORCH_ELASTIC_SHUTDOWN_TIMEOUT=240") and proc.stderr.count("\n") == 1


def test_a_preemption_sigterm_to_the_batch_shell_waits_for_the_nodes(tmp_path):
    """A preemption may signal every process of the job, the batch shell too (``scancel --full`` does;
    ``--signal=TERM@300`` at the time limit signals the steps only). A shell killed by it ended the batch step, so Slurm ended the job and killed the nodes'
    tasks after KillWait (30 s by default), in their step and save; the shell now waits for ``srun`` (which passes
    the signal on to its tasks) and exits with its code. The fake ``srun`` here is the tasks' step: it outlives the
    signal by a save's time, then exits 143 as the trainer does. The shell's line comes at the signal, while the
    tasks save (it came after srun ended: bash runs a trap once the foreground command ends)."""
    import signal
    import time

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    started = tmp_path / "srun_started"
    (bin_dir / "srun").write_text(f"""#!/usr/bin/env bash
trap 'echo "srun: SIGTERM passed on to the tasks"' TERM
touch {shlex.quote(str(started))}
for i in $(seq 40); do sleep 0.1; done   # the nodes' step and save
grep -q "waiting for the tasks" {shlex.quote(str(tmp_path / "err"))} && echo "srun: the line came while the tasks ran"
echo "srun: the tasks saved and exited 143"; exit 143
""")
    (bin_dir / "srun").chmod(0o755)
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)
    hf = tmp_path / "Qwen3-8B"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "HOME": str(tmp_path), "DRY_RUN": "1",
           "HF_MODEL": str(hf), "RUN_DIR": str(tmp_path / "run"), "SLURM_SUBMIT_DIR": REPO, "SLURM_JOB_ID": "7",
           "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "gpu[017-018]", "SLURM_GPUS_ON_NODE": "4"}
    err_file = open(tmp_path / "err", "w")
    proc = subprocess.Popen(["bash", SBATCH], cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                            stderr=err_file, text=True)
    deadline = time.monotonic() + 60
    while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert started.exists(), proc.communicate()
    proc.send_signal(signal.SIGTERM)   # to the batch shell, as a preemption sends it (and to srun: its trap)
    out, _ = proc.communicate(timeout=60)
    err_file.close()
    err = (tmp_path / "err").read_text()
    assert proc.returncode == 143, (proc.returncode, out[-2000:], err[-2000:])   # was -15: the shell died at once
    assert "srun: the line came while the tasks ran\nsrun: the tasks saved and exited 143" in out, out[-2000:]
    assert err.splitlines()[-1:] == ["train_phf_multinode: SIGTERM: waiting for the tasks on the nodes to save and stop"]


def test_a_sigterm_after_srun_was_collected_keeps_srun_s_code(tmp_path):
    """A SIGTERM that comes after ``wait`` returned srun's code, before the loop's test, made the shell wait
    again on the collected srun: in POSIX mode that says 127, "not a child of this shell", and the
    job exited 127, not srun's code. Here ``wait`` (a function the shell imports) signals the shell once, just
    after the builtin returned srun's 3."""
    env = _fake_job(tmp_path)
    (tmp_path / "bin" / "srun").write_text("#!/usr/bin/env bash\nexit 3\n")
    marker = shlex.quote(str(tmp_path / "signalled"))
    env.update({"POSIXLY_CORRECT": "1", "BASH_FUNC_wait%%": f"""() {{ builtin wait "$@"; local rc=$?
if [ "${{1:-}}" = "${{srun_pid:-}}" ] && [ ! -e {marker} ]; then touch {marker}; kill -TERM $$; fi; return $rc; }}"""})
    proc = subprocess.run(["bash", SBATCH], cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120)
    assert (tmp_path / "signalled").exists(), proc.stderr[-2000:]
    assert proc.returncode == 3, (proc.returncode, proc.stderr[-2000:])
    assert "not a child of this shell" not in proc.stderr
