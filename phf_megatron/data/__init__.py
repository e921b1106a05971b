"""Data for OPSD/PHF: math sets and row validation, a resumable sampler, the OPSD prompts,
the student/teacher batch builder (rollout alignment), and an embedded toy task."""

from ..tokenizer import load_qwen3_tokenizer
from .batch import DistillBatch, build_distill_batch
from .prompts import (
    PromptConfig,
    PromptPair,
    build_prompt_pair,
    generation_prompt,
    render_student_prompt,
    render_teacher_prompt,
    student_user_message,
    teacher_user_message,
)
from .rows import BadRowError, FieldNames, MathRow, validate_row
from .sampler import EpochSampler, epoch_permutation
from .sources import MathDataset, load_math_dataset
from .toy import SubVocab, ToySplit, extract_boxed, grade_toy, make_toy_split, toy_row, toy_sub_vocab

__all__ = [
    "BadRowError", "DistillBatch", "EpochSampler", "FieldNames", "MathDataset", "MathRow",
    "PromptConfig", "PromptPair", "SubVocab", "ToySplit", "build_distill_batch", "build_prompt_pair",
    "epoch_permutation", "extract_boxed", "generation_prompt", "grade_toy", "load_math_dataset",
    "load_qwen3_tokenizer", "make_toy_split", "render_student_prompt", "render_teacher_prompt",
    "student_user_message", "teacher_user_message", "toy_row", "toy_sub_vocab", "validate_row",
]
