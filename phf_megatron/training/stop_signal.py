"""Stopping a run on a signal: a scheduler's preemption (Slurm sends SIGTERM) costs no finished step.

Megatron-LM's ``--exit-signal-handler``: the handler only notes the signal; at the end of the step in
flight every rank agrees that one was received (on any rank: torchrun may deliver it to one worker
before the others), the trainer writes a checkpoint and exits with ``128 + signal number``, the code
of a process the signal killed. A repeated signal is noted again (Slurm signals every process of the
job step and torchrun passes its own signal on: a worker often gets two); a second Ctrl-C, though,
acts at once (the handler that was there before). While the run starts (``stopping_at_once``: imports,
model build, resume, the engines' start; minutes at 8B) there is no step to finish and nothing new to
save: the signal stops it at once, one line, the same exit code. In the cleanup after an error (a failed
start's engines' stop, the run's teardown: ``ignoring``) the signal is ignored: it neither cuts the cleanup
nor takes the place of the error that cleanup follows.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

from ..commands import process_rank, report_stop
from ..errors import StoppedAtStart
from ..input_files import kept
from .config_sections import CheckpointConfig


@contextmanager
def stopping_at_once(checkpoint: CheckpointConfig, save_dir: str) -> Iterator[None]:
    """Inside (the run's start): ``checkpoint.exit_signal`` raises ``StoppedAtStart`` at once, its line said
    by rank 0 as it comes (the cleanup after it, the engines' stop, may outlast a scheduler's grace), the
    signal ignored from then on, to the exit (Slurm's and torchrun's both reach a worker, ms apart). Ctrl-C
    (SIGINT) keeps its own line; nothing changes with ``exit_signal_handler`` off."""
    if not checkpoint.exit_signal_handler or checkpoint.exit_signal == "SIGINT":
        yield
        return
    signum = int(getattr(signal, checkpoint.exit_signal))

    def stop(received, frame) -> None:
        signal.signal(signum, signal.SIG_IGN)
        err = StoppedAtStart(f"{checkpoint.exit_signal} received while the run was starting: stopped before its "
                             f"first step; {kept(save_dir)}; rerun the same command to resume", 128 + signum)
        if process_rank() == 0:
            report_stop(err)
        raise err

    previous = signal.signal(signum, stop)
    try:
        yield
    finally:
        # Only this handler is undone: once stopped, the signal stays ignored to the exit (a repeat must not kill
        # the teardown), and so does one set inside (``distributed.lost_rank``'s SIG_IGN: torchrun's SIGTERM)
        if signal.getsignal(signum) is stop:
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)


@contextmanager
def ignoring(checkpoint: CheckpointConfig) -> Iterator[None]:
    """Inside (a failed start's engines' stop; the run's teardown after any end, an error's, a finished or a
    stopped run's): ``checkpoint.exit_signal`` is ignored, then the handler from before is put back (a teardown
    that hangs is ended by the launcher's SIGKILL: torchrun's, Slurm's KillWait). So the error the cleanup
    follows stays the one said, with its exit code (a signal then took its place: ``stopping_at_once``'s line
    and 143, or, in the teardown after the start's handler was gone, a death by the signal without a line).
    Ctrl-C (SIGINT) keeps its own; nothing changes with ``exit_signal_handler`` off or off the main thread."""
    if (not checkpoint.exit_signal_handler or checkpoint.exit_signal == "SIGINT"
            or threading.current_thread() is not threading.main_thread()):
        yield
        return
    signum = int(getattr(signal, checkpoint.exit_signal))
    previous = signal.signal(signum, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signum, previous if previous is not None else signal.SIG_DFL)


class StopSignal:
    """Notes the signal ``name`` (``SIGTERM``) while installed; ``close()`` restores the old handler."""

    def __init__(self, name: str):
        self.signum = int(getattr(signal, name))
        self.received = False
        self._previous = signal.signal(self.signum, self._note)

    def _note(self, signum, frame) -> None:
        self.received = True
        if signum == signal.SIGINT:  # a second Ctrl-C: stop now
            signal.signal(self.signum, self._previous or signal.SIG_DFL)

    def agreed(self) -> bool:
        """Whether any rank received the signal (a collective over the world when distributed)."""
        import torch
        import torch.distributed as dist
        if not (dist.is_available() and dist.is_initialized()):
            return self.received
        flag = torch.tensor([int(self.received)], device="cuda" if dist.get_backend() == "nccl" else "cpu")
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    def close(self) -> None:
        signal.signal(self.signum, self._previous or signal.SIG_DFL)
