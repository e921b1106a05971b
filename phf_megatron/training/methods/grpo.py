"""The GRPO baseline (``--method grpo``): TRL 0.26's ``GRPOTrainer`` on the trainer's own rollouts.

A round samples ``rollout.n`` = G completions of each of the step's prompts from the engines (the
real ``RolloutDriver``: engines, weight sync), rewards each with the official
``eval.rewards.reward_correctness`` against the row's gold answer (``eval.rewards.gold_answer``:
the ``answer`` field, else the solution's last ``\\boxed{}``; every row is checked at load), and
normalizes the rewards within each prompt's group (``objectives.grpo.group_advantages``; a
prompt's G samples stay in one engine group, so each rank rewards its group's samples and one
gather gives every rank the step's rewards, which ``scale_rewards=batch`` needs whole). The
student's pass is ``parallel.GrpoStep``'s clipped policy-gradient loss.

``grpo.num_iterations`` I: the round's rollouts feed I optimizer steps (TRL's mu). The loop keeps
the round's micro-batches (``iterations``); the forward-only passes run once, at the round's first
step: the old policy's log-probs (``grpo.needs_old_logps``: I > 1 or the vLLM correction) under
the policy that sampled, and with ``grpo.beta`` > 0 the reference's, adapters off. Later steps of
the round reuse both (TRL computes them at generation time too). Rewards and advantages are the
round's; the metrics repeat them at each of its steps.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from ...data.rows import BadRowError
from ...eval.rewards import gold_answer, reward_correctness
from ...lora import adapters_off
from ...objectives.grpo import group_advantages
from ...parallel.grpo_step import GrpoStep
from ..batches import Packing, grpo_microbatches
from ..rollouts import RolloutDriver
from ..update import ScoringPass
from .sft import SftMethod, student_prompt

#: metrics: the round's mean reward, the share of rewards equal to 1, the mean within-group reward
#: std, the share of groups whose G rewards are all equal (advantage 0), completions without an EOS
REWARD, ACCURACY, REWARD_STD, FRAC_ZERO_STD, TRUNCATED = (
    "reward", "accuracy", "reward_std", "frac_reward_zero_std", "grpo_truncated")


def check_gold_answers(rows) -> None:
    """Every row has a gold answer; else one line naming the first row without one (and how many)."""
    bad = []
    for row in rows:
        try:
            gold_answer(row)
        except BadRowError as err:
            bad.append((row.origin, err))
    if bad:
        more = f" (and {len(bad) - 1} more row(s): {', '.join(o for o, _ in bad[1:4])}" \
               f"{', ...' if len(bad) > 4 else ''})" if len(bad) > 1 else ""
        raise BadRowError(f"{bad[0][1]}{more}")


def is_truncated(completion, eos_token_ids) -> bool:
    """A completion that ended without an EOS token (cut at ``rollout.max_tokens``), as TRL tells them."""
    return not any(t in eos_token_ids for t in completion)


def group_stats(rewards: torch.Tensor, group_size: int) -> dict:
    """The round's reward metrics (``REWARD`` ... ``FRAC_ZERO_STD``) of ``rewards [N]``, groups consecutive."""
    groups = rewards.view(-1, group_size)
    std = groups.std(dim=1)
    return {REWARD: float(rewards.mean()), ACCURACY: float((rewards == 1).double().mean()),
            REWARD_STD: float(std.mean()), FRAC_ZERO_STD: float((std == 0).double().mean())}


@dataclass
class Round:
    """One rollout batch, as every rank sees it (full length N = prompts x G)."""

    rewards: torch.Tensor
    advantages: torch.Tensor
    truncated: torch.Tensor
    sampler_logps: dict
    """sample index -> the engine's processed log-prob of each completion token (this rank's group)."""


class GrpoMethod:
    """TRL's clipped policy-gradient loss on group-normalized answer rewards (``cfg.grpo``)."""

    name = "grpo"

    def __init__(self, cfg, student):
        self.cfg, self.grpo = cfg, cfg.grpo
        self.iterations = cfg.grpo.num_iterations
        self.chunks = student.chunks
        self.device = next(p for c in student.chunks for p in c.parameters()).device
        self.driver: RolloutDriver | None = None
        self.eos_token_ids: frozenset[int] = frozenset()
        self.round: Round | None = None
        self._step: GrpoStep | None = None
        self._fresh = False
        """True from a new round's samples until its scoring passes are handed out."""

    def rollout_driver(self, cfg, student, engine_model_dir: str, eos_token_ids: tuple[int, ...]) -> RolloutDriver:
        self.eos_token_ids = frozenset(eos_token_ids)
        self.driver = RolloutDriver(cfg, student, engine_model_dir, eos_token_ids,
                                    sampler_logprobs=self.grpo.vllm_importance_sampling_correction)
        return self.driver

    row_inputs = staticmethod(SftMethod.row_inputs)

    @staticmethod
    def check_rows(planner) -> None:
        """Rows whose student prompt exceeds ``data.max_prompt_length`` (under a token budget: whose student
        prompt + ``rollout.max_tokens`` exceeds it alone), and rows without a gold answer."""
        planner.check_rows(lambda row: (student_prompt(planner, row),),
                           lambda texts, count: (count(texts[0]), planner.cfg.rollout.max_tokens), "rollout.max_tokens")
        check_gold_answers(planner.dataset.rows)

    def training_samples(self, planner, plan, samples, group):
        """The round's completions (the planner's), their rewards and advantages (every rank: the whole step's)."""
        pairs, completions = planner.training_samples(plan, samples, group)
        n = self.cfg.rollout.n
        local = {}
        for r in group:
            gold = gold_answer(plan.rows[r])
            for i in range(r * n, (r + 1) * n):
                text = planner.tokenizer.decode(completions[i], skip_special_tokens=True)
                local[i] = (reward_correctness(text, gold), is_truncated(completions[i], self.eos_token_ids))
        merged = {}
        for part in self.driver.gather(local):
            merged.update(part)
        order = range(len(completions))
        rewards = torch.tensor([merged[i][0] for i in order], dtype=torch.float64)
        self.round = Round(rewards=rewards, advantages=group_advantages(rewards, n, self.grpo.scale_rewards),
                           truncated=torch.tensor([merged[i][1] for i in order], dtype=torch.bool),
                           sampler_logps=dict(getattr(samples, "logprobs", None) or {}))
        self._fresh = True
        return pairs, completions

    def microbatches(self, batch, micro_batch_size, samples) -> list:
        """The batch's samples (``samples``: the step's index of each row, as the batch builder chose them:
        ``local_samples``, or a token budget's plan) with their advantages (and sampler log-probs), padded or
        packed (``training.packing``, ``batches.Packing``), on the student's device: the round's steps
        reuse them with what the scoring passes left on them. ``micro_batch_size``: a size or each micro-batch's."""
        rnd = self.round
        idx = torch.as_tensor(list(samples), dtype=torch.long)
        sampler = [rnd.sampler_logps[i] for i in samples] if self.grpo.vllm_importance_sampling_correction else None
        mbs = grpo_microbatches(batch, micro_batch_size, rnd.advantages[idx], sampler,
                                rnd.truncated[idx] if self.grpo.mask_truncated_completions else None,
                                Packing.of(self.cfg))
        return [mb.to(self.device) for mb in mbs] if self.device.type != "cpu" else mbs

    def step(self, student) -> GrpoStep:
        """The round's step object: a new one at a round's first step, the same one after."""
        from megatron.core import parallel_state as ps

        if self._fresh or self._step is None:
            self._step = GrpoStep(student.config, self.grpo, temperature=self.cfg.rollout.temperature,
                                  max_completion_length=self.cfg.rollout.max_tokens,
                                  tp_group=ps.get_tensor_model_parallel_group(),
                                  dp_group=ps.get_data_parallel_group())
        return self._step

    def passes(self, step: GrpoStep, mbs) -> list[ScoringPass]:
        """At a round's first step: the old policy's log-probs (when needed) and the reference's (beta > 0)."""
        if not self._fresh:
            return []
        self._fresh = False
        seq = step.student_seq_length(mbs[0].student_tokens.shape[1])
        out = []
        if self.grpo.needs_old_logps:
            out.append(ScoringPass("time_old_logps_s", contextlib.nullcontext, step.old_forward_step, seq))
        if self.grpo.beta != 0:
            out.append(ScoringPass("time_ref_s", lambda: adapters_off(self.chunks), step.ref_forward_step, seq))
        return out

    def after_step(self) -> None:
        pass

    def parts(self) -> dict:
        return {}  # checkpoints fall between rounds (checkpoint.save_interval % grpo.num_iterations == 0)

    @staticmethod
    def implementations() -> list[str]:
        return ["GRPO clipped policy gradient PyTorch (vocabulary-parallel)"]

    def step_metrics(self) -> dict:
        rnd = self.round
        return {**group_stats(rnd.rewards, self.cfg.rollout.n), TRUNCATED: int(rnd.truncated.sum())}

    def close(self) -> None:
        pass
