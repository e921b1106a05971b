"""A step's prompts, what the engines sample for it, and what this rank trains on.

Every rank plans every step the same way (``StepPlanner.plan``): the step's rows, read from a
copy of the sampler (the sampler itself advances only when the step's update is done, so a
checkpoint's data position never counts a step that did not train, and the overlapped mode can
plan step k+1 during step k), their prompt pairs, and the engines' ``StepRequests``. Once its
group's samples arrive, a rank assembles the (prompt pair, completion) of every sample of its
group (``StepPlanner.training_samples``); samples of other groups stay None: the batch builder
reads only this rank's data-parallel block.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from functools import cached_property

from ..config_errors import fail
from ..data import PromptConfig, PromptPair, build_prompt_pair
from ..data.prompts import (encode_prompt, generation_prompt, render_student_prompt, render_teacher_prompt,
                            teacher_continuation)
from ..data.reason_first import analysis_prompt_ids, analysis_prompt_text, reason_first_teacher_ids
from .batches import local_samples
from .config import TrainConfig
from .microbatch_plan import BUDGET_KEY, check_step_split, microbatch_tokens
from .policy_mix import on_policy_samples, solution_completion
from .rollouts import StepRequests, StepSamples


def peek_rows(sampler, skip: int, count: int) -> list[int]:
    """The ``count`` row indices after the next ``skip`` ones, leaving ``sampler`` where it is."""
    ahead = copy.deepcopy(sampler)
    ahead.take(skip)
    return ahead.take(count)


def row_origins(rows: list, num_samples: int) -> list[str] | None:
    """Each sample's data row (``MathRow.origin``, e.g. ``train.jsonl:17``): the step's samples follow its
    rows, the same count per row; None when they do not (an engine group's share of the rows)."""
    if not rows or num_samples % len(rows):
        return None
    per_row = num_samples // len(rows)
    return [getattr(rows[i // per_row], "origin", "") for i in range(num_samples)]


@dataclass
class StepPlan:
    """One step's inputs, identical on every rank."""

    step: int
    indices: list[int]
    """the step's dataset rows (``training.prompts_per_step`` of them)."""
    rows: list
    pairs: list[PromptPair] | None
    """prompt pair per row; None with ``data.reason_first`` (the teacher prompt needs the analysis)."""
    requests: StepRequests


class StepPlanner:
    """Builds ``StepPlan``s and this rank's training samples (see the module docstring)."""

    def __init__(self, cfg: TrainConfig, dataset, tokenizer, prompt_config: PromptConfig, dp_size: int,
                 row_inputs=None):
        """``row_inputs(tokenizer, row, prompt_config)``: a row's ``PromptPair`` (the method's; default PHF's)."""
        self.cfg, self.dataset, self.tokenizer, self.prompt_config = cfg, dataset, tokenizer, prompt_config
        self.dp_size = dp_size
        t, m = cfg.training, cfg.model   # the step's split, checked now: one line, before any rollout
        check_step_split(t.global_batch_size, dp_size, t.micro_batch_size, t.max_tokens_per_microbatch,
                         m.pipeline_model_parallel_size, m.virtual_pipeline_model_parallel_size, cfg.rollout.lmbda)
        self.row_inputs = row_inputs or (lambda tok, r, pc: build_prompt_pair(tok, r.problem, r.solution, pc))

    def plan(self, step: int, sampler, steps_ahead: int = 0) -> StepPlan:
        """The plan of ``step``, ``steps_ahead`` steps after the sampler's position."""
        cfg, p = self.cfg, self.cfg.prompts_per_step
        indices = peek_rows(sampler, steps_ahead * p, p)
        rows = [self.dataset[i] for i in indices]
        on_policy = on_policy_samples(cfg.rollout.lmbda, cfg.training.seed, step, p * cfg.rollout.n, self.dp_size,
                                      cfg.training.micro_batch_size)
        if cfg.data.reason_first:
            analysis = [analysis_prompt_ids(self.tokenizer, r.problem, r.solution) for r in rows]
            self._check_lengths(step, rows, analysis)
            student = [encode_prompt(self.tokenizer, render_student_prompt(self.tokenizer, r.problem,
                                                                           self.prompt_config)) for r in rows]
            return StepPlan(step, indices, rows, None, StepRequests(step, student, on_policy, analysis))
        pairs = [self.row_inputs(self.tokenizer, r, self.prompt_config) for r in rows]
        self._check_lengths(step, rows, [q.teacher_ids for q in pairs])
        return StepPlan(step, indices, rows, pairs, StepRequests(step, [q.student_ids for q in pairs], on_policy))

    def check_rows(self, texts=None, sequence=None, limits: str | None = None) -> None:
        """Every row fits ``data.max_prompt_length``: a row the run could never train on is named
        (file and line) when the data is loaded, not when its step comes. Under a token budget, every row's
        longest sequence, padded as a packed micro-batch pads it, fits ``training.max_tokens_per_microbatch``:
        a row over it alone would stop the run only when its step came (``token_budget_plan``, hours in, and
        again at every resume), so it is named at load, with the smallest budget every row fits.

        ``texts(row)``: the row's texts, rendered once: first the prompt measured against the length limit,
        then the others the sequence counts (needed only under a budget; default: PHF's, ``row_texts``).
        ``sequence(texts, count)``: ``(prompt, completion)`` tokens of the longest sequence the method makes
        from the row, ``count(text)`` counting a text's tokens (default: PHF's, ``longest_sequence``);
        ``limits``: the settings that bound it. A byte-level BPE token covers at least one UTF-8 byte, so
        texts are counted in bytes first and tokenized (each at most once) only when that bound is over."""
        cfg = self.cfg
        limit, budget = cfg.data.max_prompt_length, cfg.training.max_tokens_per_microbatch
        shared = ()  # texts every row counts
        if texts is None:
            texts, sequence, shared = self.row_texts, self.longest_sequence, self._continuation
            limits = "rollout.max_tokens" + (", data.reason_first_max_tokens" if cfg.data.reason_first else "")
        tokens = _Tokens(self.tokenizer, shared)
        pad = cfg.model.tensor_model_parallel_size if cfg.model.sequence_parallel else 1
        too_long, over = [], []
        for row in self.dataset.rows:
            tokens.next_row()
            rendered = texts(row)
            if _utf8_bytes(rendered[0]) > limit and tokens(rendered[0]) > limit:
                too_long.append(row.origin)
            if budget is None or too_long:  # a prompt over the limit is the error reported: no budget to check
                continue
            if microbatch_tokens([sum(sequence(rendered, _utf8_bytes))], "packed", pad) <= budget:
                continue
            prompt, completion = sequence(rendered, tokens)
            need = microbatch_tokens([prompt + completion], "packed", pad)
            if need > budget:
                over.append((need, row.origin, prompt, completion))
        if too_long:
            raise fail("data.max_prompt_length", f"{len(too_long)} row(s) have a prompt over {limit} tokens, which "
                       f"the run could never train on: {_shown(too_long)}; raise it, or remove the rows")
        if over:
            need, origin, prompt, completion = max(over, key=lambda o: o[0])
            padded = f", padded to a multiple of {pad}" if need != prompt + completion else ""
            others = [o[1] for o in over if o[1] != origin]
            raise fail(BUDGET_KEY, f"{len(over)} row(s) make a sequence over the budget of {budget} tokens alone, "
                       f"which would stop the run when its step came: {origin} makes {prompt} prompt + {completion} "
                       f"completion tokens ({limits}{padded}) = {need}{'; also ' + _shown(others) if others else ''}; "
                       f"the smallest budget every row fits is {need}: raise it to that, lower {limits}, or remove "
                       "the row(s)")

    def row_texts(self, row) -> tuple[str, ...]:
        """PHF's texts of ``row`` for ``check_rows``: the longer prompt of the pair (the teacher's; with
        ``data.reason_first`` the analysis prompt the teacher's is made from), then, under a token budget,
        the student's prompt."""
        cfg, tok, pc = self.cfg, self.tokenizer, self.prompt_config
        if cfg.data.reason_first:
            measured = analysis_prompt_text(tok, row.problem, row.solution)
        else:
            measured = render_teacher_prompt(tok, row.problem, row.solution, pc)
        if cfg.training.max_tokens_per_microbatch is None:
            return (measured,)
        return measured, render_student_prompt(tok, row.problem, pc)

    def longest_sequence(self, texts, count) -> tuple[int, int]:
        """PHF's longest sequence from a row's ``row_texts`` as ``(prompt, completion)`` tokens: the longer
        prompt of the pair (the teacher's) + ``rollout.max_tokens``. With ``data.reason_first`` the teacher
        prompt is made at the step, from the sampled analysis: it is bounded by the analysis prompt +
        ``data.reason_first_max_tokens`` + the continuation (``reason_first_teacher_ids``)."""
        measured, student = texts
        teacher = count(measured)
        if self.cfg.data.reason_first:
            teacher += self.cfg.data.reason_first_max_tokens + sum(count(text) for text in self._continuation)
        return max(count(student), teacher), self.cfg.rollout.max_tokens

    @cached_property
    def _continuation(self) -> list[str]:
        """What ``reason_first_teacher_ids`` appends after the analysis, as texts (none without it)."""
        pc = self.prompt_config
        if not self.cfg.data.reason_first:
            return []
        return [teacher_continuation(pc.teacher_prompt)] + (
            [generation_prompt(self.tokenizer, pc.student_enable_thinking)] if pc.align_generation_prompt else [])

    def _check_lengths(self, step: int, rows, prompts) -> None:
        too_long = [i for i, q in enumerate(prompts) if len(q) > self.cfg.data.max_prompt_length]
        if too_long:
            raise fail("data.max_prompt_length", f"{len(too_long)} prompt(s) of step {step} exceed "
                       f"{self.cfg.data.max_prompt_length} tokens (e.g. {rows[too_long[0]].origin})")

    def training_samples(self, plan: StepPlan, samples: StepSamples, group_prompts: range):
        """``(pairs, completions)``, one entry per sample of the step (``rollout.n`` per prompt): the prompt
        pair and the completion (the rollout, or with ``rollout.lmbda`` < 1 the row's solution) for the
        samples of ``group_prompts``, None for the others."""
        n, req = self.cfg.rollout.n, plan.requests
        pairs: list[PromptPair | None] = [None] * len(plan.rows) * n
        completions: list[list[int] | None] = [None] * len(plan.rows) * n
        for r in group_prompts:
            if plan.pairs is not None:
                pair = plan.pairs[r]
            else:
                pair = PromptPair(student_ids=req.prompts[r], teacher_ids=reason_first_teacher_ids(
                    self.tokenizer, req.analysis_prompts[r], samples.analyses[r], self.prompt_config))
            for i in range(r * n, (r + 1) * n):
                pairs[i] = pair
                completions[i] = samples.completions[i] if req.on_policy[i] else solution_completion(
                    self.tokenizer, plan.rows[r].solution, self.cfg.rollout.max_tokens)
        return pairs, completions


class _Tokens:
    """``tokens(text)``: ``text``'s tokens (``encode_prompt``), each text tokenized at most once: a row's
    texts until ``next_row()``, and the texts every row counts (``shared``) for the whole check."""

    def __init__(self, tokenizer, shared=()):
        self.tokenizer, self.shared, self.counts = tokenizer, set(shared), {}

    def next_row(self) -> None:
        self.counts = {text: n for text, n in self.counts.items() if text in self.shared}

    def __call__(self, text: str) -> int:
        if text not in self.counts:
            self.counts[text] = len(encode_prompt(self.tokenizer, text))
        return self.counts[text]


def _utf8_bytes(text: str) -> int:
    """An upper bound of ``text``'s tokens: a byte-level BPE token covers at least one byte."""
    return len(text.encode("utf-8"))


def _shown(origins: list[str]) -> str:
    """Up to five row origins, and how many more."""
    return ", ".join(origins[:5]) + (f" and {len(origins) - 5} more" if len(origins) > 5 else "")


def local_rollout_record(completions: list, dp_rank: int, dp_size: int) -> dict[int, tuple[int, str]]:
    """This data-parallel rank's samples: index -> (tokens, sha256 of the ids)."""
    return {i: (len(completions[i]), hashlib.sha256(repr(list(completions[i])).encode()).hexdigest())
            for i in local_samples(len(completions), dp_rank, dp_size)}


def rollout_stats(records: list[dict[int, tuple[int, str]]]) -> dict:
    """``rollout_tokens`` (mean completion length of the step) and ``rollout_digest`` (52 bits of a
    hash of every sample's ids in sample order: equal digests, equal rollouts, whatever the layout)
    from every rank's ``local_rollout_record``."""
    merged = {i: v for record in records for i, v in record.items()}
    digest = hashlib.sha256("".join(f"{i}:{merged[i][1]};" for i in sorted(merged)).encode()).hexdigest()
    return dict(rollout_tokens=sum(t for t, _ in merged.values()) / max(len(merged), 1),
                rollout_digest=int(digest[:13], 16))
