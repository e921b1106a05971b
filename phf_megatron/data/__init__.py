"""Data for OPSD/PHF: math sets and row validation, a resumable sampler, the OPSD prompts,
the student/teacher batch builder (rollout alignment), and an embedded toy task.

Submodules load on first use (``lazy_exports``): ``data.prompts`` imports without torch or
transformers, so the command line answers ``--help`` at once.
"""

from ..lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "..tokenizer": ("load_qwen3_tokenizer",),
    "batch": ("DistillBatch", "build_distill_batch"),
    "prompts": ("PromptConfig", "PromptPair", "build_prompt_pair", "generation_prompt", "render_student_prompt",
                "render_teacher_prompt", "student_user_message", "teacher_user_message"),
    "rows": ("BadRowError", "FieldNames", "MathRow", "validate_row"),
    "sampler": ("EpochSampler", "epoch_permutation"),
    "sources": ("MathDataset", "load_math_dataset"),
    "toy": ("SubVocab", "ToySplit", "extract_boxed", "grade_toy", "make_toy_split", "toy_row", "toy_sub_vocab"),
})
