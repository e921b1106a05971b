"""One micro-batch of a PHF step: student and teacher sequences sharing the same rollout tokens.

The student sees ``[chat(problem) ; y]``, the teacher ``[chat(problem + reference) ; y]``: the
same rollout tokens y after prompts of different lengths. Two index sets tie them together:

* OPSD scores every rollout token y_j: the logits that predict it sit one position before it,
  ``pos(y_j) - 1``, in each sequence (``score_index``, flattened ``b * T + t``);
* the flow window W picks at most ``window_budget`` rollout tokens per sample with
  ``objectives.select_window``; the same rollout ordinals in both sequences (``*_window``).

Where the samples sit in the activation is each side's ``SequenceLayout`` (``parallel.layout``):
right-padded rows (the default: samples start at position 0; causal attention ignores padding), or
packed into one row (``PhfMicroBatch.packed``, ``training.packing``). Every index above is an index
into the activation (flat ``column·S + start + t``), so the passes, the capture and the loss have no
packed branch; the window is chosen per sample and mapped through each side's layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..objectives.checks import check_prefix_mask
from ..objectives.window import DEFAULT_WINDOW_BUDGET, select_window
from .collectives import all_reduce_
from .layout import SequenceLayout
from .window_rows import check_positions


def _side_layout(name: str, tokens: torch.Tensor, response: torch.Tensor,
                 layout: SequenceLayout | None) -> tuple[SequenceLayout, torch.Tensor]:
    """The side's layout (default: right-padded rows), its tokens and rollout mask checked against it, and
    each sample's rollout-token count ``[B]``."""
    if tokens.dim() != 2 or tokens.dtype != torch.long:
        raise ValueError(f"{name}_tokens: expected a [B, T] long tensor, got {tokens.dtype} {tuple(tokens.shape)}")
    if response.shape != tokens.shape or response.dtype != torch.bool:
        raise ValueError(
            f"{name}_response: expected a bool tensor of shape {tuple(tokens.shape)}, got {response.dtype} {tuple(response.shape)}"
        )
    layout = layout or SequenceLayout.pad(tokens)
    if layout.tokens is not tokens and not torch.equal(layout.tokens, tokens):
        raise ValueError(f"{name}_tokens: must be the {name}_layout's tokens")
    ids = layout.sample_ids()
    first = response & layout.sequence_starts()
    if bool(first.any()):
        b = int(ids[first][0])
        raise ValueError(f"{name}_response: sample {b} has a rollout token at position 0; no prompt token predicts it")
    if bool((response & (ids < 0)).any()):
        raise ValueError(f"{name}_response: a rollout token outside every sample (on the layout's padding)")
    return layout, torch.bincount(ids[response], minlength=layout.num_sequences)


def _ordinals(response: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    """Rollout ordinal (0-based) of each window position; -1 where it is not a rollout token."""
    ordinal = response.long().cumsum(1) - 1
    picked = ordinal.gather(1, window)
    return torch.where(response.gather(1, window), picked, torch.full_like(picked, -1))


def _sample_window(layout: SequenceLayout, window: torch.Tensor) -> torch.Tensor:
    """Activation window positions ``[B, m]`` as positions into each sample (-1 outside it)."""
    local = window - layout.start[:, None].to(window.device)
    inside = (local >= 0) & (local < layout.lengths[:, None].to(window.device))
    return torch.where(inside, local, torch.full_like(local, -1))


@dataclass
class PhfMicroBatch:
    """Tensors of one micro-batch, validated on construction (module docstring).

    Pass ``student_window``/``teacher_window``/``window_valid`` to choose the window yourself;
    otherwise it is ``select_window`` over each sample's rollout tokens with ``window_budget``.
    ``student_layout``/``teacher_layout``: where the samples sit in the activation (default:
    right-padded rows, ``SequenceLayout.pad``); ``PhfMicroBatch.packed`` builds the packed one.
    """

    student_tokens: torch.Tensor
    """``[b_act, Ts]`` long, the activation: chat(problem) ; y per sample, then padding."""
    teacher_tokens: torch.Tensor
    """``[b_act, Tt]`` long: chat(problem + reference) ; y per sample, then padding."""
    student_response: torch.Tensor
    """``[b_act, Ts]`` bool: True on the rollout tokens y."""
    teacher_response: torch.Tensor
    """``[b_act, Tt]`` bool: True on the same rollout tokens in the teacher sequence."""
    window_budget: int = DEFAULT_WINDOW_BUDGET
    student_window: torch.Tensor | None = None
    """``[B, m]`` long positions into the student activation row of each sample (default: derived)."""
    teacher_window: torch.Tensor | None = None
    window_valid: torch.Tensor | None = None
    """``[B, m]`` bool, a True prefix per sample: the real window entries."""
    teacher_out: dict = field(default_factory=dict, repr=False)
    """Filled by the teacher pass: captured rows per stage, teacher logit rows on the last stage."""
    student_layout: SequenceLayout | None = None
    teacher_layout: SequenceLayout | None = None

    def __post_init__(self) -> None:
        self.student_layout, n_s = _side_layout("student", self.student_tokens, self.student_response,
                                                self.student_layout)
        self.teacher_layout, n_t = _side_layout("teacher", self.teacher_tokens, self.teacher_response,
                                                self.teacher_layout)
        b = self.student_layout.num_sequences
        if self.teacher_layout.num_sequences != b:
            raise ValueError(f"teacher_tokens: batch {self.teacher_layout.num_sequences} != student batch {b}")
        if not torch.equal(n_s, n_t):
            k = int((n_s != n_t).nonzero()[0])
            raise ValueError(
                f"teacher_response: rollout lengths disagree for sample {k}: student has {int(n_s[k])} rollout "
                f"tokens, teacher has {int(n_t[k])}; both sequences must end in the same rollout y"
            )
        y_s, y_t = self.student_tokens[self.student_response], self.teacher_tokens[self.teacher_response]
        if not torch.equal(y_s, y_t):
            k = int((y_s != y_t).nonzero()[0])
            k = int(torch.searchsorted(n_s.cumsum(0), torch.tensor(k, device=n_s.device), right=True))
            raise ValueError(f"teacher_tokens: the rollout tokens of sample {k} differ from the student's")
        self._init_window()
        self._init_derived()

    @classmethod
    def packed(cls, student_tokens: torch.Tensor, teacher_tokens: torch.Tensor, student_response: torch.Tensor,
               teacher_response: torch.Tensor, student_lengths: torch.Tensor, teacher_lengths: torch.Tensor, *,
               window_budget: int = DEFAULT_WINDOW_BUDGET, pad_multiple: int = 1, pad_id: int = 0,
               student_total: int | None = None, teacher_total: int | None = None) -> "PhfMicroBatch":
        """Right-padded per-sample ``[B, T]`` tokens and rollout masks of each side with their lengths ``[B]``,
        each side packed into one row (``SequenceLayout.pack``: a multiple of ``pad_multiple``, or ``*_total``)."""
        s = SequenceLayout.pack(student_tokens, student_lengths, pad_multiple, pad_id, student_total)
        t = SequenceLayout.pack(teacher_tokens, teacher_lengths, pad_multiple, pad_id, teacher_total)
        return cls(s.tokens, t.tokens, s.place(student_response, False), t.place(teacher_response, False),
                   window_budget, student_layout=s, teacher_layout=t)

    def _init_window(self) -> None:
        given = [x is not None for x in (self.student_window, self.teacher_window, self.window_valid)]
        if any(given) and not all(given):
            raise ValueError("student_window/teacher_window/window_valid: give all three or none")
        s_resp = self.student_layout.take(self.student_response, False)
        t_resp = self.teacher_layout.take(self.teacher_response, False)
        if not any(given):  # per sample, then into each side's activation row
            s_win, self.window_valid = select_window(s_resp, self.window_budget)
            t_win, _ = select_window(t_resp, self.window_budget)
            self.student_window = s_win + self.student_layout.start[:, None]
            self.teacher_window = t_win + self.teacher_layout.start[:, None]
            return
        check_positions("student_window", self.student_window, self.student_tokens.shape[1])
        check_positions("teacher_window", self.teacher_window, self.teacher_tokens.shape[1])
        if self.teacher_window.shape != self.student_window.shape or self.window_valid.shape != self.student_window.shape:
            raise ValueError(
                f"teacher_window/window_valid: shapes {tuple(self.teacher_window.shape)}/{tuple(self.window_valid.shape)} "
                f"must equal student_window's {tuple(self.student_window.shape)}"
            )
        if self.student_window.shape[0] != self.student_layout.num_sequences:
            raise ValueError(f"student_window: {self.student_window.shape[0]} rows for "
                             f"{self.student_layout.num_sequences} samples")
        check_prefix_mask("window_valid", self.window_valid)
        s_local = _sample_window(self.student_layout, self.student_window)
        t_local = _sample_window(self.teacher_layout, self.teacher_window)
        o_s = _ordinals(s_resp, s_local.clamp(min=0))
        o_t = _ordinals(t_resp, t_local.clamp(min=0))
        bad = self.window_valid & ((s_local < 0) | (t_local < 0) | (o_s < 0) | (o_s != o_t))
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
                                                          "window_valid", "student_layout", "teacher_layout")}
        return PhfMicroBatch(window_budget=self.window_budget, **moved)

    @property
    def batch_size(self) -> int:
        """Activation rows (the schedule's ``micro_batch_size``: 1 when packed)."""
        return self.student_tokens.shape[0]

    @property
    def num_sequences(self) -> int:
        """Samples (``B``): the rows of the window, the flow share and the per-sample values."""
        return self.student_layout.num_sequences

    @staticmethod
    def score_index(response: torch.Tensor) -> torch.Tensor:
        """Flat ``column·S + t`` of the logits predicting each rollout token (``t = pos - 1``), sample-major."""
        return response.reshape(-1).nonzero().squeeze(1) - 1

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
