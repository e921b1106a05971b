"""One update on Megatron-Core, driven by the run's method (``training.methods``; ``ARCHITECTURE.md``'s data flow):

    scoring passes (forward only, each under its weights, no grad) ─ PHF: the teacher (window rows, logit rows)
    student forward + backward                                      ─ PHF: L_OPSD + alpha * L_flow; SFT: cross-entropy
    finiteness check (every rank agrees)                            ─ ``nonfinite.StepCheck``
    optimizer step (grad clip), LR schedule step, the method's after-step (PHF: the EMA teacher)
                                                                    ─ all skipped on a NaN/inf

Every pass runs through Megatron's ``forward_backward_func`` (any TP/SP/PP/VPP/DP layout, the
step's micro-batches); the method's step object (``parallel.PhfStep``, ``parallel.SftStep``)
supplies the forward-step and loss functions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, ContextManager

import torch
import torch.distributed as dist

from .model_setup import StudentModel
from .nonfinite import Fault, StepCheck, grad_scaler, searching_loss_scale, tell_scaler_overflow
from .schedule import current_lr


@dataclass(frozen=True)
class ScoringPass:
    """One forward-only pass over the step's micro-batches before the student's, under ``weights()``
    and without autograd; what it keeps stays on the micro-batch objects. Its seconds are the
    metric ``time_key`` (PHF's teacher: ``time_teacher_s``)."""

    time_key: str
    weights: Callable[[], ContextManager]
    forward_step: Callable
    seq_length: int


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _gather_metrics(metrics: dict | None) -> dict:
    """The last pipeline stage's metrics, on every rank (one small object all-gather)."""
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, metrics)
    return next((m for m in gathered if m is not None), {})


def run_update(student: StudentModel, method, microbatches: list, collect_loss_tokens: bool = False,
               faults: tuple[Fault, ...] = ()) -> dict:
    """Run one update of ``method`` (a ``training.methods.Method``); returns the step's metrics (the
    method's loss metrics, grad norm, lr, timings: each scoring pass's ``time_key``; with
    ``collect_loss_tokens`` the loss by token, ``loss.LOSS_TOKENS``).

    A NaN or inf in a loss or a gradient on any rank skips the update on every rank (``nonfinite``):
    ``update_skipped`` is then True and ``nonfinite`` says what was not finite (else None).
    ``faults``: NaN/inf to inject into this update (testing only, ``nonfinite.Fault``).
    """
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func

    device = next(p for c in student.chunks for p in c.parameters()).device
    # a micro-batch already there is used as it is (GRPO's round keeps what its scoring passes left on them)
    mbs = [mb if mb.student_tokens.device == device else mb.to(device) for mb in microbatches]
    step = method.step(student)
    step.collect_loss_tokens = collect_loss_tokens
    step.prepare(mbs)
    chunks = student.chunks
    model = chunks if len(chunks) > 1 else chunks[0]
    iterators = lambda: [iter(mbs) for _ in chunks] if len(chunks) > 1 else iter(mbs)  # noqa: E731
    fb = get_forward_backward_func()
    b = mbs[0].batch_size

    timings = {}
    for scoring in method.passes(step, mbs):
        _sync()
        t0 = time.perf_counter()
        with scoring.weights(), torch.no_grad():
            fb(forward_step_func=scoring.forward_step, data_iterator=iterators(), model=model,
               num_microbatches=len(mbs), seq_length=scoring.seq_length, micro_batch_size=b, forward_only=True)
        _sync()
        timings[scoring.time_key] = time.perf_counter() - t0
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
    # fp16's dynamic loss scale above its floor: a gradient overflow is its scaler's to find (its skips search the scale)
    nonfinite = check.found(chunks, check_grads=not searching_loss_scale(student.optimizer))
    if nonfinite is None:
        ok, grad_norm, _ = student.optimizer.step()
    else:  # nothing moves: weights, Adam state and step count, LR schedule, EMA teacher
        ok, grad_norm = False, None
        tell_scaler_overflow(student.optimizer)  # a dynamic scale's scaler counts it, as Megatron's would
        for chunk in chunks:
            chunk.zero_grad_buffer()
        student.optimizer.zero_grad()
    if ok:
        student.scheduler.step(increment=1)
        method.after_step()
    _sync()
    t3 = time.perf_counter()
    metrics = step.reduce_logs(logs) if ps.is_pipeline_last_stage(ignore_virtual=True) else None
    step.finish()
    metrics = dict(_gather_metrics(metrics))
    metrics.update(grad_norm=float(grad_norm) if grad_norm is not None else float("nan"), lr=lr,
                   update_skipped=not ok, nonfinite=nonfinite, **timings, time_student_s=t2 - t1,
                   time_optimizer_s=t3 - t2)
    if (scaler := grad_scaler(student.optimizer)) is not None:  # as Megatron logs it: after this step's update
        metrics["loss_scale"] = float(scaler.scale)
    return metrics
