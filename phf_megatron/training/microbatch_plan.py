"""Which data-parallel rank and which micro-batch train each of a step's samples.

A plan is pure arithmetic on sample indices and token counts: no tensor, no process group, no
RNG, no ``hash()`` (so it is the same on every rank and under any ``PYTHONHASHSEED``). Every rank
computes the same plan and reads its own part. Two modes:

* **fixed count** (:func:`fixed_plan`, today's split, ``batches.build_microbatches``): rank ``r``
  takes the contiguous block ``[r·n/dp, (r+1)·n/dp)`` of the ``n`` samples, cut into consecutive
  micro-batches of ``micro_batch_size``.
* **token budget** (:func:`token_budget_plan`, ``training.max_tokens_per_microbatch``, which
  ``batches.build_microbatches`` plans with for ``--method=sft`` with packing): the samples are
  first spread over the data-parallel ranks by LPT (longest processing time first: in decreasing
  cost, each to the least-loaded rank so far), which bounds the slowest rank's load by
  ``(4/3 - 1/(3·dp))`` times the best possible (Graham 1969). The cost of a sample is
  ``3·L_student + L_teacher`` (:data:`STUDENT_COST`, :data:`TEACHER_COST`): the student runs
  forward and backward (a backward costs about two forwards: the gradients of the activations
  and of the weights), the teacher forward only; FLOPs of a dense transformer grow linearly in
  tokens while the sequences stay short beside the hidden size, so token counts stand in for
  time (attention's quadratic term is left out; with full activation recompute, as the GPU
  presets run, the student's forward runs twice, ~4·L_student, which moves the weights, not the
  method). Then, inside each rank, first-fit decreasing:
  the rank's samples in decreasing cost each go to the first micro-batch where both the
  student's and the teacher's tokens stay within the budget, or open a new one. A sample too
  long to share gets a micro-batch of its own; a sample over the budget alone is a one-line
  config error naming it and ``training.max_tokens_per_microbatch`` (a second guard: the trainer
  names the data rows that could make one at load, ``StepPlanner.check_rows``).

Token accounting of a micro-batch, per side (:func:`microbatch_tokens`), with ``m`` the
multiple the layout rounds to (the TP size under sequence parallelism, else 1):

* ``layout="packed"`` (sequences concatenated, THD): ``ceil(Σ L_i / m)·m``;
* ``layout="padded"`` (right-padded ``[b, L]``): ``b·ceil(max L_i / m)·m``.

Ties are broken by sample index (and rank index), so equal costs give one plan. Under a budget,
ranks may run different numbers of micro-batches (Megatron all-reduces the per-token counts over
data parallelism; the pipeline stages of one rank share its plan). The loss is
normalized over the step's global counts, so any plan gives the same update; balancing is per
engine group when rollouts come in groups (a rank holds only its group's completions): call the
planner with that group's samples and data-parallel ranks.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Sequence

from ..config_errors import fail

#: Cost weights of one token: the student's forward + backward, the teacher's forward only.
STUDENT_COST, TEACHER_COST = 3, 1
LAYOUTS = ("packed", "padded")
BUDGET_KEY = "training.max_tokens_per_microbatch"


@dataclass(frozen=True)
class MicroBatchPlan:
    """``ranks[r][k]``: the sample indices (ascending) of micro-batch ``k`` of data-parallel rank ``r``."""

    ranks: tuple[tuple[tuple[int, ...], ...], ...]

    @property
    def dp_size(self) -> int:
        return len(self.ranks)

    def microbatches(self, dp_rank: int) -> tuple[tuple[int, ...], ...]:
        """Rank ``dp_rank``'s micro-batches, in the order it runs them."""
        return self.ranks[dp_rank]

    def local_samples(self, dp_rank: int) -> list[int]:
        """Every sample rank ``dp_rank`` trains, in micro-batch order."""
        return [i for mb in self.ranks[dp_rank] for i in mb]

    def num_microbatches(self) -> list[int]:
        return [len(r) for r in self.ranks]


def sample_cost(student_len: int, teacher_len: int) -> int:
    """The LPT cost of one sample (module docstring): ``3·L_student + L_teacher``."""
    return STUDENT_COST * student_len + TEACHER_COST * teacher_len


def microbatch_tokens(lengths: Sequence[int], layout: str = "packed", pad_multiple: int = 1) -> int:
    """Tokens one side of a micro-batch computes, padding included (module docstring)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout: {layout!r} is not one of {LAYOUTS}")
    if not lengths:
        return 0
    if layout == "packed":
        return _round_up(sum(lengths), pad_multiple)
    return len(lengths) * _round_up(max(lengths), pad_multiple)


def plan_microbatches(student_lengths: Sequence[int], teacher_lengths: Sequence[int], *, dp_size: int,
                      micro_batch_size: int, max_tokens: int | None = None, layout: str = "packed",
                      pad_multiple: int = 1, names: Sequence[str] | None = None) -> MicroBatchPlan:
    """The one call: :func:`token_budget_plan` when ``max_tokens`` is set, else :func:`fixed_plan`."""
    if max_tokens is None:
        return fixed_plan(len(student_lengths), dp_size=dp_size, micro_batch_size=micro_batch_size)
    return token_budget_plan(student_lengths, teacher_lengths, dp_size=dp_size, max_tokens=max_tokens, layout=layout,
                             pad_multiple=pad_multiple, names=names)


def fixed_plan(num_samples: int, *, dp_size: int, micro_batch_size: int) -> MicroBatchPlan:
    """Today's split: contiguous blocks per rank, consecutive micro-batches of ``micro_batch_size``."""
    if dp_size < 1 or num_samples < 1:
        raise ValueError(f"need >= 1 sample and >= 1 rank, got {num_samples} samples, dp_size={dp_size}")
    if num_samples % dp_size:
        raise fail("training.global_batch_size", f"{num_samples} samples do not split over {dp_size} "
                   "data-parallel ranks")
    per = num_samples // dp_size
    if micro_batch_size < 1 or per % micro_batch_size:
        raise fail("training.micro_batch_size", f"{micro_batch_size} does not divide the {per} samples of a "
                   "data-parallel rank (global_batch_size / data-parallel size)")
    return MicroBatchPlan(tuple(
        tuple(tuple(range(lo, lo + micro_batch_size)) for lo in range(r * per, (r + 1) * per, micro_batch_size))
        for r in range(dp_size)))


def check_step_split(num_samples: int, dp_size: int, micro_batch_size: int, max_tokens: int | None,
                     pp_size: int = 1, vpp_size: int | None = None, lmbda: float = 1.0) -> None:
    """At start-up, before any rollout: a step's ``num_samples`` split over ``dp_size`` ranks (both modes), into
    micro-batches of ``micro_batch_size`` (fixed count; under a token budget too with ``lmbda`` < 1, whose draws
    follow the fixed split's slots: ``policy_mix.on_policy_samples``), a multiple of ``pp_size`` of them per rank
    under an interleaved pipeline (``vpp_size`` > 1: Megatron's schedule refuses another count). One line naming
    the setting."""
    if num_samples % dp_size:
        raise fail("training.global_batch_size", f"{num_samples} samples do not split over {dp_size} "
                   "data-parallel ranks")
    if max_tokens is not None:
        per_rank = num_samples // dp_size
        if lmbda < 1.0 and per_rank % micro_batch_size:
            raise fail("training.micro_batch_size", f"{micro_batch_size} does not divide the {per_rank} samples of a "
                       f"data-parallel rank (global_batch_size / data-parallel size {dp_size}), the slots of "
                       "rollout.lmbda's one draw per micro-batch")
        return
    count = len(fixed_plan(num_samples, dp_size=dp_size, micro_batch_size=micro_batch_size).ranks[0])
    if (vpp_size or 1) > 1 and count % pp_size:
        raise fail("training.micro_batch_size", f"{count} micro-batches per data-parallel rank (global_batch_size / "
                   f"(micro_batch_size x data-parallel size {dp_size})) are not a multiple of "
                   f"pipeline_model_parallel_size = {pp_size}, which the interleaved schedule "
                   "(model.virtual_pipeline_model_parallel_size) needs")


def token_budget_plan(student_lengths: Sequence[int], teacher_lengths: Sequence[int], *, dp_size: int,
                      max_tokens: int, layout: str = "packed", pad_multiple: int = 1,
                      names: Sequence[str] | None = None) -> MicroBatchPlan:
    """LPT over the ranks by :func:`sample_cost`, then first-fit decreasing into micro-batches whose
    student and teacher tokens (:func:`microbatch_tokens` in ``layout``) are each at most ``max_tokens``.

    ``student_lengths[i]`` / ``teacher_lengths[i]``: sample ``i``'s whole sequence (prompt + completion).
    Raises a ``ConfigError`` on ``training.max_tokens_per_microbatch`` naming the first sample that
    exceeds the budget on its own (and ``names[i]``, where it came from, e.g. its data row's origin).
    """
    n = len(student_lengths)
    if len(teacher_lengths) != n:
        raise ValueError(f"teacher_lengths: {len(teacher_lengths)} lengths for {n} samples")
    if dp_size < 1 or n < dp_size:
        raise ValueError(f"need at least one sample per data-parallel rank: {n} samples, dp_size={dp_size}")
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise fail(BUDGET_KEY, f"must be a positive int, got {max_tokens!r}")
    for i in range(n):
        if min(student_lengths[i], teacher_lengths[i]) < 1:
            raise ValueError(f"sample {i}: sequence lengths must be >= 1, got student {student_lengths[i]}, "
                             f"teacher {teacher_lengths[i]}")
        for side, length in (("student", student_lengths[i]), ("teacher", teacher_lengths[i])):
            alone = microbatch_tokens([length], layout, pad_multiple)
            if alone > max_tokens:
                named = f" ({names[i]})" if names is not None and names[i] else ""
                raise fail(BUDGET_KEY, f"sample {i}{named} alone needs {alone} {side} tokens, over the budget of "
                           f"{max_tokens}; raise the budget or shorten the sequences (sft.max_length; "
                           "data.max_prompt_length / rollout.max_tokens)")
    costs = [sample_cost(s, t) for s, t in zip(student_lengths, teacher_lengths)]
    order = sorted(range(n), key=lambda i: (-costs[i], i))
    per_rank = lpt_assign([costs[i] for i in order], dp_size)
    ranks = []
    for members in per_rank:
        samples = [order[j] for j in members]            # already in decreasing cost, ties by index
        bins: list[list[int]] = []
        for i in samples:
            for b in bins:
                if _fits(b + [i], student_lengths, teacher_lengths, max_tokens, layout, pad_multiple):
                    b.append(i)
                    break
            else:
                bins.append([i])
        ranks.append(tuple(tuple(sorted(b)) for b in bins))
    return MicroBatchPlan(tuple(ranks))


def lpt_assign(costs: Sequence[int], bins: int) -> list[list[int]]:
    """Graham's LPT on items already in the order to place (decreasing cost): each item to the bin
    with the least load so far, the lowest bin index on a tie. Returns each bin's item positions."""
    heap = [(0, b) for b in range(bins)]
    out: list[list[int]] = [[] for _ in range(bins)]
    for j, c in enumerate(costs):
        load, b = heapq.heappop(heap)
        out[b].append(j)
        heapq.heappush(heap, (load + c, b))
    return out


def _fits(members: list[int], student_lengths, teacher_lengths, max_tokens: int, layout: str, m: int) -> bool:
    return (microbatch_tokens([student_lengths[i] for i in members], layout, m) <= max_tokens
            and microbatch_tokens([teacher_lengths[i] for i in members], layout, m) <= max_tokens)


def _round_up(value: int, multiple: int) -> int:
    if multiple < 1:
        raise ValueError(f"pad_multiple: must be >= 1, got {multiple}")
    return -(-value // multiple) * multiple
