"""examples/launch_phf.sh on several nodes: node 0 converts the HF checkpoint (minutes at 8B) and says the settings'
notes, the others wait for its conversion (MCORE_WAIT) and stop at once at the marker its failed conversion leaves
(MCORE_DIR.failed; one an earlier launch left counts once it changes or after MCORE_STALE seconds), or once node 0's
heartbeat (MCORE_DIR.converting) has not changed in MCORE_SILENT seconds: node 0 killed outright."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from ..helpers import REPO
from .test_launcher_ranks import LAUNCHER, _node


@pytest.mark.parametrize("converted", [False, True])
def test_only_node_0_converts_the_others_wait_for_it(tmp_path, converted):
    """A multi-node launch by hand (no Slurm, no PREPARE_ONLY step) converted the HF model on every node, into the
    same MCORE_DIR on a shared file system. Now a node of NODE_RANK > 0 waits for node 0's conversion (the converter
    renames its finished output to MCORE_DIR), up to MCORE_WAIT seconds, then starts torchrun; at the deadline one
    line says what to check."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text('#!/usr/bin/env bash\necho "launched: $*"\n')
    (bin_dir / "torchrun").chmod(0o755)
    mcore = tmp_path / "mcore_base"
    wait = "60" if converted else "1"
    env, _ = _node(tmp_path, 8, {"NGPU": "2", "NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "gpu017",
                                 "MCORE_DIR": str(mcore), "MCORE_WAIT": wait})
    proc = subprocess.Popen(["bash", LAUNCHER], cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    said = [f"launch_phf: node 1: waiting up to {wait} s (MCORE_WAIT) for node 0's conversion into {mcore}"]
    assert proc.stderr.readline().rstrip("\n") == said[0]   # after the settings' check: node 1 is waiting
    if converted:   # node 0's converter renames its finished output into place
        mcore.mkdir()
    else:
        said.append(f"error: MCORE_DIR: {mcore} did not appear in 1 s: node 0 (NODE_RANK=0) converts it; it must be "
                    "on a file system every node sees (or convert first: PREPARE_ONLY=1)")
    out, err = proc.communicate(timeout=120)
    assert said[1:] == err.splitlines(), err[-3000:]
    if converted:
        assert proc.returncode == 0 and out.startswith("launched: --nproc-per-node 2 --nnodes 2 --node-rank 1 "), out
    else:
        assert (proc.returncode, out) == (1, "")
        assert not os.path.exists(mcore) and not os.path.exists(f"{mcore}.tmp")


def _fake_converter(tmp_path) -> None:
    """``torchrun`` and the converter (``python tools/convert/hf_to_mcore.py``) faked on the nodes' PATH: the
    conversion makes its ``--out_dir`` (after ``CONVERT_SLEEP`` seconds), or fails with two stderr lines where
    ``CONVERT_FAILS`` is set."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "torchrun").write_text('#!/usr/bin/env bash\necho "launched: $*"\n')
    (bin_dir / "python").write_text(f"""#!/usr/bin/env bash
if [ "$1" = tools/convert/hf_to_mcore.py ]; then
  echo "hf->mcore: reading the model"
  [ -n "${{CONVERT_FAILS:-}}" ] && {{ echo "hf->mcore: loading shard 1 of 4" >&2; echo "error: shard-2: truncated" >&2; exit 2; }}
  sleep "${{CONVERT_SLEEP:-0}}"; mkdir "$5"; exit 0
fi
exec {shlex.quote(sys.executable)} "$@"
""")
    for name in ("torchrun", "python"):
        (bin_dir / name).chmod(0o755)


@pytest.mark.parametrize("slash", ["", "/"])
def test_the_waiting_nodes_stop_at_once_when_node_0s_conversion_fails(tmp_path, slash):
    """A node of NODE_RANK > 0 waited the whole MCORE_WAIT (an hour by default) for a conversion node 0 had given up:
    node 0's failed conversion now leaves MCORE_DIR.failed (its exit code and last line), at which the others stop
    with one line; node 0's next conversion removes it. The converter is faked (``python`` on PATH). MCORE_DIR given
    with a trailing / put the marker into MCORE_DIR (a bash error on node 0: the failed conversion made none), and
    the others waited the hour again."""
    import time

    _fake_converter(tmp_path)
    mcore = tmp_path / "mcore_base"
    nodes = {"NGPU": "2", "NNODES": "2", "MASTER_ADDR": "gpu017", "MCORE_DIR": f"{mcore}{slash}", "MCORE_WAIT": "600"}
    waiting_env, _ = _node(tmp_path, 8, {**nodes, "NODE_RANK": "1"})
    waiting = subprocess.Popen(["bash", LAUNCHER], cwd=str(tmp_path), env=waiting_env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    assert waiting.stderr.readline().startswith("launch_phf: node 1: waiting up to 600 s")
    started = time.monotonic()
    env, _ = _node(tmp_path, 8, {**nodes, "NODE_RANK": "0", "CONVERT_FAILS": "1"})
    node0 = subprocess.run(["bash", LAUNCHER], cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120)
    assert (node0.returncode, node0.stderr.splitlines()) == (2, ["hf->mcore: loading shard 1 of 4",
                                                                 "error: shard-2: truncated"]), node0.stderr[-3000:]
    try:
        out, err = waiting.communicate(timeout=30)   # it looks each second
    finally:
        waiting.kill()
    assert (waiting.returncode, out, err.splitlines()) == (1, "", [
        f"error: MCORE_DIR: node 0's conversion into {mcore} failed (exit code 2: error: shard-2: truncated); "
        "node 0's log says more"])
    assert time.monotonic() - started < 30   # not MCORE_WAIT's 600 s
    assert not mcore.exists() and (tmp_path / "mcore_base.failed").exists()
    env.pop("CONVERT_FAILS")   # node 0 again, the shard mended: its conversion removes the marker
    node0 = subprocess.run(["bash", LAUNCHER], cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120)
    assert node0.returncode == 0 and mcore.is_dir() and not (tmp_path / "mcore_base.failed").exists(), node0.stderr


def test_a_failure_marker_an_earlier_launch_left_waits_for_node_0s_new_conversion(tmp_path):
    """MCORE_DIR.failed left by an earlier launch, found by a relaunched node 1 before node 0's new conversion had
    removed it: node 1 stopped at once with the old failure. Such a marker counts only once it changes or after
    MCORE_STALE seconds: node 1 waits on, and goes on once node 0's conversion is done; with no node 0, it stops."""
    _fake_converter(tmp_path)
    mcore = tmp_path / "mcore_base"
    (tmp_path / "mcore_base.failed").write_text("exit code 2: error: shard-2: truncated\n")
    nodes = {"NGPU": "2", "NNODES": "2", "MASTER_ADDR": "gpu017", "MCORE_DIR": str(mcore), "MCORE_WAIT": "600",
             "MCORE_STALE": "60"}
    waiting_env, _ = _node(tmp_path, 8, {**nodes, "NODE_RANK": "1"})
    waiting = subprocess.Popen(["bash", LAUNCHER], cwd=str(tmp_path), env=waiting_env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert waiting.stderr.readline().startswith("launch_phf: node 1: waiting up to 600 s")
        with pytest.raises(subprocess.TimeoutExpired):
            waiting.wait(timeout=3)   # the old marker: not node 0's word on this launch
        env, _ = _node(tmp_path, 8, {**nodes, "NODE_RANK": "0"})
        node0 = subprocess.run(["bash", LAUNCHER], cwd=str(tmp_path), env=env, capture_output=True, text=True,
                               timeout=120)
        assert node0.returncode == 0 and mcore.is_dir(), node0.stderr[-3000:]
        out, err = waiting.communicate(timeout=30)
    finally:
        waiting.kill()
    assert waiting.returncode == 0 and "launched: " in out, err[-3000:]

    shutil.rmtree(mcore)   # no node 0 this time: the old marker counts after MCORE_STALE
    (tmp_path / "mcore_base.failed").write_text("exit code 2: error: shard-2: truncated\n")
    waiting_env["MCORE_STALE"] = "2"
    node1 = subprocess.run(["bash", LAUNCHER], cwd=str(tmp_path), env=waiting_env, capture_output=True, text=True,
                           timeout=60)
    assert (node1.returncode, node1.stderr.splitlines()[-1]) == (1, (
        f"error: MCORE_DIR: node 0's conversion into {mcore} failed (exit code 2: error: shard-2: truncated); "
        "node 0's log says more"))


def test_the_settings_notes_are_said_once_by_node_0_before_the_conversion(tmp_path):
    """A note of the settings (here: a run's config.yaml given with another RUN_DIR, a new run there) was said twice,
    by the launcher's settings check and again by the run's rank 0, and once more by every other node's check. Node 0's
    check says it (before the conversion: minutes at 8B), the run and the other nodes do not repeat it."""
    from phf_megatron.training.config_io import config_from_argv, save_run_config

    recorded = save_run_config(config_from_argv(["--config", os.path.join(REPO, "configs", "phf_qwen3_8b.yaml"),
                                                 f"--run_dir={tmp_path / 'a'}",
                                                 f"--checkpoint.save={tmp_path / 'scratch'}"]))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # torchrun: its first rank on this node, as far as the run's start (its settings: --print-config)
    (bin_dir / "torchrun").write_text(f"""#!/usr/bin/env bash
[ "$1" = --help ] && exit 0
node=0; while [ "$1" != -m ]; do [ "$1" = --node-rank ] && node=$2; shift; done; shift
RANK=$((node * NGPU)) WORLD_SIZE=$((NGPU * NNODES)) exec {shlex.quote(sys.executable)} -m "$@" --print-config > /dev/null
""")
    (bin_dir / "torchrun").chmod(0o755)
    (tmp_path / "mcore").mkdir()   # converted already: straight to torchrun
    said = []
    for node in ("0", "1"):
        env, _ = _node(tmp_path, 2, {"CONFIG": recorded, "NGPU": "2", "NNODES": "2", "NODE_RANK": node,
                                     "MASTER_ADDR": "127.0.0.1", "MCORE_DIR": str(tmp_path / "mcore"),
                                     "RUN_DIR": str(tmp_path / "b")})
        proc = subprocess.run(["bash", os.path.join(REPO, "examples", "launch_phf.sh")], cwd=str(tmp_path), env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        said.append([line for line in proc.stderr.splitlines() if line.startswith("note: ")])
    assert [len(notes) for notes in said] == [1, 0], said
    assert said[0][0].startswith(f"note: {recorded} records the run in {tmp_path / 'a'}"), said


def test_a_marker_node_0s_new_conversion_removes_as_node_1_looks_is_no_failure(tmp_path):
    """Node 1 found MCORE_DIR.failed there (``[ -f ]``), then read it for its state; node 0's new conversion removing
    it in between made the state '' (not the earlier launch's), so node 1 stopped at once: 'node 0's conversion ...
    failed ()' (and head's 'No such file'), while node 0 converted. The marker is now read once per look: gone is
    none. ``stat`` is faked to remove it on node 1's first look, as node 0's ``rm -f`` would between the two."""
    import time

    _fake_converter(tmp_path)
    mcore, marker, count = tmp_path / "mcore_base", tmp_path / "mcore_base.failed", tmp_path / "stat_calls"
    marker.write_text("exit code 2: error: shard-2: truncated\n")
    (tmp_path / "bin" / "stat").write_text(f"""#!/usr/bin/env bash
echo x >> {shlex.quote(str(count))}
[ "$(wc -l < {shlex.quote(str(count))})" -ne 2 ] || rm -f {shlex.quote(str(marker))}   # node 0's rm, right then
exec {shlex.quote(shutil.which("stat"))} "$@"
""")
    (tmp_path / "bin" / "stat").chmod(0o755)
    env, _ = _node(tmp_path, 8, {"NGPU": "2", "NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "gpu017",
                                 "MCORE_DIR": str(mcore), "MCORE_WAIT": "600", "MCORE_STALE": "60"})
    waiting = subprocess.Popen(["bash", LAUNCHER], cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert waiting.stderr.readline().startswith("launch_phf: node 1: waiting up to 600 s")
        deadline = time.monotonic() + 30
        while marker.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not marker.exists()
        with pytest.raises(subprocess.TimeoutExpired):
            waiting.wait(timeout=2)   # waits on for node 0's conversion
        mcore.mkdir()   # node 0's conversion done
        out, err = waiting.communicate(timeout=30)
    finally:
        waiting.kill()
    assert waiting.returncode == 0 and "launched: " in out and err == "", err[-3000:]


def test_prepare_only_in_an_srun_step_of_several_tasks_converts_in_task_0_alone(tmp_path):
    """``PREPARE_ONLY=1 srun -N2 ... launch_phf.sh`` ran one conversion per task at once, into the same MCORE_DIR
    (and its .tmp). Now only the step's task 0 converts; the others say so in one line and stop, exit 0 (srun's code
    is then task 0's). The converter is faked (``python`` on PATH)."""
    _fake_converter(tmp_path)
    mcore = tmp_path / "mcore_base"
    step = {"PREPARE_ONLY": "1", "NGPU": "2", "MCORE_DIR": str(mcore), "SLURM_STEP_NUM_TASKS": "2"}
    env, _ = _node(tmp_path, 8, {**step, "SLURM_PROCID": "1"})
    task1 = subprocess.run(["bash", LAUNCHER], cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120)
    assert (task1.returncode, task1.stdout, task1.stderr.splitlines()) == (0, "", [
        f"launch_phf: srun task 1: PREPARE_ONLY=1: task 0 of the 2 converts into {mcore}, once"]), task1.stderr[-3000:]
    assert not mcore.exists()
    env, _ = _node(tmp_path, 8, {**step, "SLURM_PROCID": "0"})
    task0 = subprocess.run(["bash", LAUNCHER], cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120)
    assert task0.returncode == 0 and mcore.is_dir(), task0.stderr[-3000:]
    assert task0.stdout == "hf->mcore: reading the model\n"   # converted, then stopped: no torchrun


def _heartbeat_nodes(tmp_path) -> tuple[dict[str, str], dict[str, str]]:
    """The environments of node 0 and node 1 (the converter faked), the heartbeat each second, silent after 3."""
    _fake_converter(tmp_path)
    nodes = {"NGPU": "2", "NNODES": "2", "MASTER_ADDR": "gpu017", "MCORE_DIR": str(tmp_path / "mcore_base"),
             "MCORE_WAIT": "600", "MCORE_HEARTBEAT": "1", "MCORE_SILENT": "3"}
    return _node(tmp_path, 8, {**nodes, "NODE_RANK": "0"})[0], _node(tmp_path, 8, {**nodes, "NODE_RANK": "1"})[0]


def _start(tmp_path, env: dict[str, str]) -> subprocess.Popen:
    """The launcher, in a process group of its own (a node's: killed whole)."""
    return subprocess.Popen(["bash", LAUNCHER], cwd=str(tmp_path), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _beats(path, until, timeout: float = 30) -> list[str]:
    """The heartbeat's texts seen at ``path`` (every 0.1 s) until ``until(them)`` or ``timeout`` s."""
    import time

    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if text and text not in seen:
            seen.append(text)
        if until(seen):
            break
        time.sleep(0.1)
    return seen


@pytest.mark.parametrize("sig, whole", [("SIGKILL", True), ("SIGKILL", False), ("SIGTERM", True)])
def test_the_waiting_nodes_stop_when_node_0_is_killed_mid_conversion(tmp_path, sig, whole):
    """Node 0 killed outright while converting (SIGKILL: the OOM killer, a scheduler, a lost machine) leaves no
    MCORE_DIR.failed: the other nodes waited MCORE_WAIT (an hour) in silence. Node 0 now keeps a heartbeat beside
    MCORE_DIR while it converts; a waiting node stops with one line once it has not changed in MCORE_SILENT seconds.
    Its launcher killed alone (``whole`` False), the converter living on: the heartbeat stops too. SIGTERM runs node
    0's trap: no heartbeat left, MCORE_DIR.failed instead, at which the others stop at once."""
    import signal
    import time

    env0, env1 = _heartbeat_nodes(tmp_path)
    mcore, heartbeat = tmp_path / "mcore_base", tmp_path / "mcore_base.converting"
    waiting = _start(tmp_path, env1)
    node0 = _start(tmp_path, {**env0, "CONVERT_SLEEP": "600"})
    try:
        assert waiting.stderr.readline().startswith("launch_phf: node 1: waiting up to 600 s")
        assert len(_beats(heartbeat, lambda seen: len(seen) >= 2)) >= 2, "no heartbeat while node 0 converts"
        (os.killpg if whole else os.kill)(node0.pid, getattr(signal, sig))
        killed = time.monotonic()
        node0.wait(timeout=30)   # reaped, as its parent (srun, a shell) would
        out, err = waiting.communicate(timeout=30)
    finally:
        waiting.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node0.pid, signal.SIGKILL)   # the rest of node 0's group (its converter)
    assert time.monotonic() - killed < 15   # not MCORE_WAIT's 600 s
    assert (waiting.returncode, out, len(err.splitlines())) == (1, "", 1), err
    if sig == "SIGKILL":   # the heartbeat stays, unchanged: silent from the kill on
        assert heartbeat.exists() and re.fullmatch(
            rf"error: MCORE_DIR: node 0 \(NODE_RANK=0\) stopped converting into {re.escape(str(mcore))}: its heartbeat "
            rf"{re.escape(str(heartbeat))} has not changed in \d+ s \(MCORE_SILENT; killed\? out of memory, the "
            r"scheduler, a lost machine\): see node 0's log, then launch again \(its conversion replaces the partial "
            rf"{re.escape(str(mcore))}\.tmp\)\n", err), err
    else:   # the launcher's trap says so, or the conversion's own end (its code) where that came first
        assert not heartbeat.exists() and re.fullmatch(
            rf"error: MCORE_DIR: node 0's conversion into {re.escape(str(mcore))} failed \((its launcher stopped before it "
            r"ended: SIGTERM\?|exit code 143: .*)\); node 0's log says more\n", err), err


def test_a_slow_conversion_keeps_its_heartbeat_and_the_waiting_nodes_wait_on(tmp_path):
    """A healthy conversion longer than MCORE_SILENT: node 0 rewrites its heartbeat each MCORE_HEARTBEAT seconds, node
    1 waits on and starts torchrun after it; the heartbeat is gone once the conversion is done."""
    env0, env1 = _heartbeat_nodes(tmp_path)
    heartbeat = tmp_path / "mcore_base.converting"
    waiting = _start(tmp_path, env1)
    node0 = _start(tmp_path, {**env0, "CONVERT_SLEEP": "7"})
    try:
        beats = _beats(heartbeat, lambda _: node0.poll() is not None, timeout=60)
        out0, err0 = node0.communicate(timeout=30)
        out1, err1 = waiting.communicate(timeout=30)
    finally:
        for proc in (waiting, node0):
            proc.kill()
    assert node0.returncode == 0 and "launched: " in out0, err0[-3000:]
    assert waiting.returncode == 0 and "launched: " in out1, err1[-3000:]
    assert len(beats) >= 4 and not heartbeat.exists(), beats   # ~7 in 7 s


def test_a_heartbeat_an_earlier_killed_launch_left_is_judged_from_the_wait_s_start(tmp_path):
    """A heartbeat an earlier launch's killed node 0 left (hours old) does not stop a new launch: node 1 gives node 0
    MCORE_SILENT seconds from its own start, node 0's new conversion rewrites it and removes it at the end; with no
    node 0, node 1 stops after MCORE_SILENT seconds, not MCORE_WAIT."""
    import time

    env0, env1 = _heartbeat_nodes(tmp_path)
    mcore, heartbeat = tmp_path / "mcore_base", tmp_path / "mcore_base.converting"
    heartbeat.write_text("1700000000.000000000\n")
    os.utime(heartbeat, (1700000000, 1700000000))
    waiting = _start(tmp_path, env1)
    try:
        assert waiting.stderr.readline().startswith("launch_phf: node 1: waiting up to 600 s")
        time.sleep(1)   # node 0 starts later
        node0 = subprocess.run(["bash", LAUNCHER], cwd=str(tmp_path), env={**env0, "CONVERT_SLEEP": "4"},
                               capture_output=True, text=True, timeout=120)
        assert node0.returncode == 0 and mcore.is_dir() and not heartbeat.exists(), node0.stderr[-3000:]
        out, err = waiting.communicate(timeout=30)
    finally:
        waiting.kill()
    assert waiting.returncode == 0 and "launched: " in out, err[-3000:]

    shutil.rmtree(mcore)   # no node 0 this time: silent MCORE_SILENT s of the wait at least (bash's SECONDS, whole
    for _ in range(3):     # seconds of the clock, ends it up to 1 s early where the wait starts late in a second)
        heartbeat.write_text("1700000000.000000000\n")
        node1 = _start(tmp_path, env1)
        try:
            assert node1.stderr.readline().startswith("launch_phf: node 1: waiting up to 600 s")
            started = time.monotonic()
            out, err = node1.communicate(timeout=60)
        finally:
            node1.kill()
        assert 3 <= time.monotonic() - started < 30, err
        assert node1.returncode == 1 and "its heartbeat" in err.splitlines()[-1], err[-3000:]
