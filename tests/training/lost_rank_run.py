"""``python -m tests.training.lost_rank_run TRAINER-ARGS`` (under torchrun): the trainer, with one rank dying as
the OOM killer or a failed node kills it (SIGKILL: no handler, no last word), as ``$LOST_RANK_FAULT`` =
``WHAT:WHERE:RANK:STEP`` says: global rank ``RANK`` kills itself (``WHAT`` = process) or its torchrun agent and
then itself (node: a whole node of one process gone) at the start of step ``STEP`` (``WHERE`` = step, numbered as
metrics.jsonl numbers it) or as it is about to write its file of step ``STEP``'s checkpoint (save)."""

import os
import signal
import sys

from phf_megatron.training import checkpoint, loop

FAULT = "LOST_RANK_FAULT"


def _die(what: str) -> None:
    if what == "node":
        os.kill(os.getppid(), signal.SIGKILL)  # the agent first: nothing is left to restart or stop the node's ranks
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    what, where, rank, step = os.environ[FAULT].split(":")
    if int(os.environ["RANK"]) == int(rank):
        if where == "step":
            train_step = loop.Trainer.train_step

            def dying_step(self):
                if self.step + 1 == int(step):
                    _die(what)
                return train_step(self)

            loop.Trainer.train_step = dying_step
        else:
            write = checkpoint._write_torch

            def dying_write(obj, path):
                if f"{os.sep}tmp-{checkpoint.iter_dir_name(int(step))}{os.sep}" in path:
                    _die(what)
                return write(obj, path)

            checkpoint._write_torch = dying_write
    from phf_megatron.train import main

    sys.exit(main(sys.argv[1:]))
