"""The distillation batch: student ``[prompt_S ; y]`` and teacher ``[prompt_T ; y]``, same ``y``.

Everything is token ids: each prompt is tokenized on its own, the rollout ``y`` is the ids the
rollout engine sampled after the student's prompt ids, and the sequences are id concatenations.
Nothing is ever re-tokenized from text, so no BPE merge can cross the prompt/rollout boundary.

Index conventions, for sample ``b`` with rollout ``y_0 .. y_{n_b - 1}`` (0-based ``t``) and
``s_b`` / ``u_b`` the student / teacher prompt lengths (right padding, positions ``0..L-1``):

* ``y_t`` sits at ``s_b + t`` in the student sequence and at ``u_b + t`` in the teacher's
  (``kind="token"``);
* the logits that predict ``y_t`` are at ``s_b + t - 1`` and ``u_b + t - 1`` (``kind="logit"``),
  so ``gather_response(student_logits, "student")[b, t]`` and
  ``gather_response(teacher_logits, "teacher")[b, t]`` are both distributions over ``y_t`` —
  the aligned ``[B, T, V]`` pair ``opsd_loss`` takes, with ``response_mask`` as its mask.

The flow window (``phf_megatron.objectives.select_window(batch.response_mask)``) indexes the
rollout axis ``t``; :meth:`DistillBatch.to_absolute` maps it to sequence positions on either side
(``kind="token"``: the residual stream at ``y_t`` itself, the paper's "hidden state at rollout
position t"; ``kind="logit"``: the state that predicts ``y_t``). Padding entries (``t >= n_b``) map to an in-range position of the same row and are masked out.

Scored tokens (``response_mask``): every rollout token except those equal to the tokenizer's pad
id, as in the official trainer, which sets ``labels[labels == pad_token_id] = -100`` over the
whole sequence (OPSD 7448751 ``opsd_trainer.py`` lines 1411-1417; the loss masks with
``labels != -100``). For Qwen3 the pad token is ``<|endoftext|>`` (151643), one of the model's
two EOS ids, so a rollout that stops on it does not score that token; ``<|im_end|>`` (151645)
is scored. The rule is meant to skip padding, but it also drops a genuine ``<|endoftext|>``:
we follow it so that the loss averages over the same tokens. The unscored tokens stay in the
sequences (the official code keeps them too, attention-masked; as they can only end a rollout,
no scored token sees them). ``response_lengths`` counts every rollout token, scored or not; GRPO scores
them all (``sampled_mask``), as TRL 0.26's ``GRPOTrainer`` does.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Sequence

import torch

SIDES = ("student", "teacher")
KINDS = ("token", "logit")
IGNORE_INDEX = -100


@dataclass
class DistillBatch:
    """Right-padded id tensors; shapes ``[B, L_s]``, ``[B, L_t]``, ``[B, T]``, ``[B]``."""

    student_input_ids: torch.Tensor
    student_attention_mask: torch.Tensor
    teacher_input_ids: torch.Tensor
    teacher_attention_mask: torch.Tensor
    student_response_start: torch.Tensor
    teacher_response_start: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    """``[B, T]`` bool: the scored rollout tokens (all but the pad id; see the module docstring)."""
    response_lengths: torch.Tensor
    """``[B]`` long: rollout tokens per sample, scored or not."""

    def to(self, device) -> "DistillBatch":
        return DistillBatch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    def input_ids(self, side: str) -> torch.Tensor:
        return self.student_input_ids if _check_side(side) == "student" else self.teacher_input_ids

    def attention_mask(self, side: str) -> torch.Tensor:
        return self.student_attention_mask if _check_side(side) == "student" else self.teacher_attention_mask

    def response_start(self, side: str) -> torch.Tensor:
        """``[B]`` long: the position of ``y_0`` in that side's sequence."""
        return self.student_response_start if _check_side(side) == "student" else self.teacher_response_start

    def to_absolute(self, rollout_index: torch.Tensor, side: str, kind: str = "token") -> torch.Tensor:
        """Map ``[B, m]`` rollout indices ``t`` to positions in that side's sequence.

        ``kind="token"``: where ``y_t`` sits (``start + t``); ``kind="logit"``: the position whose
        output predicts ``y_t`` (``start + t - 1``). Indices past a row's rollout are clamped to
        its last token (the last prompt token for an empty rollout), so the result always
        indexes a real (unpadded) token of the row.
        """
        if kind not in KINDS:
            raise ValueError(f"kind: expected one of {KINDS}, got {kind!r}")
        if rollout_index.dim() != 2 or rollout_index.shape[0] != self.response_ids.shape[0]:
            raise ValueError(f"rollout_index: expected [B={self.response_ids.shape[0]}, m], "
                             f"got shape {tuple(rollout_index.shape)}")
        last = (self.response_lengths - 1).unsqueeze(1)  # -1 for an empty rollout
        t = torch.minimum(rollout_index.to(torch.long), last)
        shift = 0 if kind == "token" else -1
        return (self.response_start(side).unsqueeze(1) + t + shift).clamp(min=0)

    def response_positions(self, side: str, kind: str = "logit") -> torch.Tensor:
        """``[B, T]``: :meth:`to_absolute` of every rollout index ``t``."""
        b, t = self.response_ids.shape
        return self.to_absolute(torch.arange(t).expand(b, t), side, kind)

    def gather_response(self, per_position: torch.Tensor, side: str, kind: str = "logit") -> torch.Tensor:
        """``[B, L, ...]`` → ``[B, T, ...]``: rows at :meth:`response_positions` (logits by default)."""
        if per_position.shape[:2] != self.input_ids(side).shape:
            raise ValueError(f"per_position: leading shape {tuple(per_position.shape[:2])} does not "
                             f"match the {side} sequence {tuple(self.input_ids(side).shape)}")
        index = self.response_positions(side, kind).to(per_position.device)
        index = index.view(*index.shape, *([1] * (per_position.dim() - 2)))
        return torch.gather(per_position, 1, index.expand(*index.shape[:2], *per_position.shape[2:]))

    def sampled_mask(self) -> torch.Tensor:
        """``[B, T]`` bool: every rollout token, the pad id's included (``response_mask`` leaves it out)."""
        return torch.arange(self.response_ids.shape[1]).unsqueeze(0) < self.response_lengths.unsqueeze(1)

    def scored_positions(self, side: str, tokens: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, L]`` bool: True at the positions of that side's sequence holding a scored rollout token
        (``tokens [B, T]``: which rollout tokens count; default ``response_mask``)."""
        keep = self.response_mask if tokens is None else tokens
        mask = torch.zeros_like(self.attention_mask(side))
        positions = self.response_positions(side, "token")
        rows = torch.arange(positions.shape[0]).unsqueeze(1).expand_as(positions)
        mask[rows[keep], positions[keep]] = True
        return mask

    def shifted_labels(self, side: str) -> torch.Tensor:
        """``[B, L]`` long: ``y_t`` at position ``start + t - 1`` (the logits predicting it) for the
        scored tokens, -100 elsewhere — a causal-LM cross-entropy over the scored rollout tokens."""
        labels = torch.full_like(self.input_ids(side), IGNORE_INDEX)
        positions = self.response_positions(side, "logit")
        rows = torch.arange(positions.shape[0]).unsqueeze(1).expand_as(positions)
        labels[rows[self.response_mask], positions[self.response_mask]] = self.response_ids[self.response_mask]
        return labels


def _check_side(side: str) -> str:
    if side not in SIDES:
        raise ValueError(f"side: expected one of {SIDES}, got {side!r}")
    return side


def _as_id_lists(name: str, seqs, vocab_size: int | None) -> list[list[int]]:
    out = []
    for i, seq in enumerate(seqs):
        ids = seq.tolist() if isinstance(seq, torch.Tensor) else list(seq)
        if any(not isinstance(x, int) or isinstance(x, bool) for x in ids):
            raise ValueError(f"{name}[{i}]: token ids must be ints")
        if vocab_size is not None and any(x < 0 or x >= vocab_size for x in ids):
            bad = next(x for x in ids if x < 0 or x >= vocab_size)
            raise ValueError(f"{name}[{i}]: token id {bad} outside [0, {vocab_size})")
        out.append(ids)
    return out


def _pad_right(seqs: list[list[int]], pad_id: int, multiple: int) -> tuple[torch.Tensor, torch.Tensor]:
    length = max(len(s) for s in seqs)
    length = -(-length // multiple) * multiple
    ids = torch.full((len(seqs), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), length), dtype=torch.bool)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[b, : len(s)] = True
    return ids, mask


def build_distill_batch(
    student_prompts: Sequence[Sequence[int]],
    teacher_prompts: Sequence[Sequence[int]],
    rollouts: Sequence[Sequence[int]],
    pad_id: int | None,
    pad_to_multiple_of: int = 1,
    max_length: int | None = None,
    vocab_size: int | None = None,
) -> DistillBatch:
    """Concatenate each prompt with its rollout as ids and right-pad.

    Args:
        student_prompts, teacher_prompts: ``B`` tokenized prompts (non-empty).
        rollouts: ``B`` rollouts: the ids the engine sampled after the student prompt (may
            end in EOS; may be empty — such a row has no response token).
        pad_id: the tokenizer's pad id: fills the padding, and rollout tokens equal to it are
            not scored (official rule, module docstring). None (a tokenizer without one): pad
            with 0 and score every rollout token. Lengths are explicit, never found from it.
        pad_to_multiple_of: round each sequence length up (e.g. the TP size for sequence
            parallelism).
        max_length: raise if a sequence (prompt + rollout) is longer.
        vocab_size: if given, every id must lie in ``[0, vocab_size)``.
    """
    batch = len(rollouts)
    if batch == 0:
        raise ValueError("rollouts: empty batch")
    for name, seqs in (("student_prompts", student_prompts), ("teacher_prompts", teacher_prompts)):
        if len(seqs) != batch:
            raise ValueError(f"{name}: {len(seqs)} prompts for {batch} rollouts")
    if not isinstance(pad_to_multiple_of, int) or pad_to_multiple_of < 1:
        raise ValueError(f"pad_to_multiple_of: must be a positive int, got {pad_to_multiple_of!r}")
    student = _as_id_lists("student_prompts", student_prompts, vocab_size)
    teacher = _as_id_lists("teacher_prompts", teacher_prompts, vocab_size)
    ys = _as_id_lists("rollouts", rollouts, vocab_size)
    for name, prompts in (("student_prompts", student), ("teacher_prompts", teacher)):
        for b, p in enumerate(prompts):
            if not p:
                raise ValueError(f"{name}[{b}]: empty prompt (the first rollout token needs a predecessor)")
            if max_length is not None and len(p) + len(ys[b]) > max_length:
                raise ValueError(f"{name}[{b}]: prompt {len(p)} + rollout {len(ys[b])} tokens exceeds "
                                 f"max_length={max_length}")
    fill = 0 if pad_id is None else pad_id
    s_ids, s_mask = _pad_right([p + y for p, y in zip(student, ys)], fill, pad_to_multiple_of)
    t_ids, t_mask = _pad_right([p + y for p, y in zip(teacher, ys)], fill, pad_to_multiple_of)
    y_ids, y_mask = _pad_right(ys, fill, 1)
    scored = y_mask if pad_id is None else y_mask & (y_ids != pad_id)
    return DistillBatch(
        student_input_ids=s_ids, student_attention_mask=s_mask,
        teacher_input_ids=t_ids, teacher_attention_mask=t_mask,
        student_response_start=torch.tensor([len(p) for p in student], dtype=torch.long),
        teacher_response_start=torch.tensor([len(p) for p in teacher], dtype=torch.long),
        response_ids=y_ids, response_mask=scored, response_lengths=y_mask.sum(dim=1),
    )
