"""One micro-batch of a PHF step: student and teacher sequences sharing the same rollout tokens.

The student sees ``[chat(problem) ; y]``, the teacher ``[chat(problem + reference) ; y]``: the
same rollout tokens y after prompts of different lengths. Two index sets tie them together:

* OPSD scores every rollout token y_j: the logits that predict it sit one position before it,
  ``pos(y_j) - 1``, in each sequence (``score_index``, flattened ``b * T + t``);
* the flow window W picks at most ``window_budget`` rollout tokens per sample with
  ``objectives.select_window``; the same rollout ordinals in both sequences (``*_window``).

Sequences are right-padded (samples start at position 0; causal attention ignores padding).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..objectives.checks import check_prefix_mask
from ..objectives.window import DEFAULT_WINDOW_BUDGET, select_window
from .collectives import all_reduce_
from .window_rows import check_positions


def _check_tokens_and_mask(name: str, tokens: torch.Tensor, response: torch.Tensor) -> None:
    if tokens.dim() != 2 or tokens.dtype != torch.long:
        raise ValueError(f"{name}_tokens: expected a [B, T] long tensor, got {tokens.dtype} {tuple(tokens.shape)}")
    if response.shape != tokens.shape or response.dtype != torch.bool:
        raise ValueError(
            f"{name}_response: expected a bool tensor of shape {tuple(tokens.shape)}, got {response.dtype} {tuple(response.shape)}"
        )
    if bool(response[:, 0].any()):
        b = int(response[:, 0].nonzero()[0])
        raise ValueError(f"{name}_response: sample {b} has a rollout token at position 0; no prompt token predicts it")


def _ordinals(response: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    """Rollout ordinal (0-based) of each window position; -1 where it is not a rollout token."""
    ordinal = response.long().cumsum(1) - 1
    picked = ordinal.gather(1, window)
    return torch.where(response.gather(1, window), picked, torch.full_like(picked, -1))


@dataclass
class PhfMicroBatch:
    """Tensors of one micro-batch (right-padded), validated on construction.

    Pass ``student_window``/``teacher_window``/``window_valid`` to choose the window yourself;
    otherwise it is ``select_window`` over the rollout tokens with ``window_budget``.
    """

    student_tokens: torch.Tensor
    """``[B, Ts]`` long: chat(problem) ; y ; padding."""
    teacher_tokens: torch.Tensor
    """``[B, Tt]`` long: chat(problem + reference) ; y ; padding."""
    student_response: torch.Tensor
    """``[B, Ts]`` bool: True on the rollout tokens y."""
    teacher_response: torch.Tensor
    """``[B, Tt]`` bool: True on the same rollout tokens in the teacher sequence."""
    window_budget: int = DEFAULT_WINDOW_BUDGET
    student_window: torch.Tensor | None = None
    """``[B, m]`` long positions into the student sequence (default: derived)."""
    teacher_window: torch.Tensor | None = None
    window_valid: torch.Tensor | None = None
    """``[B, m]`` bool, a True prefix per sample: the real window entries."""
    teacher_out: dict = field(default_factory=dict, repr=False)
    """Filled by the teacher pass: captured rows per stage, teacher logit rows on the last stage."""

    def __post_init__(self) -> None:
        _check_tokens_and_mask("student", self.student_tokens, self.student_response)
        _check_tokens_and_mask("teacher", self.teacher_tokens, self.teacher_response)
        if self.student_tokens.shape[0] != self.teacher_tokens.shape[0]:
            raise ValueError(
                f"teacher_tokens: batch {self.teacher_tokens.shape[0]} != student batch {self.student_tokens.shape[0]}"
            )
        n_s, n_t = self.student_response.sum(1), self.teacher_response.sum(1)
        if not torch.equal(n_s, n_t):
            b = int((n_s != n_t).nonzero()[0])
            raise ValueError(
                f"teacher_response: rollout lengths disagree for sample {b}: student has {int(n_s[b])} rollout "
                f"tokens, teacher has {int(n_t[b])}; both sequences must end in the same rollout y"
            )
        y_s, y_t = self.student_tokens[self.student_response], self.teacher_tokens[self.teacher_response]
        if not torch.equal(y_s, y_t):
            k = int((y_s != y_t).nonzero()[0])
            b = int(torch.searchsorted(n_s.cumsum(0), torch.tensor(k, device=n_s.device), right=True))
            raise ValueError(f"teacher_tokens: the rollout tokens of sample {b} differ from the student's")
        self._init_window()
        self._init_derived()

    def _init_window(self) -> None:
        given = [x is not None for x in (self.student_window, self.teacher_window, self.window_valid)]
        if any(given) and not all(given):
            raise ValueError("student_window/teacher_window/window_valid: give all three or none")
        if not any(given):
            self.student_window, self.window_valid = select_window(self.student_response, self.window_budget)
            self.teacher_window, _ = select_window(self.teacher_response, self.window_budget)
            return
        check_positions("student_window", self.student_window, self.student_tokens.shape[1])
        check_positions("teacher_window", self.teacher_window, self.teacher_tokens.shape[1])
        if self.teacher_window.shape != self.student_window.shape or self.window_valid.shape != self.student_window.shape:
            raise ValueError(
                f"teacher_window/window_valid: shapes {tuple(self.teacher_window.shape)}/{tuple(self.window_valid.shape)} "
                f"must equal student_window's {tuple(self.student_window.shape)}"
            )
        check_prefix_mask("window_valid", self.window_valid)
        o_s = _ordinals(self.student_response, self.student_window)
        o_t = _ordinals(self.teacher_response, self.teacher_window)
        bad = self.window_valid & ((o_s < 0) | (o_s != o_t))
        if bool(bad.any()):
            b, i = (int(x) for x in bad.nonzero()[0])
            raise ValueError(
                f"teacher_window: entry {i} of sample {b} does not index the same rollout token in both sequences "
                f"(student ordinal {int(o_s[b, i])}, teacher ordinal {int(o_t[b, i])})"
            )

    def to(self, device) -> "PhfMicroBatch":
        """The same micro-batch with every tensor on ``device`` (validated again; no teacher outputs)."""
        moved = {k: getattr(self, k).to(device) for k in ("student_tokens", "teacher_tokens", "student_response",
                                                          "teacher_response", "student_window", "teacher_window",
                                                          "window_valid")}
        return PhfMicroBatch(window_budget=self.window_budget, **moved)

    @property
    def batch_size(self) -> int:
        return self.student_tokens.shape[0]

    @staticmethod
    def score_index(response: torch.Tensor) -> torch.Tensor:
        """Flat ``b * T + t`` of the logits predicting each rollout token (``t = pos - 1``), sample-major."""
        b, t = response.nonzero(as_tuple=True)
        return b * response.shape[1] + t - 1

    def _init_derived(self) -> None:
        """Index sets and counts, computed once here (host syncs belong to batch building, not the step).

        ``student/teacher_score_index [N]``: logits rows scoring the N rollout tokens (OPSD);
        ``score_tokens [N]``: the rollout token each of them predicts (the sampled-token loss and
        the loss-by-token diagnostics); ``num_tokens``: N; ``flow_sample_mask [B]``: True where the window has ``m_b >= 2``
        entries (a sample with fewer contributes 0 to the flow); ``num_flow_samples``: its count.
        """
        self.student_score_index = self.score_index(self.student_response)
        self.teacher_score_index = self.score_index(self.teacher_response)
        self.score_tokens = self.student_tokens.reshape(-1)[self.student_score_index + 1]
        self.num_tokens = int(self.student_score_index.numel())
        self.flow_sample_mask = self.window_valid.sum(1) >= 2
        self.num_flow_samples = int(self.flow_sample_mask.sum())


@dataclass(frozen=True)
class StepNormalizers:
    """Global counts of one optimizer step (all micro-batches, all data-parallel ranks)."""

    num_tokens: int
    """Rollout tokens scored by OPSD: the divisor of L_OPSD."""
    num_flow_samples: int
    """Samples with ``m_b >= 2``: the divisor of L_flow's batch mean."""


def step_normalizers(microbatches: list[PhfMicroBatch], dp_group: dist.ProcessGroup | None) -> StepNormalizers:
    """Sum the counts over this rank's micro-batches and all-reduce them over data parallelism."""
    counts = torch.tensor(
        [sum(mb.num_tokens for mb in microbatches), sum(mb.num_flow_samples for mb in microbatches)],
        dtype=torch.float64, device="cuda" if torch.cuda.is_available() else "cpu",  # NCCL needs a device tensor
    )
    all_reduce_(counts, dp_group)
    return StepNormalizers(int(counts[0]), int(counts[1]))
