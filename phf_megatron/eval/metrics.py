"""Average@k and unbiased pass@k, per benchmark and over the suite.

Average@k (the paper's metric): the mean correctness over k samples per problem, averaged over
problems — ``mean_p c_p / k``. pass@k (Chen et al., 2021, unbiased): with n samples per problem
of which c are correct, ``1 - C(n - c, k) / C(n, k)``, averaged over problems. The suite
average is the unweighted mean over benchmarks (each benchmark counts once, as in the paper's
"Avg." column). A sample's ``correct`` holds one verdict per grader (``config.GRADERS``): Average@k
is computed for each, pass@k for the chosen one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from math import comb

from .config import GRADERS


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n is correct."""
    if not 0 <= c <= n:
        raise ValueError(f"c: must lie in [0, n={n}], got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"k: must lie in [1, n={n}], got {k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


@dataclass
class BenchmarkScore:
    benchmark: str
    problems: int
    samples_per_problem: int
    grader: str
    """the grader of ``average_at_k`` and ``pass_at_k``."""
    average_at_k: float
    """percent."""
    average_at_k_by_grader: dict[str, float]
    """grader -> percent (every grader in ``GRADERS``)."""
    pass_at_k: dict[int, float]
    """k -> percent."""
    boxed_rate: float
    """percent of samples with a \\boxed answer."""
    truncated_rate: float
    """percent of samples that hit the token limit."""

    def to_json(self) -> dict:
        d = asdict(self)
        d["pass_at_k"] = {str(k): v for k, v in self.pass_at_k.items()}
        return d


def score_benchmark(benchmark: str, per_problem: Mapping[str, Sequence[dict]], k: int,
                    pass_ks: Sequence[int] = (1,), grader: str = "official") -> BenchmarkScore:
    """Score one benchmark from its sample records (dicts with ``correct = {grader: bool}``,
    ``boxed``, ``finish_reason``); ``grader`` picks the verdict of ``average_at_k`` and pass@k.

    Every problem must have exactly ``k`` samples (the runner guarantees it for a finished run).
    """
    if not per_problem:
        raise ValueError(f"{benchmark}: no problems to score")
    for pid, samples in per_problem.items():
        if len(samples) != k:
            raise ValueError(f"{benchmark}/{pid}: {len(samples)} samples, expected {k}")
    all_samples = [s for ss in per_problem.values() for s in ss]
    if grader not in GRADERS:
        raise ValueError(f"grader: {grader!r} is not one of {GRADERS}")
    ks = sorted({kk for kk in (*pass_ks, k) if 1 <= kk <= k})
    right = {g: [sum(bool(s["correct"][g]) for s in ss) for ss in per_problem.values()] for g in GRADERS}
    averages = {g: 100.0 * sum(c / k for c in counts) / len(per_problem) for g, counts in right.items()}
    passes = {kk: 100.0 * sum(pass_at_k(k, c, kk) for c in right[grader]) / len(per_problem) for kk in ks}
    return BenchmarkScore(
        benchmark=benchmark, problems=len(per_problem), samples_per_problem=k, grader=grader,
        average_at_k=averages[grader], average_at_k_by_grader=averages, pass_at_k=passes,
        boxed_rate=100.0 * sum(bool(s["boxed"]) for s in all_samples) / len(all_samples),
        truncated_rate=100.0 * sum(s["finish_reason"] == "length" for s in all_samples) / len(all_samples))


def suite_average(scores: Sequence[BenchmarkScore], grader: str | None = None) -> float:
    """Unweighted mean of the benchmarks' Average@k (percent), by ``grader`` (None: each score's own)."""
    if not scores:
        raise ValueError("scores: no benchmarks")
    return sum(s.average_at_k if grader is None else s.average_at_k_by_grader[grader] for s in scores) / len(scores)
