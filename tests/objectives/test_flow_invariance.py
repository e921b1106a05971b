"""Proposition 1 as properties: what the transition objective ignores, and what MSE does not."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from phf_megatron.objectives import hidden_flow_loss

TOL = dict(rtol=1e-7, atol=1e-9)
EPS = 1e-12  # the exact statements hold at eps = 0; a tiny eps keeps them exact to ~1e-12
shapes = st.tuples(st.integers(2, 4), st.integers(1, 3), st.integers(2, 7), st.integers(2, 6))
seeds = st.integers(0, 2**31 - 1)
PROFILE = settings(max_examples=25, deadline=None)


def _inputs(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64), torch.randn(*shape, generator=g, dtype=torch.float64), g


def _orthogonal(H, g):
    q, r = torch.linalg.qr(torch.randn(H, H, generator=g, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


def _loss(s, t, variant):
    return hidden_flow_loss(s, t, variant=variant, eps=EPS)


def _rescale_transitions(h, scales):
    """Rebuild a trajectory whose i-th transition is scales[..., i] times the original one."""
    delta = (h[:, :, 1:] - h[:, :, :-1]) * scales[..., None]
    return torch.cat([h[:, :, :1], h[:, :, :1] + delta.cumsum(2)], dim=2)


@PROFILE
@given(shapes, seeds)
def test_offsets_leave_direction_geometry_and_phf_unchanged(shape, seed):
    s, t, g = _inputs(shape, seed)
    L, B, m, H = shape
    c_s = 10 * torch.randn(L, 1, 1, H, generator=g, dtype=torch.float64)
    c_t = 10 * torch.randn(L, 1, 1, H, generator=g, dtype=torch.float64)
    for variant in ("direction", "geometry", "local", "phf"):
        torch.testing.assert_close(_loss(s + c_s, t + c_t, variant), _loss(s, t, variant), **TOL)
    assert (_loss(s + c_s, t + c_t, "pointwise_mse") - _loss(s, t, "pointwise_mse")).abs() > 1e-6


@PROFILE
@given(shapes, seeds)
def test_positive_per_transition_rescaling_is_ignored(shape, seed):
    s, t, g = _inputs(shape, seed)
    L, B, m, H = shape
    s2 = _rescale_transitions(s, torch.rand(L, B, m - 1, generator=g, dtype=torch.float64) * 10 + 0.1)
    t2 = _rescale_transitions(t, torch.rand(L, B, m - 1, generator=g, dtype=torch.float64) * 10 + 0.1)
    for variant in ("direction", "geometry", "local", "phf"):
        torch.testing.assert_close(_loss(s2, t2, variant), _loss(s, t, variant), **TOL)


@PROFILE
@given(shapes, seeds)
def test_geometry_ignores_independent_orthogonal_maps(shape, seed):
    s, t, g = _inputs(shape, seed)
    H = shape[-1]
    r_s, r_t = _orthogonal(H, g), _orthogonal(H, g)
    torch.testing.assert_close(_loss(s @ r_s.T, t @ r_t.T, "geometry"), _loss(s, t, "geometry"), **TOL)
    assert (_loss(s @ r_s.T, t @ r_t.T, "pointwise_mse") - _loss(s, t, "pointwise_mse")).abs() > 1e-6


@PROFILE
@given(shapes, seeds)
def test_direction_ignores_a_shared_orthogonal_map(shape, seed):
    s, t, g = _inputs(shape, seed)
    r = _orthogonal(shape[-1], g)
    torch.testing.assert_close(_loss(s @ r.T, t @ r.T, "direction"), _loss(s, t, "direction"), **TOL)


def test_direction_changes_under_independent_maps():
    """The contrast of Proposition 1: direction is coordinate-anchored, geometry is not."""
    s, t, g = _inputs((2, 2, 6, 5), 3)
    r_s, r_t = _orthogonal(5, g), _orthogonal(5, g)
    assert (_loss(s @ r_s.T, t @ r_t.T, "direction") - _loss(s, t, "direction")).abs() > 1e-3


def test_pointwise_mse_changes_under_rescaling():
    s, t, g = _inputs((2, 2, 6, 5), 5)
    s2 = _rescale_transitions(s, torch.rand(2, 2, 5, generator=g, dtype=torch.float64) * 3 + 0.2)
    assert (_loss(s2, t, "pointwise_mse") - _loss(s, t, "pointwise_mse")).abs() > 1e-6
