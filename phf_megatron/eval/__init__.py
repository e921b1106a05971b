"""Average@k evaluation on AIME 2024 / AIME 2025 / HMMT Feb 2025 (or any problem/answer JSONL).

``grading.is_correct_official`` is official OPSD's grader, ``grading.is_correct`` ours (extended);
``runner.run_eval`` the resumable runner behind ``tools/eval_avg_at_k.py``.
"""

from .benchmarks import KNOWN_BENCHMARKS, Problem, load_benchmark
from .config import EvalConfig, sample_seed
from .grading import GRADERS, grade, is_correct, is_correct_official, last_boxed
from .metrics import pass_at_k, score_benchmark, suite_average
from .runner import run_eval

__all__ = ["EvalConfig", "GRADERS", "KNOWN_BENCHMARKS", "Problem", "grade", "is_correct", "is_correct_official",
           "last_boxed", "load_benchmark", "pass_at_k", "run_eval", "sample_seed", "score_benchmark", "suite_average"]
