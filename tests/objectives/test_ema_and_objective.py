"""EMA update formula and the full objective."""

import pytest
import torch

from phf_megatron.objectives import ObjectiveConfig, ema_update, phf_objective


def test_ema_update_matches_formula_over_steps():
    student = [torch.randn(3, 4), torch.randn(5)]
    teacher = [p.clone() + torch.randn_like(p) for p in student]
    expected = [p.clone() for p in teacher]
    for _ in range(3):
        for p in student:
            p.add_(torch.randn_like(p))
        ema_update(teacher, student, decay=0.999)
        expected = [0.999 * e + 0.001 * s for e, s in zip(expected, student)]
    for t, e in zip(teacher, expected):
        torch.testing.assert_close(t, e, rtol=1e-6, atol=1e-7)


def test_ema_rejects_mismatch():
    with pytest.raises(ValueError, match="teacher_params"):
        ema_update([torch.zeros(2)], [torch.zeros(3)])
    with pytest.raises(ValueError, match="teacher_params"):
        ema_update([torch.zeros(2)], [torch.zeros(2), torch.zeros(2)])


def test_full_objective_and_paper_defaults():
    cfg = ObjectiveConfig()
    assert (cfg.flow_alpha, cfg.flow_window, cfg.ema_decay, cfg.jsd_clip, cfg.flow_variant) == (0.05, 128, 0.999, 0.05, "phf")
    assert phf_objective(torch.tensor(0.2), torch.tensor(0.6), cfg.flow_alpha).item() == pytest.approx(0.23)
    assert not ObjectiveConfig(flow_variant="none").uses_flow


@pytest.mark.parametrize("field,value", [("flow_variant", "cka"), ("flow_alpha", -1.0), ("flow_window", 1),
                                         ("jsd_beta", 1.5), ("jsd_clip", 0.0), ("jsd_clip_mode", "vocab"),
                                         ("ema_decay", 2.0), ("jsd_temperature", 0.0)])
def test_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        ObjectiveConfig(**{field: value})
