"""Window selection: deterministic, covering, first and last generated token included."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from phf_megatron.objectives import select_window


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.booleans(), min_size=1, max_size=300), min_size=1, max_size=4).filter(
    lambda rows: len({len(r) for r in rows}) == 1), st.integers(2, 130))
def test_window_properties(rows, budget):
    generated = torch.tensor(rows, dtype=torch.bool)
    positions, valid = select_window(generated, budget)
    assert positions.shape == valid.shape and positions.shape[1] <= budget
    for b, row in enumerate(rows):
        gen = [i for i, x in enumerate(row) if x]
        m_b = int(valid[b].sum())
        assert valid[b, :m_b].all() and not valid[b, m_b:].any()  # a True prefix
        chosen = positions[b, :m_b].tolist()
        assert m_b == min(len(gen), budget)
        assert all(generated[b, p] for p in chosen)  # only generated positions
        assert chosen == sorted(set(chosen))  # strictly increasing
        if gen:
            assert chosen[0] == gen[0] and chosen[-1] == gen[-1]  # covers the rollout
            assert (positions[b, m_b:] == gen[-1]).all()  # padding stays inside the sequence


def test_evenly_spaced_over_a_long_rollout():
    generated = torch.zeros(1, 1100, dtype=torch.bool)
    generated[0, 76:1100] = True  # a 76-token prompt and a 1024-token rollout
    positions, valid = select_window(generated, 128)
    gaps = positions[0, 1:] - positions[0, :-1]
    assert valid.all() and positions.shape == (1, 128)
    assert positions[0, 0] == 76 and positions[0, -1] == 1099
    assert gaps.min() >= 8 and gaps.max() <= 9  # 1023 / 127 = 8.06


def test_short_rollout_keeps_every_token_and_is_deterministic():
    generated = torch.tensor([[False, True, True, True, False], [False, False, True, False, False]])
    p1, v1 = select_window(generated, 128)
    p2, v2 = select_window(generated, 128)
    assert torch.equal(p1, p2) and torch.equal(v1, v2)
    assert p1[0].tolist() == [1, 2, 3] and v1[1].tolist() == [True, False, False]
