"""Layer-energy diagnostics: closed forms, invariances, edge cases, and the link to the flow terms."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from phf_megatron.objectives.flow import LayerPlan, flow_terms, layer_loss
from phf_megatron.training.diagnostics import (
    energy_entropy, energy_shares, layer_energy, layer_energy_metrics, max_share, normalized_entropy,
)

# Normal floats with a non-negligible total (a subnormal total scaled by 1e-3 underflows to 0).
energies = st.lists(st.floats(0.0, 1e3, allow_nan=False, allow_subnormal=False), min_size=1,
                    max_size=40).filter(lambda e: sum(e) > 1e-3)


def test_closed_forms_on_a_small_vector():
    e = torch.tensor([1.0, 3.0, 0.0, 4.0])
    assert max_share(e) == 0.5
    expected = -(0.125 * math.log(0.125) + 0.375 * math.log(0.375) + 0.5 * math.log(0.5))
    assert energy_entropy(e) == pytest.approx(expected, rel=1e-14)
    assert normalized_entropy(e) == pytest.approx(expected / math.log(4), rel=1e-14)


@pytest.mark.parametrize("num_layers", [1, 28, 36])
def test_uniform_energy_has_maximal_entropy(num_layers):
    e = torch.full((num_layers,), 0.3)
    assert max_share(e) == pytest.approx(1 / num_layers)
    assert energy_entropy(e) == pytest.approx(math.log(num_layers), abs=1e-12)
    assert normalized_entropy(e) == pytest.approx(1.0)


def test_one_layer_holding_everything_has_zero_entropy():
    e = torch.zeros(36)
    e[7] = 2.5
    metrics = layer_energy_metrics(e)
    assert metrics["flow_energy_max_share"] == 1.0 and metrics["flow_energy_argmax"] == 7
    assert metrics["flow_energy_entropy"] == 0.0 and metrics["flow_energy_entropy_norm"] == 0.0


def test_zero_energy_is_undefined_not_an_error():
    metrics = layer_energy_metrics(torch.zeros(5))
    assert math.isnan(metrics["flow_energy_max_share"]) and math.isnan(metrics["flow_energy_entropy"])
    assert metrics["flow_energy_argmax"] is None and metrics["flow_energy"] == [0.0] * 5


@pytest.mark.parametrize("bad", [torch.tensor([1.0, -0.1]), torch.tensor([1.0, float("nan")]), torch.zeros(0),
                                 torch.ones(2, 2)])
def test_bad_energy_is_rejected(bad):
    with pytest.raises(ValueError, match="energy:"):
        energy_shares(bad)


@settings(max_examples=60, deadline=None)
@given(energies, st.floats(1e-3, 1e3))
def test_scale_and_permutation_invariance(values, scale):
    e = torch.tensor(values, dtype=torch.float64)
    perm = torch.randperm(e.numel())
    for other in (e * scale, e[perm]):
        assert max_share(other) == pytest.approx(max_share(e), rel=1e-9)
        assert energy_entropy(other) == pytest.approx(energy_entropy(e), rel=1e-9, abs=1e-12)
    n = e.numel()
    assert 1.0 / n - 1e-12 <= max_share(e) <= 1.0
    assert -1e-12 <= normalized_entropy(e) <= 1.0 + 1e-12
    assert float(energy_shares(e).sum()) == pytest.approx(1.0, rel=1e-12)


@pytest.mark.parametrize("variant", ["phf", "local", "direction", "geometry", "pointwise_mse"])
def test_layer_energy_is_the_variants_layer_value_over_valid_samples(variant):
    L, B, m, H = 4, 3, 6, 5
    student, teacher = torch.randn(L, B, m, H, dtype=torch.float64), torch.randn(L, B, m, H, dtype=torch.float64)
    valid = torch.ones(B, m, dtype=torch.bool)
    valid[2, 1:] = False  # sample 2 has one position: no transition, out of the mean
    plan = LayerPlan.build(L, variant)
    terms = flow_terms(student, teacher, valid, plan, variant)
    energy = layer_energy(terms, variant)
    expected = layer_loss(terms, variant)[:, :2].mean(-1)
    torch.testing.assert_close(energy, expected, rtol=1e-12, atol=0)
    assert bool((energy >= 0).all())
    metrics = layer_energy_metrics(energy)
    assert len(metrics["flow_energy"]) == L


def test_identical_student_and_teacher_give_zero_not_negative_energy():
    h = torch.randn(3, 2, 5, 4, dtype=torch.float32)
    plan = LayerPlan.build(3, "local")
    energy = layer_energy(flow_terms(h, h.clone(), None, plan, "local"), "local")
    assert bool((energy >= 0).all()) and float(energy.max()) < 1e-5
