"""Non-finite steps: found once per step, skipped on every rank, named, and (``loop``) counted.

After the student pass (gradients reduced over DP and finalized by Megatron: TP/SP norm
all-reduces, tied embeddings) and before ``optimizer.step()``, ``StepCheck.found`` asks every
rank two questions: did a loss this rank back-propagated hold a NaN or inf (last pipeline stage:
each micro-batch's loss as the schedule got it), and does a gradient (``main_grad`` of every
trainable parameter, max-abs per tensor) hold one. One all-reduce (MAX) over the world makes all
ranks agree, and one host read decides (the step reads ``grad_norm`` anyway). If anything is
non-finite, ``update.run_update`` skips the update on every rank: no optimizer step (weights,
Adam moments and step count unchanged), no LR-schedule step, no EMA-teacher update, and the
gradient buffers are zeroed. Megatron's optimizer skips by itself only when fp16's loss scaler
finds an overflow, so bf16 and fp32 had no guard. (Under fp16's dynamic loss scale the gradients
are left to that scaler, whose skips are its normal search for a scale; the loss is still checked.
A static scale, ``optimizer.loss_scale``, never moves: its overflows are checked here, as
Megatron keeps --check-for-nan-in-loss-and-grad on for it.)

Only then (the rare path) each rank names what it found, gathered in one object all-gather:
``loss (nan) on rank 1; gradient decoder.layers.0.mlp.linear_fc1.lora_A.weight (inf) on rank 0``.

Fault injection, for tests only: ``PHF_INJECT_NONFINITE`` (read by ``faults_from_env``, once,
when the trainer starts) holds comma-separated ``STEP:WHAT:VALUE[:RANK]`` entries: at the update
that ``metrics.jsonl`` records as ``STEP``, ``WHAT`` = ``loss`` multiplies the first micro-batch's
loss by ``VALUE`` (``nan``, ``inf`` or ``-inf``) before backward, and ``grad`` sets the first entry
of the first trainable parameter's reduced gradient to ``VALUE``; on global rank ``RANK`` only
(default: every rank). A loss fault on a rank without the last pipeline stage does nothing.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..errors import NonFiniteError

ENV_VAR = "PHF_INJECT_NONFINITE"
"""Testing only: the faults to inject (see the module docstring)."""

TARGETS = ("loss", "grad")


@dataclass(frozen=True)
class Fault:
    """One injected NaN/inf (testing only): at ``step`` (as ``metrics.jsonl`` numbers it), into
    ``target`` (``loss`` or ``grad``), on global rank ``rank`` (None: every rank)."""

    step: int
    target: str
    value: float
    rank: int | None = None

    def applies(self) -> bool:
        return self.rank is None or self.rank == (dist.get_rank() if dist.is_initialized() else 0)


def parse_faults(text: str) -> tuple[Fault, ...]:
    """``"2:loss:nan,3:grad:inf:1"`` -> the faults (``ValueError`` naming ``ENV_VAR`` when malformed)."""
    faults = []
    for entry in filter(None, (e.strip() for e in text.split(","))):
        parts = entry.split(":")
        try:
            if len(parts) not in (3, 4) or parts[1] not in TARGETS or math.isfinite(float(parts[2])):
                raise ValueError(entry)
            faults.append(Fault(int(parts[0]), parts[1], float(parts[2]), int(parts[3]) if len(parts) == 4 else None))
        except ValueError:
            raise ValueError(f"{ENV_VAR}: {entry!r} is not STEP:loss|grad:nan|inf|-inf[:RANK]") from None
    return tuple(faults)


def faults_from_env() -> tuple[Fault, ...]:
    """The faults ``PHF_INJECT_NONFINITE`` asks for (testing only; none when unset)."""
    return parse_faults(os.environ.get(ENV_VAR, ""))


def _scalers(optimizer):
    """The loss scalers of a Megatron optimizer, or of each optimizer of a chain."""
    for o in getattr(optimizer, "chained_optimizers", [optimizer]):
        if (s := getattr(o, "grad_scaler", None)) is not None:
            yield s


def grad_scaler(optimizer):
    """The loss scaler of a Megatron optimizer (or of the first of a chain; they share the settings):
    fp16's, or a static ``optimizer.loss_scale``'s; None without one."""
    return next(_scalers(optimizer), None)


def searching_loss_scale(optimizer) -> bool:
    """Whether a Megatron optimizer (or a chain of them) searches a dynamic fp16 loss scale that can still back
    off: its skips on a gradient overflow are that search, not a non-finite step. At ``min_loss_scale`` the
    search is over: an overflow there is a non-finite step (counted, and ``training.max_nonfinite_steps``
    stops the run), where Megatron alone would skip each overflowing step without counting it."""
    from megatron.core.optimizer.grad_scaler import DynamicGradScaler

    scaler = grad_scaler(optimizer)
    return isinstance(scaler, DynamicGradScaler) and float(scaler.scale) > float(scaler.min_scale)


def tell_scaler_overflow(optimizer) -> None:
    """A step skipped here under a dynamic fp16 loss scale (a non-finite loss; any overflow at ``min_loss_scale``,
    where this check finds them) is still an overflow to Megatron's scaler, which never saw it, as it sees the NaN
    gradients such a loss gives: its growth count restarts (the scale grows only after ``loss_scale_window``
    steps without one), its hysteresis count drops, and above the floor the scale backs off, as in Megatron."""
    from megatron.core.optimizer.grad_scaler import DynamicGradScaler

    for s in _scalers(optimizer):
        if isinstance(s, DynamicGradScaler):
            s.update(True)


def _trainable(chunks) -> list[tuple[str, torch.nn.Parameter]]:
    """``(global name, parameter)`` of every trainable parameter of this rank's chunks."""
    from ..convert.live_model import global_name
    from ..models.provider import unwrap

    return [(global_name(chunk, name), p) for chunk in chunks
            for name, p in unwrap(chunk).named_parameters() if p.requires_grad]


def _grad(p: torch.nn.Parameter) -> torch.Tensor | None:
    """The reduced gradient the optimizer reads (Megatron DDP's ``main_grad``, else ``.grad``)."""
    grad = getattr(p, "main_grad", None)
    return grad if grad is not None else p.grad


def _kind(t: torch.Tensor) -> str:
    return "nan" if bool(torch.isnan(t).any()) else "inf"


class StepCheck:
    """The finiteness check of one update (and its injected faults; testing only).

    ``wrap(forward_step_func)`` watches (and, with a loss fault, poisons) the losses of the student
    pass; ``inject_grads(chunks)`` applies grad faults; ``found(chunks, check_grads)`` returns None
    when all is finite on every rank, else what was not, by rank (the same string on every rank).
    """

    def __init__(self, faults=()):
        self.faults = [f for f in faults if f.applies()]
        self._loss_bad: torch.Tensor | None = None  # on the device: no host sync per micro-batch
        self._losses: list[torch.Tensor] = []
        self._microbatches = 0

    def wrap(self, forward_step_func):
        def forward_step(data_iterator, model):
            output, loss_func = forward_step_func(data_iterator, model)
            return output, lambda out: self._watch(loss_func(out))
        return forward_step

    def _watch(self, result):
        loss = result[0]
        if self._microbatches == 0:
            for fault in self.faults:
                if fault.target == "loss":
                    loss = loss * fault.value
        self._microbatches += 1
        bad = ~torch.isfinite(loss.detach()).all()
        self._loss_bad = bad if self._loss_bad is None else self._loss_bad | bad
        self._losses.append(loss.detach())
        return (loss, *result[1:])

    @torch.no_grad()
    def inject_grads(self, chunks) -> None:
        for fault in self.faults:
            if fault.target == "grad":
                _, p = _trainable(chunks)[0]
                _grad(p).view(-1)[0] = fault.value

    def found(self, chunks, check_grads: bool = True) -> str | None:
        """None if every rank's losses and gradients are finite, else what was not (a collective)."""
        params = [p for chunk in chunks for p in chunk.parameters() if p.requires_grad]
        device = params[0].device if params else torch.device("cuda" if torch.cuda.is_available() else "cpu")
        flags = torch.zeros(2, device=device)
        if self._loss_bad is not None:
            flags[0] = self._loss_bad.to(device).float()
        grads = [g for p in params if (g := _grad(p)) is not None] if check_grads else []
        if grads:
            flags[1] = (~torch.isfinite(torch.stack(torch._foreach_norm(grads, float("inf"))))).any().float()
        if dist.is_initialized():
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        if not flags.any():  # the step's one host sync
            return None
        return self._describe(chunks, check_grads)

    def _describe(self, chunks, check_grads: bool) -> str:
        """What this rank found, joined over the ranks (one object all-gather; the rare path)."""
        rank = dist.get_rank() if dist.is_initialized() else 0
        local = []
        bad_losses = [t for t in self._losses if not bool(torch.isfinite(t).all())]
        if bad_losses:
            local.append(f"loss ({_kind(bad_losses[0])}) on rank {rank}")
        if check_grads:
            bad = [(name, g) for name, p in _trainable(chunks) if (g := _grad(p)) is not None and not bool(torch.isfinite(g).all())]
            if bad:
                more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
                local.append(f"gradient {bad[0][0]} ({_kind(bad[0][1])}){more} on rank {rank}")
        found = local
        if dist.is_initialized():
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, local)
            found = [item for items in gathered for item in items]
        return "; ".join(found)


def nonfinite_stop(step: int, consecutive: int, what: str) -> NonFiniteError:
    """The one line that stops the run after ``training.max_nonfinite_steps`` consecutive skips."""
    return NonFiniteError(f"step {step}: {consecutive} consecutive steps with a non-finite loss or gradient "
                          f"(training.max_nonfinite_steps), the last: {what}; each was skipped (no weight, "
                          f"optimizer, LR or EMA change)")
