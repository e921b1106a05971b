"""GKD's on-policy fraction (``rollout.lmbda``): a micro-batch trains on rollouts with probability lmbda,
otherwise on the dataset's solutions as the completions.

The rule is TRL's GKD/GOLD trainer (``trl/experimental/gold/gold_trainer.py`` at v0.26.0, commit
``84794a7``, ``training_step``, lines 1909-1911: ``if random.random() <= self.lmbda`` generate,
else keep the dataset's completion). It is drawn once per ``training_step`` call, i.e. per
micro-batch (gradient-accumulation step) on each rank, from Python's global RNG, which
``Trainer`` seeds identically on every rank (``set_seed(args.seed)``): the i-th micro-batch of a
step gets the same draw on every data-parallel rank. Here: one draw per micro-batch slot of the
step, shared by the data-parallel ranks, from an RNG seeded by ``(training.seed, step)`` alone,
so a resumed run draws the same (no RNG state to checkpoint).

The official OPSD trainer (``opsd_trainer.py`` at ``7448751``) reads ``--lmbda`` (line 181) but
never uses it: its ``training_step`` sets ``on_policy = True`` (line 1305) and always samples; the
official scripts pass ``--lmbda 1``. ``lmbda = 1`` (our default) is that behaviour.

An off-policy sample's completion is the row's solution, tokenized on its own (as a rollout's
ids follow the student prompt) and ended by the tokenizer's EOS (``<|im_end|>`` for Qwen3, how
an assistant turn ends), cut at ``rollout.max_tokens`` like a rollout (then without EOS).
"""

from __future__ import annotations

import random

from ..data.prompts import encode_prompt


def on_policy_slots(lmbda: float, seed: int, step: int, num_slots: int) -> list[bool]:
    """One draw per micro-batch slot: ``u <= lmbda`` with ``u ~ U[0, 1)`` (GOLD's comparison)."""
    if lmbda >= 1.0:
        return [True] * num_slots
    rng = random.Random(f"lmbda:{seed}:{step}")  # a str seed is hashed deterministically (sha512)
    return [rng.random() <= lmbda for _ in range(num_slots)]


def sample_slot(sample: int, samples_per_rank: int, micro_batch_size: int) -> int:
    """The micro-batch slot of a step's sample (``batches.build_microbatches``' split: each data-parallel
    rank takes a contiguous block of the samples, then micro-batches of ``micro_batch_size``)."""
    return (sample % samples_per_rank) // micro_batch_size


def on_policy_samples(lmbda: float, seed: int, step: int, num_samples: int, dp_size: int,
                      micro_batch_size: int) -> list[bool]:
    """Whether each of the step's samples is a rollout (True) or the row's solution (False).

    ``lmbda >= 1``: every sample, whatever the split (a token budget's micro-batches need not be of
    ``micro_batch_size``). Else the draws follow the fixed split's slots, under a token budget too (its
    update then equals the fixed micro-batching's): ``micro_batch_size`` divides a rank's samples
    (``microbatch_plan.check_step_split``, at start)."""
    if lmbda >= 1.0:
        return [True] * num_samples
    per_rank = num_samples // dp_size
    slots = on_policy_slots(lmbda, seed, step, per_rank // micro_batch_size)
    return [slots[sample_slot(i, per_rank, micro_batch_size)] for i in range(num_samples)]


def solution_completion(tokenizer, solution: str, max_tokens: int) -> list[int]:
    """The solution's ids followed by EOS, cut at ``max_tokens`` (no EOS when cut)."""
    ids = encode_prompt(tokenizer, solution) + [tokenizer.eos_token_id]
    return ids[:max_tokens]
