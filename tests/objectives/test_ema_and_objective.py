"""EMA update formula and the full objective."""

import pytest
import torch

from phf_megatron.objectives import ObjectiveConfig, ema_update, hidden_flow_loss, opsd_loss, phf_objective

from .loop_reference import direct_jsd, loop_flow_loss


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


def test_ema_default_is_the_papers_rate_toward_the_student_in_float64():
    """Eq. (EMA) with rho = 0.999 (the default, not passed): after k updates toward a fixed student,
    theta_bar_k = rho^k theta_bar_0 + (1 - rho^k) theta; the student is never moved."""
    student = [torch.randn(3, 4, dtype=torch.float64), torch.randn(5, dtype=torch.float64)]
    start = [torch.randn_like(p) for p in student]
    teacher, kept = [p.clone() for p in start], [p.clone() for p in student]
    for _ in range(7):
        ema_update(teacher, student)
    for t, t0, s, s0 in zip(teacher, start, student, kept):
        torch.testing.assert_close(t, 0.999**7 * t0 + (1 - 0.999**7) * s, rtol=1e-12, atol=1e-14)
        assert torch.equal(s, s0)


def test_phf_total_at_the_papers_settings_equals_the_equations_in_float64():
    """Eq. (L_PHF) with the config's defaults: the JSD (beta 0.5) clipped at 0.05, plus alpha = 0.05 times
    1/2 L_local + 1/2 L_adj, against the float64 loop references (the paper's values written here, not
    read from the config: a default that drifts from the paper fails)."""
    cfg = ObjectiveConfig()
    s_logits, t_logits = 3 * torch.randn(2, 5, 11, dtype=torch.float64), 3 * torch.randn(2, 5, 11, dtype=torch.float64)
    mask = torch.tensor([[True, True, True, False, False], [True, True, True, True, True]])
    h_s, h_t = torch.randn(4, 2, 6, 5, dtype=torch.float64), torch.randn(4, 2, 6, 5, dtype=torch.float64)
    valid = torch.arange(6)[None] < torch.tensor([6, 4])[:, None]
    got = phf_objective(opsd_loss(s_logits, t_logits, mask, cfg.jsd_beta, cfg.jsd_temperature, cfg.jsd_clip,
                                  cfg.jsd_clip_mode),
                        hidden_flow_loss(h_s, h_t, valid, cfg.flow_variant, cfg.flow_eps), cfg.flow_alpha)
    # the temperature, the clip's form (per vocabulary summand, official) and eps are not the paper's numbers
    want = (direct_jsd(s_logits, t_logits, mask, 0.5, cfg.jsd_temperature, 0.05, "element")
            + 0.05 * loop_flow_loss(h_s, h_t, valid, "phf", cfg.flow_eps))
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-10, atol=1e-12)


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
