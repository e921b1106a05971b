"""The official ``--reason_first`` teacher prompt: the teacher first writes an analysis of the reference.

Official code (commit ``7448751``, ``louieworth/OPSD`` / ``shx2005/OPSD``):

* ``data_collator.py`` lines 29-35 (the instruction), 76-90 (the analysis prompt: the user message
  below, rendered with ``add_generation_prompt=True`` and no ``enable_thinking`` argument, so in
  Qwen3's default thinking mode), 160-168 (the transition text, tokenized without a template);
* ``opsd_trainer.py`` lines 1307-1362: before the student's rollout, the analysis is sampled
  (``generate_teacher_reasoning``, 755-793; with vLLM ``_generate_teacher_reasoning_vllm``,
  1043-1144: n = 1, the rollout temperature / top-p / top-k, at most ``max_reasoning_length`` =
  4096 tokens, since ``GOLDConfig`` has no such field, lines 257-266), and the teacher prompt
  becomes ``[analysis prompt][analysis][transition]`` (1345-1352), to which the rollout y is
  appended (1398-1399).

Which weights write the analysis: the official runs use vLLM (``scripts/run_opsd_*.sh``:
``--use_vllm``), whose engine holds the *student's* weights as last synced (the LoRA merged,
lines 1191-1222), whatever the teacher mode; only its transformers path disables the adapters
for ``--fixed_teacher`` (772-777) and no path applies the EMA. Here the analysis comes from the
rollout engine too (``training.rollouts``), i.e. the current student, as in the official runs.

Two departures, both where the official code is inconsistent with itself:

* the official vLLM path decodes the analysis prompt with ``skip_special_tokens=True``
  (1052-1055), so vLLM sees it without the chat template's ``<|im_start|>``/``<|im_end|>`` and
  re-tokenizes it, and then slices the analysis at the template-tokenized prompt length
  (1322-1323), a few tokens off; its transformers path keeps the template. We keep the
  template: the engine gets the prompt's token ids and returns the analysis' ids exactly;
* the official batch pads the analysis prompt and the analysis to the batch maximum with pad
  tokens in the middle of the teacher prompt (masked in attention, 1356-1360); each of our
  sequences is its own concatenation, without padding inside.

With ``data.align_generation_prompt`` (our default) the teacher prompt also ends with the
student's generation prompt (``prompts.generation_prompt``, OPSD issue #10), as the plain
teacher prompt does; ``--data.align_generation_prompt=false`` gives the official sequence.
"""

from __future__ import annotations

from .prompts import PromptConfig, encode_prompt, generation_prompt, teacher_continuation

#: ``data_collator.py`` lines 30-35.
REASON_FIRST_INSTRUCTION = (
    "\n\nThe reference reasoning above arrives at the correct answer. "
    "Please analyze this solution and explain the key reasoning steps and problem-solving strategies employed. "
    "Do NOT use <think> tags. Do NOT derive your own solution. "
    "Simply analyze and explain the reference solution provided above.\n"
)
#: The official default ``max_reasoning_length`` (``opsd_trainer.py`` line 257).
DEFAULT_ANALYSIS_TOKENS = 4096


def analysis_user_message(problem: str, solution: str) -> str:
    """The user message asking for the analysis (lines 78-85; no newline before the first ``===``)."""
    return (f"Problem: {problem}\n\nHere is a correct reasoning to this problem:"
            f"=== Reference Reasoning Start ===\n{solution}\n=== Reference Reasoning End ===\n\n"
            f"{REASON_FIRST_INSTRUCTION}")


def analysis_prompt_text(tokenizer, problem: str, solution: str) -> str:
    """The analysis prompt: the chat template with the generation prompt, template-default thinking."""
    return tokenizer.apply_chat_template([{"role": "user", "content": analysis_user_message(problem, solution)}],
                                         tokenize=False, add_generation_prompt=True)


def analysis_prompt_ids(tokenizer, problem: str, solution: str) -> list[int]:
    """Token ids of ``analysis_prompt_text``."""
    return encode_prompt(tokenizer, analysis_prompt_text(tokenizer, problem, solution))


def reason_first_teacher_ids(tokenizer, prompt_ids: list[int], analysis_ids: list[int],
                             config: PromptConfig = PromptConfig()) -> list[int]:
    """``[analysis prompt][analysis][transition]`` (+ the student's generation prompt when aligned).

    ``analysis_ids``: what the engine sampled after ``prompt_ids`` (ending in EOS unless cut at
    the length limit), kept as ids.
    """
    # What follows the analysis, as plain text (data_collator.py line 162): the teacher
    # message's own ending, transition + instruction, in the configured wording.
    ids = list(prompt_ids) + list(analysis_ids) + encode_prompt(tokenizer, teacher_continuation(config.teacher_prompt))
    if config.align_generation_prompt:
        ids += encode_prompt(tokenizer, generation_prompt(tokenizer, config.student_enable_thinking))
    return ids
