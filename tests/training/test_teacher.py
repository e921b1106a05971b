"""The privileged teacher's weight sources: EMA formula, exact restore, fixed and dynamic modes; the EMA
of a bf16 run (fp32 shadow, rho = 0.999) through the whole trainer."""

import os

import pytest
import torch

from phf_megatron.training.teacher import PrivilegedTeacher

from ..helpers.tiny_run import assert_ok, train


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


def test_a_shadow_of_another_shape_is_refused_not_broadcast():
    """A rank-1 LoRA teacher's shadow (1, 4) was copied into a rank-3 one's (3, 4) by broadcasting, silently
    (a resume with --lora.r changed and --checkpoint.strict_config=false); now refused before any copy."""
    m = _model()
    saved = PrivilegedTeacher([m], mode="ema", decay=0.5, lora=False).state_dict()
    saved["shadow"][0] = saved["shadow"][0][:1]   # (1, 4), as rank 1 beside rank 3
    teacher = PrivilegedTeacher([m], mode="ema", decay=0.5, lora=False)
    before = [s.clone() for s in teacher.shadow]
    with pytest.raises(ValueError, match=r"^teacher tensor 0: shape \(1, 4\) in the checkpoint, \(3, 4\) in the model$"):
        teacher.load_state_dict(saved)
    assert all(torch.equal(a, b) for a, b in zip(teacher.shadow, before))


class _OfficialEma:
    """The official EMA teacher's rule, transcribed from ``opsd_trainer.py`` at commit 7448751
    (``louieworth/OPSD``): ``_ema_params`` starts as None (line 193); the teacher forward swaps in
    the EMA values only once they exist (lines 571-573, 609-624); after each optimizer step
    (``EMAUpdateCallback``, lines 84-93) the first call snapshots the parameters and returns
    (lines 531-544), later calls do ``ema = decay * ema + (1 - decay) * param`` (lines 546-554)."""

    def __init__(self, params, decay):
        self.params, self.decay, self.ema = params, decay, None

    def teacher_values(self):
        return [p.detach().clone() for p in self.params] if self.ema is None else [e.clone() for e in self.ema]

    def on_step_end(self):
        if self.ema is None:
            self.ema = [p.detach().clone() for p in self.params]
            return
        for e, p in zip(self.ema, self.params):
            e.mul_(self.decay).add_(p.detach(), alpha=1.0 - self.decay)


def _teacher_values(teacher, m):
    with teacher.weights():
        return [p.detach().clone() for p in m.parameters() if p.requires_grad]


def test_ema_after_first_step_follows_the_official_rule():
    m = _model()
    trainable = [p for p in m.parameters() if p.requires_grad]
    ours = PrivilegedTeacher([m], mode="ema", decay=0.9, lora=False, ema_start="after_first_step")
    paper = PrivilegedTeacher([m], mode="ema", decay=0.9, lora=False)
    official = _OfficialEma(trainable, 0.9)
    for step in range(4):
        for got, want in zip(_teacher_values(ours, m), official.teacher_values()):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)  # lerp_ vs mul_ + add_ rounding
        if step > 0:  # from step 1 on, the paper's start (theta_0 in the average) differs
            assert not all(torch.equal(a, b) for a, b in zip(_teacher_values(paper, m), official.teacher_values()))
        _train_step(m)
        ours.update()
        paper.update()
        official.on_step_end()


def test_ema_start_survives_a_checkpoint_at_every_point():
    """Resumed before the first step (still a copy to come) or after it (averaging), a teacher
    continues exactly as the one that was not interrupted; the start must match the checkpoint."""
    for interrupt_after in (0, 1, 2):
        torch.manual_seed(1)
        m = _model()
        straight = PrivilegedTeacher([m], mode="ema", decay=0.8, lora=False, ema_start="after_first_step")
        for _ in range(interrupt_after):
            _train_step(m)
            straight.update()
        resumed = PrivilegedTeacher([m], mode="ema", decay=0.8, lora=False, ema_start="after_first_step")
        resumed.load_state_dict(straight.state_dict())
        for _ in range(2):
            _train_step(m)
            straight.update()
            resumed.update()
        for a, b in zip(straight.shadow, resumed.shadow):
            assert torch.equal(a, b)
    with pytest.raises(ValueError, match="teacher.ema_start"):
        PrivilegedTeacher([m], mode="ema", lora=False).load_state_dict(straight.state_dict())
    old = {k: v for k, v in PrivilegedTeacher([m], mode="ema", lora=False).state_dict().items()
           if k not in ("ema_start", "started")}  # a checkpoint written before the option
    PrivilegedTeacher([m], mode="ema", lora=False).load_state_dict(old)


def _teacher_and_adapters(run_dir, step):
    saved = torch.load(os.path.join(run_dir, "checkpoints", f"iter_{step:07d}", "model_parallel_tp00_pp000.pt"),
                       weights_only=True)
    return saved["teacher"], saved["adapters"]


def test_the_ema_teacher_of_a_bf16_run_moves_by_one_minus_rho_of_the_student(tiny_inputs, tmp_path):
    """Two bf16 PHF steps at the paper's rho = 0.999: the teacher's copy is fp32 and follows Eq. (EMA) on the
    student's bf16 adapters to fp32 rounding. A bf16 copy would not: 0.999 * x rounds back to x in bf16 (a
    0.1% step is below its 2^-9 spacing), and each step's (1 - rho) share would be rounded to 8 bits."""
    hf, data = tiny_inputs
    run = str(tmp_path / "run")
    assert_ok(train(hf, data, run, "--model.dtype=bfloat16", "--training.train_iters=2", "--checkpoint.save_interval=1",
                    "--training.global_batch_size=2", "--rollout.max_tokens=8", "--lr=1e-3"))
    (teacher1, student1), (teacher2, student2) = (_teacher_and_adapters(run, step) for step in (1, 2))
    rho = teacher2["decay"]
    assert rho == 0.999 and len(teacher2["shadow"]) == len(student2)  # the shadow is in adapter order
    for (name, s1), s2, t1, t2 in zip(student1.items(), student2.values(), teacher1["shadow"], teacher2["shadow"]):
        assert s2.dtype == torch.bfloat16 and t2.dtype == torch.float32, name
        if name.endswith("lora_B"):  # B starts at 0: after step 1 the teacher holds (1 - rho) of the student's B
            assert s1.abs().max() > 0, name
            torch.testing.assert_close(t1, (1 - rho) * s1.float(), rtol=1e-6, atol=0)
        step = (1 - rho) * (s2.double() - t1.double())  # the teacher's move at step 2, in float64
        torch.testing.assert_close(t2.double(), t1.double() + step, rtol=2.5e-7, atol=1e-12)  # one fp32 rounding
        visible = step.abs() > t1.abs() * 2.0 ** -22  # above the shadow's own fp32 spacing (2 ulp)
        assert visible.any() and (t2 != t1)[visible].all(), name  # A too: its gradient is nonzero once B is
