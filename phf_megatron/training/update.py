"""One PHF update on Megatron-Core (paper Section 3; ``ARCHITECTURE.md``'s data flow):

    teacher forward (teacher weights, privileged prompt, no grad) ─ window rows per layer, logit rows
    student forward + backward (plain prompt)                     ─ L_OPSD + alpha * L_flow
    optimizer step (grad clip), LR schedule step, EMA teacher update

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
               microbatches: list[PhfMicroBatch], objective: ObjectiveConfig, collect_loss_tokens: bool = False) -> dict:
    """Run one update; returns the step's metrics (loss parts, grad norm, lr, per-layer flow, clip
    diagnostics, timings; with ``collect_loss_tokens`` the loss by rollout token, ``loss.LOSS_TOKENS``)."""
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
    logs = fb(forward_step_func=step.student_forward_step, data_iterator=iterators(), model=model,
              num_microbatches=len(mbs), seq_length=step.student_seq_length(mbs[0].student_tokens.shape[1]),
              micro_batch_size=b, forward_only=False)
    _sync()
    t2 = time.perf_counter()
    lr = current_lr(student.scheduler)
    ok, grad_norm, _ = student.optimizer.step()
    if ok:
        student.scheduler.step(increment=1)
        teacher.update()
    _sync()
    t3 = time.perf_counter()
    metrics = step.reduce_logs(logs) if ps.is_pipeline_last_stage(ignore_virtual=True) else None
    step.finish()
    metrics = dict(_gather_metrics(metrics))
    metrics.update(grad_norm=float(grad_norm) if grad_norm is not None else float("nan"), lr=lr,
                   update_skipped=not ok, time_teacher_s=t1 - t0, time_student_s=t2 - t1, time_optimizer_s=t3 - t2)
    return metrics
