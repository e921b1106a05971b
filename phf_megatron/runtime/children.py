"""No helper process outlives the command that started it, even when the command is SIGKILLed.

A SIGKILL runs no Python: ``atexit``, ``finally`` and multiprocessing's own clean-up never happen,
so a child must be told by the kernel. ``bind_children()`` (called once Megatron is set up, by the
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
    """From now on, children forked by this process die with it (see the module docstring). Idempotent."""
    global _bound
    _in_process_checkpoint_results()
    if _bound or not sys.platform.startswith("linux"):
        return
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
    _bound = True
