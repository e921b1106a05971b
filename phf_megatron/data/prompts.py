"""The OPSD prompts (student and privileged teacher), rendered with the Qwen3 chat template.

The user messages are the official ones, character for character (official OPSD at its newest
commit 7448751, ``data_collator.py`` lines 37-43 and 67-103, the default non-reason-first mode):

* student: ``"Problem: {problem}\\n\\nPlease reason step by step, and put your final answer
  within \\\\boxed{}."``
* teacher (``teacher_prompt="official"``, the default): ``"Problem: {problem}\\n\\nHere is a
  reference solution to this problem:\\n=== Reference Solution Begin ===\\n{solution}\\n===
  Reference Solution End ===\\n"`` + :data:`TRANSITION_PROMPT` + ``"\\nPlease reason step by step,
  and put your final answer within \\\\boxed{}."``
* teacher (``teacher_prompt="opsd_2026_03"``): the wording the authors replaced in their
  2026-03-18 rewrite (``siyan-zhao/OPSD`` up to 590ec26, 2026-03-10, ``data_collator.py``
  lines 28 and 82-87): no ``Problem:`` prefix, no Begin/End markers, and the older transition
  :data:`TRANSITION_PROMPT_2026_03`. Kept to compare with runs made before the rewrite; only the
  message changes, the thinking modes and the generation-prompt alignment below still apply.

Both teacher messages end in :func:`teacher_continuation` (``"\\n" + transition + "\\n" +
instruction``): the text the official reason-first mode appends, untemplated, after the
teacher's analysis (``data_collator.py`` line 162), so that mode can reuse it.

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
same assistant turn the student produced, in the student's mode. This tail is the only
difference from the official rendering (tested token for token on rows of the official set), and
there is none when both sides have the same thinking mode (the official non-thinking scripts).
Since Qwen3's template uses ``enable_thinking`` only in the generation prompt,
``teacher_enable_thinking`` then changes no token; it takes effect with
``align_generation_prompt=False``, which reproduces the official (misaligned) rendering.
"""

from __future__ import annotations

from dataclasses import dataclass

STUDENT_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
#: The official transition text (7448751 ``data_collator.py`` lines 37-43).
TRANSITION_PROMPT = (
    "\n\nAfter reading the reference solution above, make sure you truly understand the reasoning "
    "behind each step \u2014 do not copy or paraphrase it. Now, using your own words and independent "
    "reasoning, derive the same final answer to the problem above. Think step by step, explore "
    "different approaches, and don't be afraid to backtrack or reconsider if something doesn't work out:\n"
)
#: The transition text before the 2026-03-18 rewrite (siyan-zhao/OPSD 590ec26 ``data_collator.py`` line 28).
TRANSITION_PROMPT_2026_03 = (
    "\n\nAfter understanding the reference solution and the rationale behind each step, now "
    "articulate your own step-by-step reasoning that derives the same final answer to the "
    "problem below:\n"
)
#: ``data.teacher_prompt`` values: the official wording (default) and the superseded one.
TEACHER_PROMPTS = ("official", "opsd_2026_03")
_TRANSITIONS = {"official": TRANSITION_PROMPT, "opsd_2026_03": TRANSITION_PROMPT_2026_03}


def _check_teacher_prompt(teacher_prompt: str) -> str:
    if teacher_prompt not in TEACHER_PROMPTS:
        raise ValueError(f"teacher_prompt: {teacher_prompt!r} is not one of {TEACHER_PROMPTS}")
    return teacher_prompt


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
        teacher_prompt: the teacher message's wording, ``official`` (7448751) or
            ``opsd_2026_03`` (before the authors' 2026-03-18 rewrite).
    """

    student_enable_thinking: bool = False
    teacher_enable_thinking: bool = True
    align_generation_prompt: bool = True
    teacher_prompt: str = "official"

    def __post_init__(self):
        for name in ("student_enable_thinking", "teacher_enable_thinking", "align_generation_prompt"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: must be a bool, got {getattr(self, name)!r}")
        _check_teacher_prompt(self.teacher_prompt)


def student_user_message(problem: str) -> str:
    """The official student message."""
    return f"Problem: {problem}\n\n{STUDENT_INSTRUCTION}"


def teacher_continuation(teacher_prompt: str = "official") -> str:
    """``"\\n" + transition + "\\n" + instruction``: how every teacher message ends (and what the
    official reason-first mode appends after the teacher's analysis)."""
    return f"\n{_TRANSITIONS[_check_teacher_prompt(teacher_prompt)]}\n{STUDENT_INSTRUCTION}"


def teacher_user_message(problem: str, solution: str, teacher_prompt: str = "official") -> str:
    """The privileged-teacher message (non-reason-first mode) in the chosen wording."""
    if _check_teacher_prompt(teacher_prompt) == "official":
        reference = (f"Problem: {problem}\n\nHere is a reference solution to this problem:\n"
                     f"=== Reference Solution Begin ===\n{solution}\n=== Reference Solution End ===")
    else:
        reference = f"{problem}\n\nHere is a reference solution to this problem:\n{solution}"
    return reference + teacher_continuation(teacher_prompt)


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
    content = teacher_user_message(problem, solution, config.teacher_prompt)
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
