"""Stage shares of the flow loss add up to the reference's per-sample flow, for any split.

Each stage evaluates ``stage_terms`` on its captured stack (its input's rows as the boundary
layer when a pair crosses into it, then its own layers); with the global counts, the shares'
sum equals ``per_sample_flow(flow_terms(...))`` of the whole model, value and gradient, for
every variant, selected layers, and splits down to one layer per stage (interleaved pipelines).
"""

import pytest
import torch

from phf_megatron.objectives.flow import LayerPlan, flow_terms, per_sample_flow
from phf_megatron.parallel.stage_flow import FlowSpec, stage_terms
from phf_megatron.parallel.stage_plan import StagePlan

L = 6
SPLITS = [(0, 6), (0, 3, 6), (0, 2, 5, 6), (0, 1, 2, 3, 4, 5, 6)]
PLANS = [("phf", None), ("phf", (1, 2, 3)), ("phf", (0, 1, 4, 5)), ("local", None), ("direction", (2,)),
         ("geometry", None), ("pointwise_mse", (0, 5))]


def _rows(seed=0):
    g = torch.Generator().manual_seed(seed)
    h_s = torch.randn(L, 3, 5, 4, generator=g, dtype=torch.float64).requires_grad_()
    h_t = torch.randn(L, 3, 5, 4, generator=g, dtype=torch.float64)
    valid = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool)
    return h_s, h_t, valid


@pytest.mark.parametrize("variant,layers", PLANS)
@pytest.mark.parametrize("split", SPLITS)
def test_stage_shares_add_up_to_the_whole(variant, layers, split):
    h_s, h_t, valid = _rows()
    plan = LayerPlan.build(L, variant, layers)
    plan = plan if variant == "phf" else LayerPlan(plan.layers, ())
    full = per_sample_flow(flow_terms(h_s, h_t, valid, plan, variant), variant, len(plan.layers), len(plan.pairs))
    spec = FlowSpec(variant, 1e-6, len(plan.layers), len(plan.pairs))
    total = torch.zeros_like(full)
    for first, stop in zip(split[:-1], split[1:]):
        stage = StagePlan.build(plan, first, stop)
        if not stage.has_flow:
            continue
        idx = torch.tensor(stage.captured)
        terms = stage_terms(h_s[idx], h_t[idx], valid, stage, spec)
        total = total + per_sample_flow(terms, variant, spec.num_layers, spec.num_pairs)
    torch.testing.assert_close(total, full, rtol=1e-12, atol=1e-14)
    (g_full,) = torch.autograd.grad(full.sum(), h_s)
    (g_total,) = torch.autograd.grad(total.sum(), h_s)
    torch.testing.assert_close(g_total, g_full, rtol=1e-12, atol=1e-14)
    # One window entry: no transition; the batch mean leaves the sample out (m_b < 2).
    assert not flow_terms(h_s, h_t, valid, plan, variant).sample_mask[2]
    if variant != "pointwise_mse":
        assert full[2] == 0


def test_boundary_layer_is_captured_only_when_a_pair_crosses():
    plan = LayerPlan.build(L, "phf", (1, 2, 4))
    s0, s1, s2 = (StagePlan.build(plan, a, b) for a, b in ((0, 2), (2, 4), (4, 6)))
    assert s0.captured == (1,) and s0.pairs == ()
    assert s1.boundary == 1 and s1.captured == (1, 2) and s1.pairs == ((1, 2),)
    assert s2.boundary is None and s2.captured == (4,)
    assert (s1.layer_slots, s1.pair_slots, s2.layer_slots) == ((1,), (0,), (2,))
    assert not StagePlan.build(LayerPlan.build(L, "local", (4,)), 0, 3).has_flow
    gaps = StagePlan.build(LayerPlan.build(L, "phf", (0, 1, 3, 4, 5)), 0, 6)
    assert gaps.captured == (0, 1, 3, 4, 5) and gaps.pair_runs() == [(0, 1), (2, 4)]
    assert s1.pair_runs() == [(0, 1)] and StagePlan.build(plan, 4, 6).pair_runs() == []


def test_bad_stage_range_raises():
    with pytest.raises(ValueError, match="first/stop"):
        StagePlan.build(LayerPlan.build(L, "phf"), 3, 3)
