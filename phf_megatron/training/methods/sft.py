"""The SFT baseline: teacher-forced cross-entropy on ``chat(problem) ; solution + EOS`` (``--method sft``).

No rollout engine (``NullRolloutDriver``: no sync, no engine), no teacher, no EMA, no flow: one
student pass per update (``parallel.SftStep``). The data, optimizer, schedule, checkpoints and
export are the trainer's. A sequence longer than ``sft.max_length`` is cut at its end, as TRL
0.26's SFTTrainer does (``truncate_dataset``: the first ``max_length`` ids), and the step's cuts
are ``sft_truncated``.
"""

from __future__ import annotations

import torch.distributed as dist

from ...data import PromptPair
from ...data.prompts import encode_prompt, render_student_prompt
from ...parallel.sft_step import SftStep
from ..batches import Packing, sft_microbatches
from ..policy_mix import solution_completion
from ..rollouts import StepSamples

#: metric: sequences of the step cut at ``sft.max_length``
SFT_TRUNCATED = "sft_truncated"


def truncate_sequence(prompt: list[int], completion: list[int], max_length: int) -> tuple[list[int], list[int], bool]:
    """``prompt ; completion`` cut to its first ``max_length`` tokens: ``(prompt, completion, cut)``."""
    if len(prompt) + len(completion) <= max_length:
        return prompt, completion, False
    return prompt[:max_length], completion[: max(max_length - len(prompt), 0)], True


def student_prompt(planner, row) -> str:
    """The student's prompt of ``row``, as text."""
    return render_student_prompt(planner.tokenizer, row.problem, planner.prompt_config)


class _OneGroup:
    """Every rank sees every prompt of the step (there is no engine to split them over)."""

    num_engines = 0

    @staticmethod
    def prompts(engine_index: int, num_prompts: int) -> range:
        return range(num_prompts)

    @staticmethod
    def describe() -> str:
        return "no rollout engine"


class NullRolloutDriver:
    """The rollout driver of a method without rollouts: no engine, nothing sampled, nothing synced."""

    engine = None
    engine_index = 0
    groups = _OneGroup()

    def __init__(self):
        self.last_engine_s: list[float] = []

    def generate(self, requests) -> StepSamples:
        return StepSamples(step=requests.step, policy_version=requests.step)

    @staticmethod
    def gather(obj) -> list:
        out = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj)
        return out

    def sync(self, version: int) -> None:
        pass

    def sync_metrics(self) -> dict:
        return {}

    def close(self) -> None:
        pass


class SftMethod:
    """``sum_t -log p(y_t) / N_tok`` over the solution tokens (``sft.loss_on_prompt``: every token)."""

    name = "sft"
    iterations = 1

    def __init__(self, cfg):
        self.cfg = cfg
        self.truncated = 0

    def rollout_driver(self, cfg, student, engine_model_dir: str, eos_token_ids: tuple[int, ...]) -> NullRolloutDriver:
        return NullRolloutDriver()

    @staticmethod
    def row_inputs(tokenizer, row, prompt_config) -> PromptPair:
        """The student prompt on both sides (SFT has no teacher prompt; ``data.max_prompt_length`` bounds it)."""
        ids = encode_prompt(tokenizer, render_student_prompt(tokenizer, row.problem, prompt_config))
        return PromptPair(student_ids=ids, teacher_ids=ids)

    @staticmethod
    def check_rows(planner) -> None:
        """Rows whose student prompt exceeds ``data.max_prompt_length``, and under a token budget rows whose
        ``chat(problem) ; solution + EOS``, cut at ``sft.max_length``, exceeds it alone, named at load."""
        max_length = planner.cfg.sft.max_length

        def sequence(texts, count):
            student, solution = texts
            prompt = min(count(student), max_length)
            return prompt, min(count(solution) + 1, max_length - prompt)
        planner.check_rows(lambda row: (student_prompt(planner, row), row.solution), sequence, "sft.max_length")

    def training_samples(self, planner, plan, samples, group):
        """Each row's ``chat(problem) ; solution + EOS``, cut at ``sft.max_length`` (``rollout.n`` is 1)."""
        max_length, pairs, completions, cut = self.cfg.sft.max_length, [], [], 0
        for pair, row in zip(plan.pairs, plan.rows):
            solution = solution_completion(planner.tokenizer, row.solution, max_length)
            prompt, completion, was_cut = truncate_sequence(pair.student_ids, solution, max_length)
            pairs.append(PromptPair(student_ids=prompt, teacher_ids=prompt))
            completions.append(completion)
            cut += was_cut
        self.truncated = cut
        return pairs, completions

    def microbatches(self, batch, micro_batch_size, samples=None):
        """Padded, or packed with ``training.packing`` (``batches.Packing``); ``samples``: unused."""
        return sft_microbatches(batch, micro_batch_size, self.cfg.sft.loss_on_prompt, Packing.of(self.cfg))

    def step(self, student) -> SftStep:
        from megatron.core import parallel_state as ps

        return SftStep(student.config, tp_group=ps.get_tensor_model_parallel_group(),
                       dp_group=ps.get_data_parallel_group())

    def passes(self, step, mbs) -> list:
        return []

    def after_step(self) -> None:
        pass

    def parts(self) -> dict:
        return {}

    @staticmethod
    def implementations() -> list[str]:
        return ["cross-entropy PyTorch (vocabulary-parallel)"]

    def step_metrics(self) -> dict:
        return {SFT_TRUNCATED: self.truncated}

    def close(self) -> None:
        pass
