"""From a step's rows and rollouts (or, for SFT, solutions) to this rank's micro-batches.

Each sample is one (prompt, completion) pair: ``rollout.n`` completions per prompt. The step's
samples are split evenly over the data-parallel ranks, then into micro-batches of
``training.micro_batch_size``; or, with ``training.max_tokens_per_microbatch``, by the token-budget
plan (``microbatch_plan``). All micro-batches of a rank are padded to one student and one teacher
length (pipeline schedules send fixed-size activations), rounded up to the TP size under sequence
parallelism.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..data import PromptPair, build_distill_batch
from ..data.batch import DistillBatch
from ..objectives.window import DEFAULT_WINDOW_BUDGET
from ..parallel.batch import PhfMicroBatch
from ..parallel.grpo_step import GrpoMicroBatch
from ..parallel.layout import packed_length
from ..parallel.sft_step import SftMicroBatch
from ..config_errors import fail
from .microbatch_plan import BUDGET_KEY, token_budget_plan


def local_samples(num_samples: int, dp_rank: int, dp_size: int) -> range:
    if num_samples % dp_size:
        raise ValueError(f"training.global_batch_size: {num_samples} samples do not split over {dp_size} "
                         "data-parallel ranks")
    per = num_samples // dp_size
    return range(dp_rank * per, (dp_rank + 1) * per)


@dataclass(frozen=True)
class Packing:
    """How a micro-batch's sequences become activation rows (``training.packing``): right-padded rows
    (``enabled=False``, ``PADDED``), or packed into one row per side, rounded up to a multiple of
    ``pad_multiple`` (the TP size under sequence parallelism); with ``one_length`` every micro-batch of
    a rank to one length (``packed_length``: pipelining, whose schedule sends fixed-size activations),
    else each micro-batch keeps its own packed length."""

    enabled: bool = False
    pad_multiple: int = 1
    one_length: bool = True

    @classmethod
    def of(cls, cfg) -> "Packing":
        """This run's: ``training.packing``, the TP size under sequence parallelism, one length under PP."""
        model = cfg.model
        return cls(cfg.training.packing, model.tensor_model_parallel_size if model.sequence_parallel else 1,
                   model.pipeline_model_parallel_size > 1)

    def rank_length(self, lengths: list[torch.Tensor]) -> int | None:
        """The rank's one packed length (``packed_length``), or None: each micro-batch its own."""
        return packed_length(lengths, self.pad_multiple) if self.one_length else None


PADDED = Packing()


def phf_microbatches(batch: DistillBatch, micro_batch_size: int | Sequence[int], window_budget: int,
                     packing: Packing = PADDED) -> list[PhfMicroBatch]:
    """PHF's micro-batches of a rank's batch: student and teacher sequences, their rollout masks, the window.

    ``micro_batch_size``: consecutive rows per micro-batch, or each micro-batch's row count (a token-budget
    plan). ``packing``: padded rows, or each side of a micro-batch packed into one row (``PhfMicroBatch.packed``,
    ``Packing``: one student and one teacher length for the rank under pipelining)."""
    s_mask, t_mask = batch.scored_positions("student"), batch.scored_positions("teacher")
    s_tok, t_tok = batch.student_input_ids, batch.teacher_input_ids
    cuts = _cuts(s_tok.shape[0], micro_batch_size)
    if not packing.enabled:
        return [PhfMicroBatch(student_tokens=s_tok[sl], teacher_tokens=t_tok[sl], student_response=s_mask[sl],
                              teacher_response=t_mask[sl], window_budget=window_budget) for sl in cuts]
    s_len, t_len = batch.student_attention_mask.sum(1), batch.teacher_attention_mask.sum(1)
    s_total = packing.rank_length([s_len[sl] for sl in cuts])
    t_total = packing.rank_length([t_len[sl] for sl in cuts])
    return [PhfMicroBatch.packed(s_tok[sl], t_tok[sl], s_mask[sl], t_mask[sl], s_len[sl], t_len[sl],
                                 window_budget=window_budget, pad_multiple=packing.pad_multiple, student_total=s_total,
                                 teacher_total=t_total) for sl in cuts]


def sft_microbatches(batch: DistillBatch, micro_batch_size: int | Sequence[int], loss_on_prompt: bool,
                     packing: Packing = PADDED) -> list[SftMicroBatch]:
    """SFT's micro-batches: the student sequences, scored on the completion (the rows' solutions), or with
    ``loss_on_prompt`` on every token but the first (TRL's SFTTrainer on a plain ``text`` data set).

    ``micro_batch_size``: consecutive rows per micro-batch, or each micro-batch's row count in order (a
    token-budget plan, ``build_microbatches`` with ``max_tokens``). ``packing``: padded rows, or each
    micro-batch's sequences packed into one row (``SequenceLayout.pack``, ``Packing``)."""
    if loss_on_prompt:
        scored = batch.student_attention_mask.clone()
        scored[:, 0] = False
    else:
        scored = batch.scored_positions("student")
    tokens, cuts = batch.student_input_ids, _cuts(batch.student_input_ids.shape[0], micro_batch_size)
    if not packing.enabled:
        return [SftMicroBatch(tokens[sl], scored[sl]) for sl in cuts]
    lengths = batch.student_attention_mask.sum(1)
    total = packing.rank_length([lengths[sl] for sl in cuts])
    return [SftMicroBatch.packed(tokens[sl], scored[sl], lengths[sl], pad_multiple=packing.pad_multiple, total=total)
            for sl in cuts]


def _cuts(num_samples: int, micro_batch_size: int | Sequence[int]) -> list[slice]:
    """Consecutive slices: of ``micro_batch_size`` rows, or of each given count (they must sum to ``num_samples``)."""
    if isinstance(micro_batch_size, int):
        return [slice(lo, lo + micro_batch_size) for lo in range(0, num_samples, micro_batch_size)]
    if sum(micro_batch_size) != num_samples or min(micro_batch_size, default=0) < 1:
        raise ValueError(f"micro_batch_size: counts {list(micro_batch_size)} do not split {num_samples} samples")
    bounds = [0, *itertools.accumulate(micro_batch_size)]
    return [slice(lo, hi) for lo, hi in zip(bounds, bounds[1:])]


def grpo_microbatches(batch: DistillBatch, micro_batch_size: int | Sequence[int], advantages: torch.Tensor,
                      sampler_logps: Sequence[Sequence[float]] | None = None,
                      unscored: torch.Tensor | None = None, packing: Packing = PADDED) -> list[GrpoMicroBatch]:
    """GRPO's micro-batches of a rank's batch: the student sequences scored on every completion token, each
    sample's advantage and (the vLLM correction) the engine's log-prob of each completion token at
    that token's position.

    ``advantages [B]`` (float64), ``sampler_logps`` (B lists, one value per completion token) and
    ``unscored [B]`` (bool: samples left out of the loss, ``grpo.mask_truncated_completions``) follow
    the batch's rows, i.e. this rank's samples in ``local_samples`` order. ``packing``: padded rows, or each
    micro-batch's sequences, scored mask and sampler log-probs packed into one row (``GrpoMicroBatch.packed``,
    ``Packing``), as ``sft_microbatches``; advantages and ``num_items`` stay per sample."""
    b = batch.student_input_ids.shape[0]
    if advantages.shape != (b,):
        raise ValueError(f"advantages: expected [{b}], got {tuple(advantages.shape)}")
    every = batch.sampled_mask()  # TRL scores every sampled token, a final pad id (<|endoftext|>) too
    scored = batch.scored_positions("student", every)
    if unscored is not None:
        scored[unscored] = False
    sampler = None
    if sampler_logps is not None:
        if len(sampler_logps) != b or any(len(lp) != int(n) for lp, n in zip(sampler_logps, batch.response_lengths)):
            raise ValueError("sampler_logps: expected one log-prob per completion token of each sample")
        per_token = torch.zeros(batch.response_ids.shape, dtype=torch.float32)
        for r, lp in enumerate(sampler_logps):
            per_token[r, : len(lp)] = torch.tensor(list(lp), dtype=torch.float32)
        positions = batch.response_positions("student", "token")
        rows = torch.arange(b).unsqueeze(1).expand_as(positions)
        keep = every
        sampler = torch.zeros(scored.shape, dtype=torch.float32)
        sampler[rows[keep], positions[keep]] = per_token[keep]
    full = batch.response_lengths  # dapo's N_tok counts masked-out completions too (TRL)
    cuts, tokens = _cuts(b, micro_batch_size), batch.student_input_ids
    lengths = batch.student_attention_mask.sum(1)
    total = packing.rank_length([lengths[sl] for sl in cuts]) if packing.enabled else None
    out = []
    for sl in cuts:
        args = (tokens[sl], scored[sl], advantages[sl].to(torch.float64))
        rest = (None if sampler is None else sampler[sl], None if unscored is None else int(full[sl].sum()))
        out.append(GrpoMicroBatch.packed(*args, lengths[sl], *rest, pad_multiple=packing.pad_multiple, total=total)
                   if packing.enabled else GrpoMicroBatch(*args, *rest))
    return out


def build_microbatches(pairs: Sequence[PromptPair], completions: Sequence[Sequence[int]], *, pad_id: int | None,
                       micro_batch_size: int, dp_rank: int, dp_size: int, pad_multiple: int,
                       window_budget: int = DEFAULT_WINDOW_BUDGET, max_length: int | None = None,
                       make: Callable[[DistillBatch, int | list[int], list[int]], list] | None = None,
                       max_tokens: int | None = None, origins: Sequence[str] | None = None) -> list:
    """This rank's micro-batches. ``pairs[i]`` is the prompt pair of ``completions[i]``; the
    tokenizer's ``pad_id`` is not scored where a rollout holds it (``data.batch``). ``make(batch,
    micro_batch_size, samples)`` cuts the rank's padded batch into the method's micro-batches (default: PHF's,
    with ``window_budget``); ``samples[r]`` is the step's index of the batch's row ``r`` (what per-sample
    values such as GRPO's advantages follow).

    ``max_tokens`` (``training.max_tokens_per_microbatch``): the step's samples planned by
    ``microbatch_plan.token_budget_plan`` over packed token counts (LPT over the data-parallel ranks,
    first-fit decreasing into micro-batches of at most ``max_tokens`` student and teacher tokens), and
    ``make`` gets this rank's row count of each micro-batch instead of ``micro_batch_size``; ranks may run
    different numbers of micro-batches. ``origins[i]`` (e.g. the data row's ``file:line``) names sample
    ``i`` in the error of a sample over the budget alone."""
    if len(pairs) != len(completions):
        raise ValueError(f"completions: {len(completions)} rollouts for {len(pairs)} prompt pairs")
    if max_tokens is None:
        idx = local_samples(len(pairs), dp_rank, dp_size)
        if len(idx) % micro_batch_size:
            raise ValueError(f"training.micro_batch_size: {micro_batch_size} does not divide the {len(idx)} samples "
                             "of a data-parallel rank (global_batch_size / data-parallel size)")
        sizes: int | list[int] = micro_batch_size
    else:
        if any(p is None for p in pairs):
            raise fail(BUDGET_KEY, "not yet with more than one rollout engine group (rollout.num_engines): a rank "
                       "holds only its group's completions; unset it or use one engine")
        student = [len(p.student_ids) + len(c) for p, c in zip(pairs, completions)]
        teacher = [len(p.teacher_ids) + len(c) for p, c in zip(pairs, completions)]
        plan = token_budget_plan(student, teacher, dp_size=dp_size, max_tokens=max_tokens, layout="packed",
                                 pad_multiple=pad_multiple, names=origins)
        idx, sizes = plan.local_samples(dp_rank), [len(mb) for mb in plan.microbatches(dp_rank)]
    batch = build_distill_batch([pairs[i].student_ids for i in idx], [pairs[i].teacher_ids for i in idx],
                                [list(completions[i]) for i in idx], pad_id=pad_id, pad_to_multiple_of=pad_multiple,
                                max_length=max_length)
    make = make or (lambda b, sizes, samples: phf_microbatches(b, sizes, window_budget=window_budget))
    return make(batch, sizes, list(idx))
