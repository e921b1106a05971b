"""``python -m tests.training.lost_rank_run TRAINER-ARGS`` (under torchrun): the trainer, with one rank dying as
the OOM killer or a failed node kills it (SIGKILL: no handler, no last word), as ``$LOST_RANK_FAULT`` =
``WHAT:WHERE:RANK:STEP`` says: global rank ``RANK`` kills itself (``WHAT`` = process) or its torchrun agent and
then itself (node: a whole node of one process gone) at the start of step ``STEP`` (``WHERE`` = step, numbered as
metrics.jsonl numbers it), as it is about to write its file of step ``STEP``'s checkpoint (save), or as it starts to
read the checkpoint it would resume from, before the engines get the first weights (start: ``STEP`` unused; it
first waits there for every other rank to reach that point too, so that they wait in the collective that follows
when it dies, rather than being stopped by torchrun's SIGTERM before they reach one: a race under load).
``$LOST_RANK_ENGINE_FAULT`` = ``STEP``: the rollout engines fail too, sampling step ``STEP`` (0-based, as the error
names it). Every cleanup the run does after its error (the engines' shutdown, the process group's) first prints
``CLEANUP`` on stderr."""

import os
import signal
import sys
import time

from phf_megatron.training import checkpoint, distributed, loop, rollouts

FAULT = "LOST_RANK_FAULT"
ENGINE_FAULT = "LOST_RANK_ENGINE_FAULT"
CLEANUP = "lost_rank_run: cleanup starts"


def _die(what: str) -> None:
    if what == "node":
        os.kill(os.getppid(), signal.SIGKILL)  # the agent first: nothing is left to restart or stop the node's ranks
    os.kill(os.getpid(), signal.SIGKILL)


def _ready(run_dir: str, rank: int) -> str:
    os.makedirs(run_dir, exist_ok=True)
    return os.path.join(run_dir, f"lost_rank_run.ready.{rank}")


def _wait_for_the_others(run_dir: str) -> None:
    """Until every other rank has reached its resume (then 1 s more: it is in the collective after it)."""
    me, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    deadline = time.monotonic() + 300
    while not all(os.path.exists(_ready(run_dir, r)) for r in range(world) if r != me):
        if time.monotonic() > deadline:
            raise SystemExit("lost_rank_run: the other ranks never reached their resume")
        time.sleep(0.05)
    time.sleep(1.0)


def _announced(fn):
    def cleanup(*args, **kwargs):
        print(CLEANUP, file=sys.stderr, flush=True)
        return fn(*args, **kwargs)

    return cleanup


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
        elif where == "start":
            def dying_resume(self):
                _wait_for_the_others(self.cfg.run_dir)
                _die(what)

            loop.Trainer._maybe_resume = dying_resume
        else:
            write = checkpoint._write_torch

            def dying_write(obj, path):
                if f"{os.sep}tmp-{checkpoint.iter_dir_name(int(step))}{os.sep}" in path:
                    _die(what)
                return write(obj, path)

            checkpoint._write_torch = dying_write
    elif where == "start":
        resume = loop.Trainer._maybe_resume

        def announced_resume(self):
            open(_ready(self.cfg.run_dir, int(os.environ["RANK"])), "w").close()
            return resume(self)

        loop.Trainer._maybe_resume = announced_resume
    if ENGINE_FAULT in os.environ:
        sample = rollouts.RolloutDriver.sample

        def failing_sample(self, requests):
            if requests.step == int(os.environ[ENGINE_FAULT]):
                raise RuntimeError("injected engine fault")
            return sample(self, requests)

        rollouts.RolloutDriver.sample = failing_sample
    rollouts.RolloutDriver.close = _announced(rollouts.RolloutDriver.close)
    distributed.shutdown_distributed = _announced(distributed.shutdown_distributed)
    from phf_megatron.train import main

    sys.exit(main(sys.argv[1:]))
