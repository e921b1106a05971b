"""The epoch sampler: deterministic, a permutation per epoch, resumable exactly."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phf_megatron.data import EpochSampler, epoch_permutation


def test_epoch_permutation_is_fixed_by_seed_and_epoch():
    # Pinned values: the order must never change with a library version (resume across upgrades).
    assert epoch_permutation(10, seed=0, epoch=0) == epoch_permutation(10, seed=0, epoch=0)
    assert epoch_permutation(10, 0, 0) == [4, 2, 8, 1, 9, 3, 0, 6, 7, 5]
    assert epoch_permutation(10, 0, 1) != epoch_permutation(10, 0, 0)
    assert epoch_permutation(10, 1, 0) != epoch_permutation(10, 0, 0)
    assert sorted(epoch_permutation(29_434, 3, 7)) == list(range(29_434))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 50), st.integers(0, 2**40), st.lists(st.integers(0, 70), min_size=1, max_size=8))
def test_take_walks_epochs_in_order_whatever_the_batch_sizes(num_rows, seed, sizes):
    sampler = EpochSampler(num_rows, seed)
    taken = [i for n in sizes for i in sampler.take(n)]
    expected = [i for e in range(sum(sizes) // num_rows + 1) for i in epoch_permutation(num_rows, seed, e)]
    assert taken == expected[: len(taken)]
    assert sampler.epoch * num_rows + sampler.index == len(taken)


def test_no_shuffle_is_file_order():
    assert EpochSampler(4, shuffle=False).take(6) == [0, 1, 2, 3, 0, 1]


def test_resume_reproduces_the_uninterrupted_stream():
    straight = EpochSampler(7, seed=11)
    full = [straight.take(3) for _ in range(6)]
    first = EpochSampler(7, seed=11)
    part = [first.take(3) for _ in range(3)]
    state = dict(first.state_dict())
    resumed = EpochSampler(7, seed=11)
    resumed.load_state_dict(state)
    part += [resumed.take(3) for _ in range(3)]
    assert part == full
    assert state == {"epoch": 1, "index": 2, "seed": 11, "num_rows": 7, "shuffle": True}


@pytest.mark.parametrize("change, message", [
    ({"seed": 12}, r"state\['seed'\]: checkpoint has 12"),
    ({"num_rows": 8}, r"state\['num_rows'\]"),
    ({"index": 7}, r"state\['index'\]: must lie in \[0, 7\)"),
    ({"epoch": -1}, r"state\['epoch'\]"),
])
def test_load_state_dict_rejects_a_foreign_state(change, message):
    state = {**EpochSampler(7, seed=11).state_dict(), **change}
    with pytest.raises(ValueError, match=message):
        EpochSampler(7, seed=11).load_state_dict(state)
    with pytest.raises(ValueError, match="missing key 'index'"):
        EpochSampler(7, seed=11).load_state_dict({"epoch": 0})


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="num_rows"):
        EpochSampler(0)
    with pytest.raises(ValueError, match="seed"):
        EpochSampler(3, seed=-1)
    with pytest.raises(ValueError, match="count"):
        EpochSampler(3).take(-1)
