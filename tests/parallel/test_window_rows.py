"""Window rows of a Megatron ``[s, b, H]`` activation: values, gradient, sequence-parallel shards.

The sequence-parallel split is emulated here by slicing one activation into ``tp`` shards and
summing the per-rank shares by hand (what the all-reduce does); the real TP=2 all-reduce runs in
the spawn of ``test_phf_step.py``.
"""

import pytest
import torch

from phf_megatron.parallel.window_rows import (add_window_grad, check_positions, gather_window_rows,
                                               local_seq_range, local_window_rows)


def _hidden_and_positions():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(12, 3, 5, generator=g, dtype=torch.float64)  # [s, b, H]
    positions = torch.tensor([[0, 4, 11], [3, 3, 3], [6, 7, 10]])    # repeated entries = padding
    return hidden, positions


def test_rows_are_the_indexed_activation_rows():
    hidden, positions = _hidden_and_positions()
    rows = gather_window_rows(hidden, positions)
    expected = torch.stack([hidden[positions[b], b] for b in range(3)])
    assert torch.equal(rows, expected)


def test_gradient_scatters_into_the_activation():
    hidden, positions = _hidden_and_positions()
    hidden.requires_grad_()
    weights = torch.randn(3, 3, 5, dtype=torch.float64)
    (grad,) = torch.autograd.grad((gather_window_rows(hidden, positions) * weights).sum(), hidden)
    expected = torch.zeros_like(hidden)
    for b in range(3):
        for i in range(3):
            expected[positions[b, i], b] += weights[b, i]
    assert torch.equal(grad, expected)


@pytest.mark.parametrize("tp", [2, 3, 4])
def test_sequence_shards_sum_to_the_rows_and_own_their_gradient(tp):
    hidden, positions = _hidden_and_positions()
    s_local = hidden.shape[0] // tp
    shards = hidden.split(s_local)
    starts = [r * s_local for r in range(tp)]
    total = sum(local_window_rows(shard, positions, start) for shard, start in zip(shards, starts))
    assert torch.equal(total, gather_window_rows(hidden, positions))
    grad_rows = torch.randn(3, 3, 5, dtype=torch.float64)
    grads = [add_window_grad(torch.zeros_like(shard), grad_rows, positions, start) for shard, start in zip(shards, starts)]
    full = add_window_grad(torch.zeros_like(hidden), grad_rows, positions, 0)
    assert torch.equal(torch.cat(grads), full)


def test_local_seq_range_without_group():
    assert local_seq_range(8, None, sequence_parallel=True) == (0, 8)
    assert local_seq_range(8, None, sequence_parallel=False) == (0, 8)


@pytest.mark.parametrize("bad", [torch.tensor([[0, 12]]), torch.tensor([[-1, 3]])])
def test_positions_outside_the_sequence_raise(bad):
    hidden, _ = _hidden_and_positions()
    with pytest.raises(ValueError, match=r"positions: window positions must lie in \[0, 12\)"):
        check_positions("positions", bad, 12)
    with pytest.raises(ValueError, match="window positions must lie"):
        gather_window_rows(hidden[:, :1], bad)


def test_bad_position_tensors_raise():
    hidden, positions = _hidden_and_positions()
    with pytest.raises(ValueError, match="long tensor"):
        gather_window_rows(hidden, positions.float())
    with pytest.raises(ValueError, match="batch"):
        gather_window_rows(hidden, positions[:2])
