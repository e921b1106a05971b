"""The privileged teacher's weight sources: EMA formula, exact restore, fixed and dynamic modes."""

import pytest
import torch

from phf_megatron.training.teacher import PrivilegedTeacher


def _model():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    m[1].weight.requires_grad_(False)  # a frozen tensor is never averaged or swapped
    return m


def _train_step(m):
    with torch.no_grad():
        for p in m.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p))


def test_ema_teacher_equals_its_formula_and_restores_the_student():
    m = _model()
    teacher = PrivilegedTeacher([m], mode="ema", decay=0.9, lora=False)
    expected = [p.detach().clone() for p in m.parameters() if p.requires_grad]  # theta_bar_0 = theta_0
    for _ in range(3):
        _train_step(m)
        teacher.update()
        expected = [0.9 * e + 0.1 * p.detach() for e, p in zip(expected, (q for q in m.parameters() if q.requires_grad))]
    student = [p.detach().clone() for p in m.parameters()]
    x = torch.randn(5, 4)
    with teacher.weights():
        for p, e in zip((q for q in m.parameters() if q.requires_grad), expected):
            torch.testing.assert_close(p, e)
        teacher_out = m(x)
    for p, s in zip(m.parameters(), student):
        assert torch.equal(p, s)  # bit-exact restore
    assert not torch.allclose(teacher_out, m(x))


def test_fixed_full_finetune_teacher_is_the_initial_policy():
    m = _model()
    x = torch.randn(5, 4)
    initial = m(x).detach()
    teacher = PrivilegedTeacher([m], mode="fixed", lora=False)
    _train_step(m)
    teacher.update()
    with teacher.weights():
        torch.testing.assert_close(m(x), initial)


def test_dynamic_teacher_is_the_student():
    m = _model()
    x = torch.randn(5, 4)
    initial = m(x).detach()
    teacher = PrivilegedTeacher([m], mode="dynamic", lora=False)
    _train_step(m)
    teacher.update()
    student = m(x).detach()
    with teacher.weights():
        torch.testing.assert_close(m(x), student)
    assert not torch.allclose(student, initial)
    assert teacher.shadow == []  # no copy kept


def test_state_round_trip_and_mode_mismatch():
    m = _model()
    t1 = PrivilegedTeacher([m], mode="ema", decay=0.5, lora=False)
    _train_step(m)
    t1.update()
    t2 = PrivilegedTeacher([m], mode="ema", decay=0.5, lora=False)
    t2.load_state_dict(t1.state_dict())
    for a, b in zip(t1.shadow, t2.shadow):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="teacher.mode"):
        PrivilegedTeacher([m], mode="fixed", lora=False).load_state_dict(t1.state_dict())
    with pytest.raises(ValueError, match="teacher.mode"):
        PrivilegedTeacher([m], mode="average")
