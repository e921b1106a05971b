"""PHF (and OPSD, and the ablations): rollouts from the engines, the privileged teacher's pass, the EMA."""

from __future__ import annotations

from ...data import build_prompt_pair
from ...parallel.capture import WindowCapture
from ...parallel.step import PhfStep
from ..batches import Packing, phf_microbatches
from ..checkpoint_parts import Scope, stateful_part
from ..model_setup import loss_kernels
from ..rollouts import RolloutDriver
from ..teacher import PrivilegedTeacher
from ..update import ScoringPass


class PhfMethod:
    """The paper's method: ``L_OPSD + alpha * L_flow`` against the teacher (``teacher.mode``)."""

    name = "phf"
    iterations = 1

    def __init__(self, cfg, student):
        self.cfg = cfg
        self.teacher = PrivilegedTeacher(student.chunks, cfg.teacher.mode, cfg.objective.ema_decay,
                                         lora=cfg.lora.enabled, ema_start=cfg.teacher.ema_start)
        self.capture = WindowCapture(student.chunks) if cfg.objective.uses_flow else None

    def rollout_driver(self, cfg, student, engine_model_dir: str, eos_token_ids: tuple[int, ...]) -> RolloutDriver:
        return RolloutDriver(cfg, student, engine_model_dir, eos_token_ids)

    @staticmethod
    def row_inputs(tokenizer, row, prompt_config):
        return build_prompt_pair(tokenizer, row.problem, row.solution, prompt_config)

    @staticmethod
    def check_rows(planner) -> None:
        planner.check_rows()

    def training_samples(self, planner, plan, samples, group):
        return planner.training_samples(plan, samples, group)

    def microbatches(self, batch, micro_batch_size, samples=None) -> list:
        """Padded, or packed with ``training.packing`` (``batches.Packing``); ``samples``: unused."""
        return phf_microbatches(batch, micro_batch_size, self.cfg.objective.flow_window, Packing.of(self.cfg))

    def step(self, student) -> PhfStep:
        from megatron.core import parallel_state as ps

        return PhfStep(self.cfg.objective, student.config, tp_group=ps.get_tensor_model_parallel_group(),
                       dp_group=ps.get_data_parallel_group(), student_capture=self.capture,
                       teacher_capture=self.capture)

    def passes(self, step: PhfStep, mbs) -> list[ScoringPass]:
        return [ScoringPass("time_teacher_s", self.teacher.weights, step.teacher_forward_step,
                            mbs[0].teacher_tokens.shape[1])]

    def after_step(self) -> None:
        self.teacher.update()

    def parts(self) -> dict:
        return {"teacher": stateful_part(self.teacher, Scope.MODEL_PARALLEL)}

    def implementations(self) -> list[str]:
        return loss_kernels(self.cfg)

    def step_metrics(self) -> dict:
        return {}

    def close(self) -> None:
        if self.capture is not None:
            self.capture.remove()
