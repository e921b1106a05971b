"""The evaluation's outputs: a table on stdout, summary.json, and an optional bar plot.

The table has one Average@k column per grader: ``Avg@k (official) %``, official OPSD's grader (the
paper's numbers), and ``Avg@k (extended) %``, ours; every score in it is a percentage (0-100).
pass@k, the plot and ``suite_average_at_k`` follow ``EvalConfig.grader``. summary.json names the math-verify version that graded (the
official environment pins 0.8.0) and, per benchmark, the data it came from (``data_sources``: the file
and its sha256, or the Hub dataset at its revision, "main (unpinned)" unless ``--data_revision``).
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field
from importlib.metadata import version

from ..output_files import write_json
from .benchmarks import Problem
from .config import GRADERS, EvalConfig
from .metrics import BenchmarkScore, score_benchmark, suite_average
from .records import grade_record, needs_grading

SUMMARY = "summary.json"
PLOT = "avg_at_k.png"
#: math-verify in official OPSD's environment.yml (7448751); ours is whatever is installed.
OFFICIAL_MATH_VERIFY = "0.8.0"


@dataclass
class Summary:
    scores: list[BenchmarkScore]
    suite_average_at_k: float
    suite_average_by_grader: dict[str, float]
    grader: str
    math_verify_version: str
    k: int
    samples: int
    generated: int
    duplicates_ignored: int
    seconds: float
    summary_path: str
    plot_path: str | None
    data_sources: dict[str, dict] = field(default_factory=dict)

    def table(self) -> str:
        ks = sorted({k for s in self.scores for k in s.pass_at_k})
        head = ["benchmark", "problems", *[f"Avg@{self.k} ({g}) %" for g in GRADERS], *[f"pass@{k} %" for k in ks],
                "boxed %", "truncated %"]                                  # every score is a percentage
        rows = [[s.benchmark, str(s.problems), *[f"{s.average_at_k_by_grader[g]:.2f}" for g in GRADERS],
                 *[f"{s.pass_at_k[k]:.2f}" for k in ks], f"{s.boxed_rate:.1f}", f"{s.truncated_rate:.1f}"]
                for s in self.scores]
        rows.append(["suite average", "", *[f"{self.suite_average_by_grader[g]:.2f}" for g in GRADERS],
                     *[""] * len(ks), "", ""])
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        fmt = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
        note = (f"official: OPSD eval/evaluate_math.py (the paper's numbers); extended: ours. pass@k by the "
                f"{self.grader} grader; math-verify {self.math_verify_version} (official: {OFFICIAL_MATH_VERIFY})")
        hub = sorted({f"{s['hub']}@{s['revision']}" for s in self.data_sources.values() if "hub" in s})
        data = [f"data from the Hugging Face Hub: {', '.join(hub)}"] if hub else []   # summary.json: every set's source
        return "\n".join([fmt(head), "-" * len(fmt(head)), *map(fmt, rows), note, *data])


def summarize(config: EvalConfig, problems: dict[str, list[Problem]], records: dict, *, duplicates: int,
              generated: int, seconds: float, model_dir: str, backend: str,
              data_sources: dict[str, dict] | None = None) -> Summary:
    """Score the benchmarks of ``config`` from ``records`` and write summary.json (+ plot);
    ``data_sources``: ``benchmarks.load_problems``' record of where each benchmark came from."""
    by_problem: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    answers = {(p.benchmark, p.id): p.answer for ps in problems.values() for p in ps}
    for (bench, pid, idx), rec in records.items():
        if idx < config.n:
            gold = answers.get((bench, pid), rec.get("gold"))
            if needs_grading(rec, config.require_boxed, gold):        # another rule or answer, an older record
                rec = grade_record({**rec, "gold": gold}, config.require_boxed)
            by_problem[bench][pid].append(rec)
    scores = []
    for bench, ps in problems.items():
        per = {p.id: by_problem[bench][p.id] for p in ps}
        missing = [pid for pid, ss in per.items() if len(ss) < config.n]
        if missing:
            raise RuntimeError(f"{bench}: {len(missing)} problems lack samples (e.g. {missing[0]}); rerun to resume")
        scores.append(score_benchmark(bench, per, config.n, config.pass_ks, grader=config.grader))
    summary_path = os.path.join(config.out_dir, SUMMARY)
    plot_path = plot_scores(scores, config.n, os.path.join(config.out_dir, PLOT)) if config.plot else None
    summary = Summary(scores, suite_average(scores), {g: suite_average(scores, g) for g in GRADERS}, config.grader,
                      version("math-verify"), config.n, sum(s.problems for s in scores) * config.n,
                      generated, duplicates, seconds, summary_path, plot_path, data_sources or {})
    write_json(summary_path, {
        "k": config.n, "grader": config.grader, "suite_average_at_k": summary.suite_average_at_k,
        "suite_average_at_k_by_grader": summary.suite_average_by_grader,
        "math_verify_version": summary.math_verify_version, "official_math_verify_version": OFFICIAL_MATH_VERIFY,
        "benchmarks": {s.benchmark: s.to_json() for s in scores}, "data_sources": summary.data_sources,
        "samples": summary.samples, "generated_this_run": generated, "duplicates_ignored": duplicates,
        "seconds_this_run": seconds, "model_dir": model_dir, "backend": backend, "config": config.to_json(),
    }, indent=1)
    return summary


def plot_scores(scores: list[BenchmarkScore], k: int, path: str) -> str:
    """Bar chart of Average@k per benchmark and the suite average (PNG)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [s.benchmark for s in scores] + ["average"]
    values = [s.average_at_k for s in scores] + [suite_average(scores)]
    fig, ax = plt.subplots(figsize=(1.4 * len(names) + 1.5, 3.2))
    bars = ax.bar(names, values, color=["#4C72B0"] * len(scores) + ["#55A868"])
    ax.bar_label(bars, fmt="%.1f")
    ax.set_ylabel(f"Average@{k} (%), {scores[0].grader} grader")
    ax.set_ylim(0, max(100.0, max(values) * 1.15))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
