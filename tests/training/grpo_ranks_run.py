"""``python -m tests.training.grpo_ranks_run TRAINER-ARGS`` (under torchrun for several ranks): the
trainer with ``test_grpo_trainer``'s text-based reward, and each rank's view of every rollout batch
saved to ``$GRPO_RECORD_DIR/rank{R}_round{K}.pt``: the whole step's rewards and advantages
(``GrpoMethod.round``), this rank's data-parallel rank and size, and the advantages its
micro-batches carry (in sample order)."""

import os
import sys

import torch

from phf_megatron.training.methods import grpo

from .test_grpo_trainer import _reward

RECORD_DIR = "GRPO_RECORD_DIR"


def _recording(microbatches):
    rounds = []

    def record(self, batch, micro_batch_size, samples):
        from megatron.core import parallel_state as ps

        mbs = microbatches(self, batch, micro_batch_size, samples)
        path = os.path.join(os.environ[RECORD_DIR], f"rank{int(os.environ.get('RANK', 0))}_round{len(rounds)}.pt")
        torch.save({"rewards": self.round.rewards, "advantages": self.round.advantages,
                    "dp_rank": ps.get_data_parallel_rank(), "dp_size": ps.get_data_parallel_world_size(),
                    "local": torch.cat([mb.advantages.cpu() for mb in mbs])}, path)
        rounds.append(path)
        return mbs

    return record


if __name__ == "__main__":
    grpo.reward_correctness = lambda text, gold: _reward(text)
    grpo.GrpoMethod.microbatches = _recording(grpo.GrpoMethod.microbatches)
    from phf_megatron.train import main

    sys.exit(main(sys.argv[1:]))
