"""The step plan's pure parts: reading ahead leaves the sampler alone; the rollout digest ignores the layout."""

from phf_megatron.data.sampler import EpochSampler
from phf_megatron.training.step_plan import local_rollout_record, peek_rows, rollout_stats


def test_peek_reads_ahead_without_moving_the_sampler():
    sampler, reference = EpochSampler(10, seed=3), EpochSampler(10, seed=3)
    first, second = reference.take(4), reference.take(4)
    assert peek_rows(sampler, 4, 4) == second and peek_rows(sampler, 0, 4) == first
    assert sampler.state_dict() == EpochSampler(10, seed=3).state_dict()
    assert peek_rows(sampler, 8, 4) == reference.take(4)  # across the epoch boundary


def test_rollout_digest_and_length_do_not_depend_on_the_data_parallel_split():
    completions = [[i, i + 1] * (1 + i % 3) for i in range(8)]
    whole = rollout_stats([local_rollout_record(completions, 0, 1)])
    # two data-parallel ranks, each record sent by its two tensor-parallel ranks
    halves = [local_rollout_record(completions, dp, 2) for dp in (0, 0, 1, 1)]
    assert rollout_stats(halves) == whole
    assert whole["rollout_tokens"] == sum(map(len, completions)) / 8 and 0 <= whole["rollout_digest"] < 2**52
    changed = [list(c) for c in completions]
    changed[5][0] += 1
    assert rollout_stats([local_rollout_record(changed, 0, 1)])["rollout_digest"] != whole["rollout_digest"]
