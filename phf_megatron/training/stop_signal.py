"""Stopping a run on a signal: a scheduler's preemption (Slurm sends SIGTERM) costs no finished step.

Megatron-LM's ``--exit-signal-handler``: the handler only notes the signal; at the end of the step in
flight every rank agrees that one was received (on any rank: torchrun may deliver it to one worker
before the others), the trainer writes a checkpoint and exits with ``128 + signal number``, the code
of a process the signal killed. A second signal acts at once (the handler that was there before).
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
        signal.signal(self.signum, self._previous)  # a second signal: stop now

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
        if not self.received:
            signal.signal(self.signum, self._previous)
