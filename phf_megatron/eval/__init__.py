"""Average@k evaluation on AIME 2024 / AIME 2025 / HMMT Feb 2025 (or any problem/answer JSONL).

``grading.is_correct_official`` is official OPSD's grader, ``grading.is_correct`` ours (extended);
``runner.run_eval`` the resumable runner behind ``tools/eval_avg_at_k.py``;
``rewards.reward_correctness`` the official OPSD GRPO baseline's reward (``rewards.gold_answer``: a
training row's reference). Submodules load on first use (``lazy_exports``): ``eval.config``
imports without torch, so the command line answers ``--help`` at once.
"""

from ..lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "benchmarks": ("KNOWN_BENCHMARKS", "Problem", "load_benchmark"),
    "config": ("GRADERS", "EvalConfig", "sample_seed"),
    "grading": ("grade", "is_correct", "is_correct_official", "last_boxed"),
    "metrics": ("pass_at_k", "score_benchmark", "suite_average"),
    "rewards": ("gold_answer", "reward_correctness"),
    "runner": ("run_eval",),
})
