"""One PHF update on Megatron-Core (paper Section 3; ``ARCHITECTURE.md``'s data flow):

    teacher forward (teacher weights, privileged prompt, no grad) ─ window rows per layer, logit rows
    student forward + backward (plain prompt)                     ─ L_OPSD + alpha * L_flow
    finiteness check (every rank agrees)                          ─ ``nonfinite.StepCheck``
    optimizer step (grad clip), LR schedule step, EMA teacher update ─ all skipped on a NaN/inf

Both passes run through Megatron's ``forward_backward_func`` (any TP/SP/PP/VPP/DP layout, the
step's micro-batches); ``parallel.PhfStep`` supplies the forward-step and loss functions.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ..objectives.config import ObjectiveConfig
from ..parallel.batch import PhfMicroBatch
from ..parallel.capture import WindowCapture
from ..parallel.step import PhfStep
from .model_setup import StudentModel
from .nonfinite import Fault, StepCheck
from .schedule import current_lr
from .teacher import PrivilegedTeacher


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _gather_metrics(metrics: dict | None) -> dict:
    """The last pipeline stage's metrics, on every rank (one small object all-gather)."""
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, metrics)
    return next((m for m in gathered if m is not None), {})


def phf_update(student: StudentModel, teacher: PrivilegedTeacher, capture: WindowCapture | None,
               microbatches: list[PhfMicroBatch], objective: ObjectiveConfig, collect_loss_tokens: bool = False,
               faults: tuple[Fault, ...] = ()) -> dict:
    """Run one update; returns the step's metrics (loss parts, grad norm, lr, per-layer flow, clip
    diagnostics, timings; with ``collect_loss_tokens`` the loss by rollout token, ``loss.LOSS_TOKENS``).

    A NaN or inf in a loss or a gradient on any rank skips the update on every rank (``nonfinite``):
    ``update_skipped`` is then True and ``nonfinite`` says what was not finite (else None).
    ``faults``: NaN/inf to inject into this update (testing only, ``nonfinite.Fault``).
    """
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func

    device = next(p for c in student.chunks for p in c.parameters()).device
    mbs = [mb.to(device) for mb in microbatches] if device.type != "cpu" else microbatches
    step = PhfStep(objective, student.config, tp_group=ps.get_tensor_model_parallel_group(),
                   dp_group=ps.get_data_parallel_group(), student_capture=capture, teacher_capture=capture)
    step.collect_loss_tokens = collect_loss_tokens
    step.prepare(mbs)
    chunks = student.chunks
    model = chunks if len(chunks) > 1 else chunks[0]
    iterators = lambda: [iter(mbs) for _ in chunks] if len(chunks) > 1 else iter(mbs)  # noqa: E731
    fb = get_forward_backward_func()
    b = mbs[0].batch_size

    _sync()
    t0 = time.perf_counter()
    with teacher.weights(), torch.no_grad():
        fb(forward_step_func=step.teacher_forward_step, data_iterator=iterators(), model=model,
           num_microbatches=len(mbs), seq_length=mbs[0].teacher_tokens.shape[1], micro_batch_size=b, forward_only=True)
    _sync()
    t1 = time.perf_counter()
    for chunk in chunks:
        chunk.zero_grad_buffer()
    student.optimizer.zero_grad()
    check = StepCheck(faults)
    logs = fb(forward_step_func=check.wrap(step.student_forward_step), data_iterator=iterators(), model=model,
              num_microbatches=len(mbs), seq_length=step.student_seq_length(mbs[0].student_tokens.shape[1]),
              micro_batch_size=b, forward_only=False)
    check.inject_grads(chunks)
    _sync()
    t2 = time.perf_counter()
    lr = current_lr(student.scheduler)
    # fp16: a gradient overflow is the loss scaler's to find (its skips search the scale)
    nonfinite = check.found(chunks, check_grads=not student.config.fp16)
    if nonfinite is None:
        ok, grad_norm, _ = student.optimizer.step()
    else:  # nothing moves: weights, Adam state and step count, LR schedule, EMA teacher
        ok, grad_norm = False, None
        for chunk in chunks:
            chunk.zero_grad_buffer()
        student.optimizer.zero_grad()
    if ok:
        student.scheduler.step(increment=1)
        teacher.update()
    _sync()
    t3 = time.perf_counter()
    metrics = step.reduce_logs(logs) if ps.is_pipeline_last_stage(ignore_virtual=True) else None
    step.finish()
    metrics = dict(_gather_metrics(metrics))
    metrics.update(grad_norm=float(grad_norm) if grad_norm is not None else float("nan"), lr=lr,
                   update_skipped=not ok, nonfinite=nonfinite, time_teacher_s=t1 - t0, time_student_s=t2 - t1,
                   time_optimizer_s=t3 - t2)
    return metrics
