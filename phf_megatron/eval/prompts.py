"""The evaluation prompt of the official OPSD evaluation (``eval/evaluate_math.py``).

    user turn: "{problem}\\n\\nPlease reason step by step, and put your final answer within \\boxed{}."

rendered through the model's chat template with ``enable_thinking`` on (the paper) or off.
(Training prompts differ — OPSD's student prompt starts with "Problem: " — they live in
``phf_megatron/data``.)
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from phf_megatron.tokenizer import chat_prompt_ids

EVAL_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def eval_user_message(problem: str) -> str:
    return f"{problem}\n\n{EVAL_INSTRUCTION}"


def eval_prompt_ids(tok: PreTrainedTokenizerBase, problem: str, *, thinking: bool = True) -> list[int]:
    """Token ids of the chat-formatted evaluation prompt (ends with the assistant header)."""
    return chat_prompt_ids(tok, eval_user_message(problem), enable_thinking=thinking)
