"""The OPSD prompts (student and privileged teacher), rendered with the Qwen3 chat template.

The user messages are the official ones (``siyan-zhao/OPSD``, ``data_collator.py``, the
default non-reason-first mode), character for character:

* student: ``"Problem: {problem}\\n\\nPlease reason step by step, and put your final answer
  within \\\\boxed{}."``
* teacher: ``"{problem}\\n\\nHere is a reference solution to this problem:\\n{solution}\\n"``
  + the transition text + ``"\\nPlease reason step by step, and put your final answer within
  \\\\boxed{}."`` (the official teacher message has no ``Problem:`` prefix).

The generation-prompt boundary (OPSD issue #10)
-----------------------------------------------
Qwen3's template ends the generation prompt with ``<|im_start|>assistant\\n`` and, only when
``enable_thinking=False``, an empty think block ``<think>\\n\\n</think>\\n\\n``. The rollout ``y``
is exactly what the student sampled *after its own generation prompt*, so that prompt's tail is
part of the assistant turn that ``y`` continues. The official code renders the teacher with its
own thinking mode; with a non-thinking student and a thinking teacher the teacher then scores
``y`` as if it were the first token of a turn that should open with ``<think>``, and the first
response tokens are compared across two different contexts.

Our choice (``align_generation_prompt=True``, the default): the teacher's prompt is its own
conversation followed by *the student's* generation prompt, token for token. Both sequences then
read ``... <|im_start|>assistant\\n[<think>\\n\\n</think>\\n\\n]`` ``y``: the teacher scores the
same assistant turn the student produced, in the student's mode. Since Qwen3's template uses
``enable_thinking`` only in the generation prompt, ``teacher_enable_thinking`` then changes no
token; it takes effect with ``align_generation_prompt=False``, which reproduces the official
(misaligned) rendering for ablations.
"""

from __future__ import annotations

from dataclasses import dataclass

STUDENT_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
TRANSITION_PROMPT = (
    "\n\nAfter understanding the reference solution and the rationale behind each step, now "
    "articulate your own step-by-step reasoning that derives the same final answer to the "
    "problem below:\n"
)


@dataclass(frozen=True)
class PromptConfig:
    """How the two prompts are rendered.

    Attributes:
        student_enable_thinking: the student's Qwen3 thinking mode (False: the generation
            prompt ends in an empty think block). The OPSD paper trains a non-thinking student.
        teacher_enable_thinking: the teacher's thinking mode (official: True). Only used when
            ``align_generation_prompt`` is False (see the module docstring).
        align_generation_prompt: end the teacher's prompt with the student's generation prompt
            so the rollout continues the same assistant-turn prefix in both sequences.
    """

    student_enable_thinking: bool = False
    teacher_enable_thinking: bool = True
    align_generation_prompt: bool = True

    def __post_init__(self):
        for name in ("student_enable_thinking", "teacher_enable_thinking", "align_generation_prompt"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: must be a bool, got {getattr(self, name)!r}")


def student_user_message(problem: str) -> str:
    """The official student message."""
    return f"Problem: {problem}\n\n{STUDENT_INSTRUCTION}"


def teacher_user_message(problem: str, solution: str) -> str:
    """The official privileged-teacher message (non-reason-first mode)."""
    return (f"{problem}\n\nHere is a reference solution to this problem:\n{solution}\n"
            f"{TRANSITION_PROMPT}\n{STUDENT_INSTRUCTION}")


def _render(tokenizer, content: str, add_generation_prompt: bool, enable_thinking: bool) -> str:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False,
        add_generation_prompt=add_generation_prompt, enable_thinking=enable_thinking)


def generation_prompt(tokenizer, enable_thinking: bool) -> str:
    """The text the chat template appends for ``add_generation_prompt=True``
    (Qwen3: ``<|im_start|>assistant\\n`` plus the empty think block when not thinking)."""
    probe = "x"
    with_gen = _render(tokenizer, probe, True, enable_thinking)
    without = _render(tokenizer, probe, False, enable_thinking)
    if not with_gen.startswith(without):
        raise ValueError("tokenizer: its chat template's generation prompt is not a suffix of the "
                         "rendered conversation; cannot align the teacher's prompt with the student's")
    return with_gen[len(without):]


def render_student_prompt(tokenizer, problem: str, config: PromptConfig = PromptConfig()) -> str:
    return _render(tokenizer, student_user_message(problem), True, config.student_enable_thinking)


def render_teacher_prompt(tokenizer, problem: str, solution: str, config: PromptConfig = PromptConfig()) -> str:
    content = teacher_user_message(problem, solution)
    if not config.align_generation_prompt:
        return _render(tokenizer, content, True, config.teacher_enable_thinking)
    conversation = _render(tokenizer, content, False, config.teacher_enable_thinking)
    return conversation + generation_prompt(tokenizer, config.student_enable_thinking)


def encode_prompt(tokenizer, text: str) -> list[int]:
    """Token ids of a rendered prompt; the template already holds every special token."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


@dataclass(frozen=True)
class PromptPair:
    """The two tokenized prompts of one row; the rollout is appended to both as ids."""

    student_ids: list[int]
    teacher_ids: list[int]


def build_prompt_pair(tokenizer, problem: str, solution: str, config: PromptConfig = PromptConfig()) -> PromptPair:
    return PromptPair(
        student_ids=encode_prompt(tokenizer, render_student_prompt(tokenizer, problem, config)),
        teacher_ids=encode_prompt(tokenizer, render_teacher_prompt(tokenizer, problem, solution, config)),
    )
