"""Average@k and unbiased pass@k, per benchmark and over the suite.

Average@k (the paper's metric): the mean correctness over k samples per problem, averaged over
problems — ``mean_p c_p / k``. pass@k (Chen et al., 2021, unbiased): with n samples per problem
of which c are correct, ``1 - C(n - c, k) / C(n, k)``, averaged over problems. The suite
average is the unweighted mean over benchmarks (each benchmark counts once, as in the paper's
"Avg." column).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from math import comb


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
    average_at_k: float
    """percent."""
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
                    pass_ks: Sequence[int] = (1,)) -> BenchmarkScore:
    """Score one benchmark from its sample records (dicts with ``correct``, ``boxed``, ``finish_reason``).

    Every problem must have exactly ``k`` samples (the runner guarantees it for a finished run).
    """
    if not per_problem:
        raise ValueError(f"{benchmark}: no problems to score")
    for pid, samples in per_problem.items():
        if len(samples) != k:
            raise ValueError(f"{benchmark}/{pid}: {len(samples)} samples, expected {k}")
    all_samples = [s for ss in per_problem.values() for s in ss]
    ks = sorted({kk for kk in (*pass_ks, k) if 1 <= kk <= k})
    avg = sum(sum(bool(s["correct"]) for s in ss) / k for ss in per_problem.values()) / len(per_problem)
    passes = {kk: 100.0 * sum(pass_at_k(k, sum(bool(s["correct"]) for s in ss), kk)
                              for ss in per_problem.values()) / len(per_problem) for kk in ks}
    return BenchmarkScore(
        benchmark=benchmark, problems=len(per_problem), samples_per_problem=k, average_at_k=100.0 * avg,
        pass_at_k=passes,
        boxed_rate=100.0 * sum(bool(s["boxed"]) for s in all_samples) / len(all_samples),
        truncated_rate=100.0 * sum(s["finish_reason"] == "length" for s in all_samples) / len(all_samples))


def suite_average(scores: Sequence[BenchmarkScore]) -> float:
    """Unweighted mean of the benchmarks' Average@k (percent)."""
    if not scores:
        raise ValueError("scores: no benchmarks")
    return sum(s.average_at_k for s in scores) / len(scores)
