"""The privileged teacher's weights (paper Section 3.4): EMA (paper), fixed, or dynamic.

The teacher is the same network as the student, run on the privileged prompt. Which weights
it uses is a swap of the trainable tensors around its forward pass:

* ``ema``: an fp32 EMA of the trainable tensors, ``theta_bar_k = rho theta_bar_{k-1} + (1-rho) theta_k``.
  With LoRA only the adapters are averaged: the frozen base is shared, so the teacher costs no
  second copy of the model. In a bf16 run the teacher's forward uses the fp32 average rounded to
  bf16: LoRA's B (from 0) carries it to bf16's relative precision, but a weight that starts on the
  bf16 grid (LoRA's A; every weight under full fine-tuning) keeps its initial value until the
  average has moved half a bf16 spacing (~2^-9 |w|): ~150 steps for |w| = 0.02 at lr 5e-6 even
  if Adam moves it the same way every step. With LoRA the lag enters the teacher only as
  B (A_bar - A_0), second order; under full fine-tuning in bf16 the teacher lags the EMA.
  Where it starts (``teacher.ema_start``):

  - ``initial`` (the PHF paper): ``theta_bar_0 = theta_0``, the student's initial values;
  - ``after_first_step`` (the official OPSD code, commit ``7448751``, ``opsd_trainer.py``): the
    EMA state is empty until the first optimizer step (line 193), the teacher forward then uses
    the current student (lines 571-573: at step 0 that is ``theta_0``, as here), and the first
    update after an optimizer step copies the student instead of averaging (lines 531-544, called
    from ``EMAUpdateCallback.on_step_end``, lines 84-93): ``theta_bar_1 = theta_1``, then the same
    recursion. The two starts differ by ``rho^k (theta_0 - theta_1)`` after k steps.
* ``fixed``: the initial policy. With LoRA the adapters are switched off (the official OPSD
  ``--fixed_teacher``); with full fine-tuning a frozen copy of the initial weights is kept.
* ``dynamic``: the current student, unchanged.

The swap copies values in place (``param.copy_``), so parameters that are views into Megatron's
contiguous DDP buffers stay views.
"""

from __future__ import annotations

import contextlib
from typing import Iterable

import torch

from ..lora import adapters_off
from ..objectives import ema_update
from .checkpoint_parts import PartMismatch
from .config_sections import EMA_STARTS, TEACHER_MODES


class PrivilegedTeacher:
    def __init__(self, model_chunks: Iterable[torch.nn.Module], mode: str = "ema", decay: float = 0.999,
                 lora: bool = True, ema_start: str = "initial"):
        if mode not in TEACHER_MODES:
            raise ValueError(f"teacher.mode: {mode!r} is not one of {TEACHER_MODES}")
        if ema_start not in EMA_STARTS:
            raise ValueError(f"teacher.ema_start: {ema_start!r} is not one of {EMA_STARTS}")
        self.model_chunks = list(model_chunks)
        self.mode, self.decay, self.lora, self.ema_start = mode, decay, lora, ema_start
        self.started = ema_start == "initial"
        """False until the first update of an ``after_first_step`` EMA (which copies instead of averaging).
        Until then the shadow holds theta_0, which is the student's value at step 0."""
        self.params = [p for chunk in self.model_chunks for p in chunk.parameters() if p.requires_grad]
        keep_copy = mode == "ema" or (mode == "fixed" and not lora)
        self.shadow = [p.detach().float().clone() for p in self.params] if keep_copy else []

    @torch.no_grad()
    def update(self) -> None:
        """After each optimizer step: the EMA update (a no-op for fixed/dynamic teachers); the
        first one copies the student when ``ema_start`` is ``after_first_step``."""
        if self.mode != "ema":
            return
        if not self.started:
            for s, p in zip(self.shadow, self.params):
                s.copy_(p.detach())
            self.started = True
            return
        ema_update(self.shadow, self.params, self.decay)

    @contextlib.contextmanager
    def weights(self):
        """Run the enclosed forward with the teacher's weights; the student's are restored after."""
        if self.mode == "dynamic":
            yield
            return
        if self.mode == "fixed" and self.lora:
            with adapters_off(self.model_chunks):
                yield
            return
        with torch.no_grad():
            saved = [p.detach().clone() for p in self.params]
            for p, s in zip(self.params, self.shadow):
                p.copy_(s)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, s in zip(self.params, saved):
                    p.copy_(s)

    def state_dict(self) -> dict:
        return {"mode": self.mode, "decay": self.decay, "ema_start": self.ema_start, "started": self.started,
                "shadow": [s.clone() for s in self.shadow]}

    def load_state_dict(self, state: dict) -> None:
        """Checks everything (``PartMismatch``: the checkpoint names the file) before it copies anything;
        a shape is compared, not broadcast (a rank-1 adapter would fill a rank-8 one)."""
        if state["mode"] != self.mode:
            raise PartMismatch(f"teacher.mode: checkpoint has {state['mode']!r}, config asks for {self.mode!r}")
        saved_start = state.get("ema_start", "initial")  # checkpoints before the option started at theta_0
        if saved_start != self.ema_start:
            raise PartMismatch(f"teacher.ema_start: checkpoint has {saved_start!r}, config asks for {self.ema_start!r}")
        if len(state["shadow"]) != len(self.shadow):
            raise PartMismatch(f"teacher: checkpoint holds {len(state['shadow'])} tensors, model has {len(self.shadow)}")
        for i, (s, loaded) in enumerate(zip(self.shadow, state["shadow"])):
            if loaded.shape != s.shape:
                raise PartMismatch(f"teacher tensor {i}: shape {tuple(loaded.shape)} in the checkpoint, "
                                   f"{tuple(s.shape)} in the model")
        self.started = bool(state.get("started", True))
        for s, loaded in zip(self.shadow, state["shadow"]):
            s.copy_(loaded)
