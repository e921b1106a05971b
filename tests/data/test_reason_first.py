"""The reason-first teacher prompt, token for token with the real Qwen3 tokenizer, against a
transcription of the official construction on rows of the example math set (examples/data/)."""

import json

import pytest

from phf_megatron.data import PromptConfig, generation_prompt
from phf_megatron.data.reason_first import analysis_prompt_ids, reason_first_teacher_ids
from tests.helpers import EXAMPLE_MATH


def _rows(n=3):
    with open(EXAMPLE_MATH, encoding="utf-8") as f:
        return [json.loads(line) for line in f][:n]


def official_reason_first_ids(tokenizer, problem, solution, analysis_ids):
    """Transcribed from the official code at commit 7448751 (``louieworth/OPSD``):
    ``data_collator.py`` lines 29-43 (the two texts), 76-90 (the analysis prompt, rendered without
    ``enable_thinking``), 143-168 (tokenized with the tokenizer's defaults; the transition as raw
    text), and ``opsd_trainer.py`` lines 1345-1352 (``[prompt][analysis][transition]``), one row, no padding."""
    reason_first_prompt = (
        "\n\nThe reference reasoning above arrives at the correct answer. "
        "Please analyze this solution and explain the key reasoning steps and problem-solving strategies employed. "
        "Do NOT use <think> tags. Do NOT derive your own solution. "
        "Simply analyze and explain the reference solution provided above.\n")
    transition_prompt = (
        "\n\nAfter reading the reference solution above, make sure you truly understand "
        "the reasoning behind each step \u2014 do not copy or paraphrase it. Now, using your "
        "own words and independent reasoning, derive the same final answer to the problem above. "
        "Think step by step, explore different approaches, and don't be afraid to backtrack "
        "or reconsider if something doesn't work out:\n")
    message = (f"Problem: {problem}\n\nHere is a correct reasoning to this problem:"
               f"=== Reference Reasoning Start ===\n{solution}\n=== Reference Reasoning End ===\n\n"
               f"{reason_first_prompt}")
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": message}], tokenize=False,
                                           add_generation_prompt=True)
    prompt_ids = tokenizer([prompt], padding=False, truncation=True, max_length=20000)["input_ids"][0]
    transition = f"\n{transition_prompt}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
    transition_ids = tokenizer([transition], padding=False, truncation=False)["input_ids"][0]
    return list(prompt_ids), list(prompt_ids) + list(analysis_ids) + list(transition_ids)


@pytest.mark.parametrize("row", _rows())
def test_teacher_prompt_equals_the_official_construction(qwen3_tokenizer, row):
    tok = qwen3_tokenizer
    analysis = tok("The solution sets up two equations and solves them.", add_special_tokens=False)["input_ids"]
    analysis = list(analysis) + [tok.convert_tokens_to_ids("<|im_end|>")]
    official_prompt, official = official_reason_first_ids(tok, row["problem"], row["solution"], analysis)
    prompt = analysis_prompt_ids(tok, row["problem"], row["solution"])
    assert prompt == official_prompt
    assert tok.decode(prompt).endswith("<|im_start|>assistant\n")  # template-default (thinking) generation prompt
    assert reason_first_teacher_ids(tok, prompt, analysis, PromptConfig(align_generation_prompt=False)) == official
    for thinking in (False, True):  # aligned (default): only the student's generation prompt is added
        config = PromptConfig(student_enable_thinking=thinking)
        tail = tok(generation_prompt(tok, thinking), add_special_tokens=False)["input_ids"]
        assert reason_first_teacher_ids(tok, prompt, analysis, config) == official + list(tail)
