"""The watcher of ``children.Reaper``, run as a script by its path (``python reaper.py PARENT PID:START ...``).

A fresh interpreter (nothing of the trainer's threads is copied) that imports only the standard
library, so it starts in milliseconds and whatever ``sys.path`` the parent had. The kernel sends it
SIGTERM when the process that started it dies (``PR_SET_PDEATHSIG``); it then SIGKILLs each target
that still names the process it named at the start (pid + start time), with its descendants, and removes the
directories it was given (what only those processes used: a spawned vLLM engine's socket directory).
argv: the watched parent's pid, then ``pid:starttime`` of each process to stop and ``rmtree:PATH`` of each
directory to remove.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import sys

_PR_SET_PDEATHSIG = 1
#: an argument naming a directory to remove once the targets are killed
RMTREE = "rmtree:"


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22): a pid plus
    its start time names one process, even after the pid is reused. None: no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (``/proc/*/stat`` field 4)."""
    out = []
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{d}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d))
        except (OSError, ValueError, IndexError):
            pass
    return out


def kill_targets(targets: list[tuple[int, int]]) -> None:
    """SIGKILL each ``(pid, start time)`` that still names its process, and its descendants (children first)."""
    for pid, started in targets:
        if start_time(pid) != started:   # gone already, or the pid now names another process
            continue
        doomed, i = [pid], 0
        while i < len(doomed):
            doomed += child_pids(doomed[i])
            i += 1
        for p in reversed(doomed):
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass


def main(argv: list[str]) -> None:
    parent = int(argv[0])
    targets = [tuple(map(int, t.split(":"))) for t in argv[1:] if not t.startswith(RMTREE)]
    dirs = [t[len(RMTREE):] for t in argv[1:] if t.startswith(RMTREE)]

    def reap(*_):
        kill_targets(targets)
        for path in dirs:
            shutil.rmtree(path, ignore_errors=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, reap)
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent:   # the parent died before the prctl
        reap()
    while True:
        signal.pause()


if __name__ == "__main__":
    main(sys.argv[1:])
