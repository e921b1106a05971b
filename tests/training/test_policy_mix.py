"""``rollout.lmbda``: GKD/GOLD's per-micro-batch on-policy draw, the slots of the micro-batch split,
and the solution as an off-policy completion."""

import random

import pytest
import torch

from phf_megatron.data import PromptPair, load_qwen3_tokenizer
from phf_megatron.training.batches import build_microbatches
from phf_megatron.training.policy_mix import on_policy_samples, on_policy_slots, solution_completion


def gold_draws(lmbda, rng, num_microbatches):
    """TRL GOLD ``training_step`` (v0.26.0, ``gold_trainer.py`` lines 1909-1911), once per micro-batch:
    ``on_policy = random.random() <= lmbda``."""
    out = []
    for _ in range(num_microbatches):
        on_policy = False
        if rng.random() <= lmbda:
            on_policy = True
        out.append(on_policy)
    return out


@pytest.mark.parametrize("lmbda", [0.0, 0.3, 0.5, 1.0])
def test_slots_follow_the_gold_rule_and_are_resumable(lmbda):
    for step in range(5):
        got = on_policy_slots(lmbda, 42, step, 8)
        expected = gold_draws(lmbda, random.Random(f"lmbda:42:{step}"), 8)
        assert got == (expected if lmbda < 1 else [True] * 8)
        assert got == on_policy_slots(lmbda, 42, step, 8)  # a function of (seed, step): nothing to checkpoint
    draws = [x for step in range(500) for x in on_policy_slots(lmbda, 42, step, 4)]
    assert abs(sum(draws) / len(draws) - lmbda) < 0.03


def test_each_microbatch_of_every_rank_shares_one_draw():
    """The flags follow ``build_microbatches``' split: one value per micro-batch, the same slot on each DP rank."""
    num_samples, dp, mbs = 16, 2, 2
    flags = on_policy_samples(0.5, 7, 3, num_samples, dp, mbs)
    slots = on_policy_slots(0.5, 7, 3, num_samples // dp // mbs)
    assert 0 < sum(flags) < num_samples
    pairs = [PromptPair([1, 2], [1, 2, 3]) for _ in range(num_samples)]
    for rank in range(dp):
        mbs_of_rank = build_microbatches(pairs, [[100 + i] for i in range(num_samples)], pad_id=0,
                                         micro_batch_size=mbs, dp_rank=rank, dp_size=dp, pad_multiple=1,
                                         window_budget=4)
        for slot, mb in enumerate(mbs_of_rank):
            samples = [int(x) - 100 for x in mb.score_tokens]
            assert {flags[i] for i in samples} == {slots[slot]}


def test_solution_completion_is_the_solution_then_eos():
    tok = load_qwen3_tokenizer()
    ids = solution_completion(tok, "So $x = 4$.", 50)
    assert ids[-1] == tok.convert_tokens_to_ids("<|im_end|>") and tok.decode(ids[:-1]) == "So $x = 4$."
    assert solution_completion(tok, "So $x = 4$.", 3) == ids[:3]  # cut like a rollout at max_tokens: no EOS
    assert torch.tensor(ids).dtype == torch.long
