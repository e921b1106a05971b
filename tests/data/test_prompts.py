"""The OPSD prompts: the Qwen3 template, the aligned generation prompt, the options.

Parity with the official code (messages and tokens) is in test_prompts_official.py."""

import itertools

import pytest

from phf_megatron.data import (
    PromptConfig,
    generation_prompt,
    render_student_prompt,
    render_teacher_prompt,
    student_user_message,
    teacher_user_message,
)

PROBLEM = "Let $x^2 = 4$ and $x > 0$. Find $x$."
SOLUTION = "Since $x > 0$, $x = \\sqrt{4} = 2$. So the answer is $\\boxed{2}$."
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
EMPTY_THINK = "<think>\n\n</think>\n\n"
COMBOS = list(itertools.product([False, True], repeat=2))


def test_student_message_is_the_official_string():
    assert student_user_message(PROBLEM) == "Problem: " + PROBLEM + "\n\n" + INSTRUCTION


def test_student_prompt_rendered_with_the_qwen3_template(qwen3_tokenizer):
    body = "<|im_start|>user\nProblem: " + PROBLEM + "\n\n" + INSTRUCTION + "<|im_end|>\n<|im_start|>assistant\n"
    assert render_student_prompt(qwen3_tokenizer, PROBLEM, PromptConfig(student_enable_thinking=True)) == body
    assert render_student_prompt(qwen3_tokenizer, PROBLEM, PromptConfig(student_enable_thinking=False)) == body + EMPTY_THINK


def test_generation_prompt_is_the_template_tail(qwen3_tokenizer):
    assert generation_prompt(qwen3_tokenizer, True) == "<|im_start|>assistant\n"
    assert generation_prompt(qwen3_tokenizer, False) == "<|im_start|>assistant\n" + EMPTY_THINK


@pytest.mark.parametrize("student_thinking, teacher_thinking", COMBOS)
def test_aligned_teacher_prompt_ends_like_the_student_prompt(qwen3_tokenizer, student_thinking, teacher_thinking):
    config = PromptConfig(student_thinking, teacher_thinking, align_generation_prompt=True)
    student = render_student_prompt(qwen3_tokenizer, PROBLEM, config)
    teacher = render_teacher_prompt(qwen3_tokenizer, PROBLEM, SOLUTION, config)
    tail = generation_prompt(qwen3_tokenizer, student_thinking)
    assert student.endswith(tail) and teacher.endswith(tail)
    # The teacher's own conversation is the official message; only the generation prompt follows the student.
    assert teacher == ("<|im_start|>user\n" + teacher_user_message(PROBLEM, SOLUTION) + "<|im_end|>\n" + tail)


@pytest.mark.parametrize("student_thinking, teacher_thinking", COMBOS)
def test_official_rendering_uses_each_side_own_mode(qwen3_tokenizer, student_thinking, teacher_thinking):
    config = PromptConfig(student_thinking, teacher_thinking, align_generation_prompt=False)
    teacher = render_teacher_prompt(qwen3_tokenizer, PROBLEM, SOLUTION, config)
    assert teacher.endswith(EMPTY_THINK) == (not teacher_thinking)
    student = render_student_prompt(qwen3_tokenizer, PROBLEM, config)
    # Issue #10: the two prompts end differently exactly when the modes differ.
    same_tail = student.endswith(EMPTY_THINK) == teacher.endswith(EMPTY_THINK)
    assert same_tail == (student_thinking == teacher_thinking)


def test_config_fields_are_checked():
    with pytest.raises(ValueError, match="student_enable_thinking"):
        PromptConfig(student_enable_thinking="no")
    with pytest.raises(ValueError, match="teacher_prompt: 'opsd_2026_02' is not one of"):
        PromptConfig(teacher_prompt="opsd_2026_02")
