"""A converter SIGKILLed during its save leaves no process behind and nothing under the final
name; the rerun clears the ``.tmp`` debris and writes the complete output.

Each converter runs in a session of its own (``start_new_session``): every process it starts
inherits the session id, even once re-parented to init, so "no descendant alive" is "no process
left in the session". hf_to_mcore is killed once Megatron's dist-checkpoint writer (forked children) has
begun its files (before the fix a ``multiprocessing.Manager`` server and the resource tracker
outlived it); mcore_to_hf starts no helper and is killed once its ``.tmp`` directory exists.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from ..helpers import REPO, python_env
from ..helpers.processes import alive, assert_no_survivor, session_members
from ..helpers.tiny_qwen3 import save_tiny_hf, tiny_hf_model


def _writing(tmp_dir: str) -> bool:
    """Megatron's dist-checkpoint writer (a forked child) has started a ``.distcp`` file in ``tmp_dir``."""
    try:
        return any(name.endswith(".distcp") for name in os.listdir(tmp_dir))
    except OSError:
        return False


def _start(tool: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, os.path.join(REPO, "tools", "convert", tool), *args], cwd=REPO,
                            env=python_env(CUDA_VISIBLE_DEVICES=""), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _kill_when(proc: subprocess.Popen, ready, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the converter ended before the moment to kill it (exit {proc.poll()}): "
                        f"{proc.stderr.read()[-2000:]}")
        time.sleep(0.001)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def _rerun(tool: str, *args: str) -> None:
    proc = subprocess.run([sys.executable, os.path.join(REPO, "tools", "convert", tool), *args], cwd=REPO,
                          env=python_env(CUDA_VISIBLE_DEVICES=""), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return save_tiny_hf(tiny_hf_model("gqa"), str(tmp_path_factory.mktemp("hf")))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_killed_converters_leave_no_process_and_no_partial_output(tmp_path, hf_dir):
    mcore = str(tmp_path / "mcore")
    proc = _start("hf_to_mcore.py", "--hf_dir", hf_dir, "--out_dir", mcore)
    _kill_when(proc, lambda: _writing(mcore + ".tmp"))
    assert_no_survivor(proc.pid, "the killed converter")
    assert not os.path.exists(mcore)
    _rerun("hf_to_mcore.py", "--hf_dir", hf_dir, "--out_dir", mcore)
    assert not os.path.exists(mcore + ".tmp") and os.path.isfile(os.path.join(mcore, "phf_megatron.json"))

    out = str(tmp_path / "hf_out")
    proc = _start("mcore_to_hf.py", "--mcore_dir", mcore, "--out_dir", out)
    _kill_when(proc, lambda: os.path.isdir(out + ".tmp"))
    assert_no_survivor(proc.pid, "the killed converter")
    assert not os.path.exists(out)
    _rerun("mcore_to_hf.py", "--mcore_dir", mcore, "--out_dir", out)
    assert not os.path.exists(out + ".tmp") and os.path.isfile(os.path.join(out, "model.safetensors.index.json"))


def _start_parent(code: str, mode: str) -> tuple[subprocess.Popen, int]:
    """``python -c code mode`` in a session of its own; returns it and the pid its first line prints."""
    proc = subprocess.Popen([sys.executable, "-c", code, mode], cwd=REPO, env=python_env(),
                            start_new_session=True, stdout=subprocess.PIPE, text=True)
    return proc, int(proc.stdout.readline())


def _kill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


_FORKING_PARENT = """
import os, sys, time
from phf_megatron.runtime.children import bind_children
if sys.argv[1] == "bind":
    bind_children()
child = os.fork()
if child == 0:
    time.sleep(60)
    os._exit(0)
print(child, flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("mode", ["bind", "control"])
def test_forked_child_dies_with_its_killed_parent(mode):
    """After ``bind_children`` a forked child goes when its parent is SIGKILLed; without it
    (the control) the child lives on, re-parented."""
    proc, child = _start_parent(_FORKING_PARENT, mode)
    _kill(proc)
    if mode == "bind":
        assert_no_survivor(proc.pid, "the killed parent")
    else:
        time.sleep(0.5)
        assert session_members(proc.pid) == [child]
        os.kill(child, signal.SIGKILL)


# ----------------------------------------------------------------- spawned children (vLLM's engine), torchrun workers

_SPAWNING_PARENT = """
import subprocess, sys, time
from phf_megatron.runtime.children import Reaper, run_reaped
grandchild = "import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)"
if sys.argv[1] == "run_reaped":                                # paper_table's rows, the eval's conversion
    print(-1, flush=True)
    run_reaped([sys.executable, "-c", grandchild])
child = subprocess.Popen([sys.executable, "-c", grandchild])   # not forked by Python: bind_children cannot reach it
if sys.argv[1] == "reaper":
    Reaper([child.pid])
print(child.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("mode", ["reaper", "run_reaped", "control"])
def test_a_spawned_child_and_its_children_go_when_the_parent_is_killed(mode):
    """Seen with vLLM: a SIGKILLed trainer left its spawned engine core and worker running (holding
    the GPU). With a ``Reaper`` the child and its own child go; without (the control) both live on."""
    proc, child = _start_parent(_SPAWNING_PARENT, mode)
    deadline = time.monotonic() + 30
    while len(session_members(proc.pid)) < 3 + (mode != "control") and time.monotonic() < deadline:
        time.sleep(0.05)                        # parent, child, the child's sleep (+ the reaper)
    _kill(proc)
    if mode != "control":
        assert_no_survivor(proc.pid, "the killed parent")
    else:
        time.sleep(1.0)
        left = session_members(proc.pid)
        assert child in left and len(left) == 2
        for pid in left:
            os.kill(pid, signal.SIGKILL)


_SPAWNING_PARENT_WITH_A_DIR = """
import subprocess, sys, tempfile, time
from phf_megatron.runtime.children import Reaper
sockets = tempfile.mkdtemp(prefix="phf_test_reaped_")   # a spawned engine's socket directory
open(sockets + "/socket", "w").close()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
if sys.argv[1] == "reaper":
    Reaper([child.pid], dirs=[sockets])
print(child.pid, sockets, flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("mode", ["reaper", "control"])
def test_a_killed_parent_s_reaper_removes_the_directories_only_its_children_used(mode):
    """A SIGKILLed trainer left its spawned vLLM engine's socket directory (``/tmp/phf_vllm_ipc_*``, seven sockets)
    behind: ``close()`` removes it, and nothing ran to. The watcher removes it once it has killed the engine."""
    proc = subprocess.Popen([sys.executable, "-c", _SPAWNING_PARENT_WITH_A_DIR, mode], cwd=REPO, env=python_env(),
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    child, sockets = proc.stdout.readline().split()
    deadline = time.monotonic() + 30
    while len(session_members(proc.pid)) < 2 + (mode == "reaper") and time.monotonic() < deadline:
        time.sleep(0.05)                        # parent, child (+ the reaper)
    _kill(proc)
    if mode == "reaper":
        assert_no_survivor(proc.pid, "the killed parent")
        deadline = time.monotonic() + 10
        while os.path.exists(sockets) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(sockets)
    else:
        time.sleep(1.0)
        assert os.path.isfile(os.path.join(sockets, "socket"))
        os.kill(int(child), signal.SIGKILL)
        shutil.rmtree(sockets)


_LAUNCHER = """
import os, subprocess, sys
env = dict(os.environ)
if sys.argv[1] == "torchrun":
    env["TORCHELASTIC_RUN_ID"] = "test"
worker = "import time; from phf_megatron.runtime.children import bind_children; bind_children(); print('bound', flush=True); time.sleep(60)"
child = subprocess.Popen([sys.executable, "-c", worker], env=env, start_new_session=True, stdout=subprocess.PIPE, text=True)
child.stdout.readline()
print(child.pid, flush=True)
child.wait()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("mode", ["torchrun", "control"])
def test_a_torchrun_worker_goes_when_its_launcher_is_killed(mode):
    """torchrun starts workers in sessions of their own: a SIGKILLed torchrun left its trainer
    training. A worker (``TORCHELASTIC_RUN_ID`` set) now ends with its launcher; another process
    started the same way (the control) lives on."""
    proc, worker = _start_parent(_LAUNCHER, mode)
    _kill(proc)
    deadline = time.monotonic() + 10
    while alive(worker) and time.monotonic() < deadline and mode == "torchrun":
        time.sleep(0.05)
    survived = alive(worker)
    if survived:
        os.kill(worker, signal.SIGKILL)
    assert survived == (mode == "control")
