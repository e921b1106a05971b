"""The processes of a session, read from ``/proc`` (Linux): what a killed command left behind.

A command started with ``start_new_session=True`` gives every process it starts its session id,
even once re-parented to init, so "no descendant alive" is "no process left in the session".
"""

from __future__ import annotations

import os
import signal
import time


def _stat_fields(pid: int | str) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()   # after the command name: state, ppid, pgrp, session, ...
    except OSError:                                        # gone meanwhile
        return None


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def session_members(sid: int) -> list[int]:
    """The live (non-zombie) processes of session ``sid``."""
    members = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        fields = _stat_fields(name)
        if fields is not None and int(fields[3]) == sid and fields[0] != "Z":
            members.append(int(name))
    return members


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return ""


def assert_no_survivor(sid: int, what: str, grace: float = 15.0) -> None:
    """Within ``grace`` seconds (a child told by the kernel needs a moment to go) no process of session
    ``sid`` is left; any that is gets SIGKILL, and the assertion names them (``what`` outlived ...)."""
    deadline = time.monotonic() + grace
    while (left := session_members(sid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    cmdlines = {pid: cmdline(pid) for pid in left}
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes outlived {what}: {cmdlines}"
