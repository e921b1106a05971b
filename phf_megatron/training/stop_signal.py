"""Stopping a run on a signal: a scheduler's preemption (Slurm sends SIGTERM) costs no finished step.

Megatron-LM's ``--exit-signal-handler``: the handler only notes the signal; at the end of the step in
flight every rank agrees that one was received (on any rank: torchrun may deliver it to one worker
before the others), the trainer writes a checkpoint and exits with ``128 + signal number``, the code
of a process the signal killed. A repeated signal is noted again (Slurm signals every process of the
job step and torchrun passes its own signal on: a worker often gets two); a second Ctrl-C, though,
acts at once (the handler that was there before).
"""

from __future__ import annotations

import signal

import torch
import torch.distributed as dist


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
