"""A training run's checkpoints (``loop.Trainer``'s, through ``TrainerCheckpoints``): what a checkpoint of the run
holds (``_parts``: the LR schedule, the adapters or the model, the method's parts such as the EMA teacher, the
optimizer, the data position, the overlapped mode's prefetched rollouts, every RNG last), its save, and the resume
from the latest one (the step and the non-finite counts come back with it). The saving and loading themselves are
``checkpoint``'s; the parts' kinds ``checkpoint_parts``'s.
"""

from __future__ import annotations

import functools
import os

from ..lora import adapter_parameters
from .checkpoint import META_FILE, iter_dir_name, load_checkpoint, read_latest, save_checkpoint
from .checkpoint_parts import Part, Scope, dist_model_part, optimizer_part, rng_part, stateful_part, tensors_part
from .config_io import resume_fingerprint
from .rollout_async import PART as PREFETCH_PART
from .schedule import load_scheduler_state


def _saved_parts(load_dir: str) -> dict:
    """The parts of the checkpoint a resume reads (its ``meta.json``)."""
    from ..input_files import read_json

    return read_json(os.path.join(load_dir, iter_dir_name(read_latest(load_dir)), META_FILE)).get("parts", {})


class TrainerCheckpoints:
    """The checkpoints of ``loop.Trainer`` (its base): reads the trainer's ``cfg``, ``student``, ``method``,
    ``sampler``, ``layout``, ``prefetch`` and ``step``; a resume sets ``step`` and the non-finite counts."""

    def _parts(self) -> dict:
        sched = self.student.scheduler
        parts = {  # the scheduler's load checks the schedule (one line) before the optimizer's, which in
            # Megatron 0.19 (distributed optimizer) fails with a bare KeyError on another max_lr / min_lr; so do
            # the adapters and the teacher their names and shapes (another model: a bare ValueError of torch's)
            "scheduler": Part(Scope.GLOBAL, sched.state_dict, functools.partial(load_scheduler_state, sched)),
            **({"adapters": tensors_part(dict(p for c in self.student.chunks for p in adapter_parameters(c)))}
               if self.cfg.lora.enabled else {}),
            **self.method.parts(),
            "optimizer": optimizer_part(self.student.optimizer),
            "data": stateful_part(self.sampler, Scope.GLOBAL),
            "rng": rng_part(),
        }
        if not self.cfg.lora.enabled:
            for i, chunk in enumerate(self.student.chunks):
                parts[f"model{i}"] = dist_model_part(chunk.module)
        if self.prefetch is not None:
            parts[PREFETCH_PART] = self.prefetch.part()
        parts["rng"] = parts.pop("rng")  # restored last
        return parts

    def save(self) -> str:
        self.phase = f"saving step {self.step}"
        if self.prefetch is not None:
            self.prefetch.prepare_checkpoint(self.step)  # a collective: the hosts' prefetched rollouts
        return save_checkpoint(self.cfg.save_dir, self.step, self._parts(), self.layout,
                               fingerprint=resume_fingerprint(self.cfg), keep_last=self.cfg.checkpoint.keep_last,
                               extra={"samples_seen": self.step * self.cfg.training.global_batch_size,
                                      "nonfinite_steps": self.nonfinite_steps, "nonfinite_run": self.nonfinite_run})

    def _maybe_resume(self) -> str | None:
        load_dir = self.cfg.load_dir
        if not load_dir or read_latest(load_dir) is None:
            return None
        parts = self._parts()
        if self.cfg.checkpoint.no_load_optim:
            parts.pop("optimizer")
        if self.cfg.checkpoint.no_load_rng:
            parts.pop("rng")
        if PREFETCH_PART in parts and PREFETCH_PART not in _saved_parts(load_dir):
            parts.pop(PREFETCH_PART)  # saved on-policy: the first resumed step samples afresh
        info = load_checkpoint(load_dir, parts, self.layout,
                               fingerprint=resume_fingerprint(self.cfg) if self.cfg.checkpoint.strict_config else None)
        if "optimizer" not in parts:  # its fp32 main parameters (bf16) were copied from the weights before the
            self.student.optimizer.reload_model_params()  # load: else the first update writes them back over it
        self.step = info.iteration
        extra = info.meta.get("extra", {})
        self.nonfinite_steps, self.nonfinite_run = extra.get("nonfinite_steps", 0), extra.get("nonfinite_run", 0)
        return info.path

    def _save_last(self) -> None:
        """Save the step the run ends at, unless ``checkpoint.save_interval`` just did."""
        interval = self.cfg.checkpoint.save_interval
        if not (interval and self.step % interval == 0):
            self.save()
