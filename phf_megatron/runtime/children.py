"""No helper process outlives the command that started it, even when the command is SIGKILLed.

A SIGKILL runs no Python: ``atexit``, ``finally`` and multiprocessing's own clean-up never happen,
so a child must be told by the kernel. (Spawned children, such as vLLM's engine, get a ``Reaper``;
a torchrun worker ends with its launcher: ``die_with_launcher``; both at the end of this file.) ``bind_children()`` (called once Megatron is set up, by the
converters and the trainer alike: ``megatron_session.init_model_parallel``) arranges two things:

* every child this process **forks** from now on (Megatron's dist-checkpoint writer forks one
  process per file it writes) gets ``PR_SET_PDEATHSIG = SIGKILL``: the kernel kills it when its
  parent dies. Set in the child right after the fork (``os.register_at_fork``), so it holds under
  ``torchrun`` and plain ``python`` alike, and re-checked against the parent's pid (a parent that
  died between the fork and the ``prctl`` is noticed: the child exits at once);
* Megatron's dist-checkpoint writer collects its results in a ``multiprocessing.Manager`` queue,
  which is a **spawned** server process living as long as the command (nothing in it could set
  the signal before it runs, and nothing stops it when its parent is killed). Our saves are
  synchronous (the writer runs in this process), so an in-process ``queue.Queue`` serves the
  same purpose and no server is started.

multiprocessing's resource tracker needs nothing: it exits once every process holding its pipe
(this one and the forked writers) is gone. Linux only (elsewhere ``bind_children`` does nothing).
Caveat of ``PR_SET_PDEATHSIG``: the "parent" is the forking *thread*; our forks happen on the main
thread, so the signal comes when the process ends.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import sys
import time

from . import reaper
from .reaper import kill_targets, start_time

_PR_SET_PDEATHSIG = 1
_forking_pid: int | None = None
_bound = False


def die_with_parent(parent_pid: int | None = None, sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent exits; True if set.

    ``parent_pid``: the parent this process was forked from; if it is already gone (the process
    was re-parented), exit now."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)
    return True


def _before_fork() -> None:
    global _forking_pid
    _forking_pid = os.getpid()


def _after_fork_in_child() -> None:
    die_with_parent(_forking_pid)


def _in_process_checkpoint_results() -> None:
    """Give Megatron's dist-checkpoint writer an in-process results queue (no Manager process)."""
    try:
        from megatron.core.dist_checkpointing.strategies import filesystem_async
    except ImportError:
        return
    if getattr(filesystem_async, "_results_queue", None) is None:
        filesystem_async._results_queue = queue.Queue()


def bind_children() -> None:
    """From now on, children forked by this process die with it (see the module docstring), and a
    torchrun worker dies with its launcher (``die_with_launcher``). Idempotent."""
    global _bound
    _in_process_checkpoint_results()
    if _bound or not sys.platform.startswith("linux"):
        return
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
    die_with_launcher()
    _bound = True


# ----------------------------------------------------------------- spawned children and a launcher's death

class Reaper:
    """Stops spawned processes (and their children) if this process dies first, even by SIGKILL.

    A process started by ``multiprocessing``'s spawn (vLLM's engine core and its workers) is not
    forked by Python, so ``bind_children`` cannot reach it, and nothing stops it when its parent is
    killed: it goes on holding the GPU. ``Reaper(pids)`` starts a small watcher process (``reaper.py``) that the
    kernel signals when this process ends (``PR_SET_PDEATHSIG``); it then SIGKILLs each pid (with
    its descendants) that still names the process it named at the start, then removes ``dirs`` (what only those
    processes used: a spawned vLLM engine's socket directory). ``close()`` stops the watcher (call it once the
    processes have been shut down; ``dirs`` are then the caller's to remove). Start it from the main thread: the
    death signal follows the thread that started the watcher. Linux only (elsewhere it does nothing).
    """

    def __init__(self, pids: list[int], dirs: list[str] = ()):
        import subprocess

        self._proc = None
        import threading

        self._targets = [(pid, t) for pid in pids if (t := start_time(pid)) is not None]
        targets = [f"{pid}:{t}" for pid, t in self._targets]
        if not targets or not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
            return
        self._proc = subprocess.Popen([sys.executable, reaper.__file__, str(os.getpid()), *targets,
                                       *(reaper.RMTREE + d for d in dirs)],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, close_fds=True)

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def kill_now(self) -> None:
        """SIGKILL the processes (with their descendants) now, as the watcher would, then stop it."""
        kill_targets(self._targets)   # also where no watcher was started (a Reaper built off the main thread)
        self.close()


def exit_code(proc, timeout: float = 10.0) -> int | None:
    """The exit code of a ``multiprocessing`` process, or None while it runs (its sentinel open). Once
    its sentinel has closed, waits up to ``timeout`` seconds for the code (None if it never comes).

    Another thread may poll the same process: vLLM's engine manager watches its engine core and
    joins it. Whichever ``waitpid`` reaps the child stores the code a moment later, and every other
    poll in between reads None (its ``waitpid`` fails with ``ECHILD``). So this waits for the code,
    not for one poll; every poll is non-blocking (``proc.exitcode``: ``waitpid(WNOHANG)``), so
    ``timeout`` holds even for a child still alive."""
    import multiprocessing.connection

    if proc.exitcode is None and not multiprocessing.connection.wait([proc.sentinel], timeout=0):
        return None
    deadline = time.monotonic() + timeout
    while proc.exitcode is None and time.monotonic() < deadline:
        time.sleep(0.02)   # the child becomes reapable a moment after its sentinel closes; a reaping thread
    return proc.exitcode   # needs the GIL to store what it read


def die_with_launcher() -> bool:
    """Under ``torchrun``: end this worker when the launcher dies, even by SIGKILL (True if bound).

    torchrun starts each worker in a session of its own, so a killed torchrun leaves its workers
    training (and holding their GPUs) with nobody to stop them. ``TORCHELASTIC_RUN_ID`` marks a
    torchrun worker; its parent is the launcher's agent. The worker gets SIGKILL and ends at once, also
    when stuck in a collective (the trainer acts on SIGTERM only at a step's end:
    ``training.stop_signal``); the ``Reaper`` of its spawned engine then stops the engine."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return False
    return die_with_parent(os.getppid(), signal.SIGKILL)


def run_reaped(argv: list[str], **popen_kwargs):
    """``subprocess.run(argv)`` whose child, and the child's children, end with this process, even when
    it is SIGKILLed (a ``Reaper`` while it runs). ``popen_kwargs`` are ``subprocess.Popen``'s."""
    import subprocess

    with subprocess.Popen(argv, **popen_kwargs) as proc:
        watcher = Reaper([proc.pid])
        try:
            stdout, stderr = proc.communicate()
        except BaseException:
            proc.kill()
            raise
        finally:
            watcher.close()
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
