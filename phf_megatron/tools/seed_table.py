"""Each row's mean ± standard deviation over the toy table's seeds (``paper_table --toy --seeds 0,1,2,3,4``).

``seeds_summary({seed: table.json of that seed})`` keeps, per row and column, the values of the seeds
whose row finished, their mean and their sample standard deviation (n − 1; none for one seed);
``seeds_markdown`` renders it (`mean ± sd (n)`, then every seed's value).
"""

from __future__ import annotations

import math


def mean_sd(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (n − 1 in the denominator; None for a single value)."""
    mean = math.fsum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))


def seeds_summary(tables: dict[int, dict]) -> dict:
    """``{"seeds": [...], "columns": [...], "rows": {row: {column: {"values": {seed: v}, "mean", "sd", "n"}}}}``
    from each seed's ``table.json``; a row a seed has not finished counts for that seed in no column."""
    seeds = sorted(tables)
    first = tables[seeds[0]]
    columns = [*first["benchmarks"], "average"]
    rows: dict[str, dict] = {}
    for name in first["rows"]:
        cells = {}
        for col in columns:
            values = {s: tables[s]["rows"][name]["ours"][col] for s in seeds
                      if name in tables[s]["rows"] and tables[s]["rows"][name]["ours"] is not None}
            mean, sd = mean_sd(list(values.values())) if values else (None, None)
            cells[col] = {"values": values, "mean": mean, "sd": sd, "n": len(values)}
        rows[name] = cells
    return {"seeds": seeds, "columns": columns, "step": first["step"], "rows": rows}


def _cell(cell: dict) -> str:
    if not cell["n"]:
        return "—"
    sd = "" if cell["sd"] is None else f" ± {cell['sd']:.2f}"
    return f"{cell['mean']:.2f}{sd} ({cell['n']})"


def seeds_markdown(summary: dict) -> str:
    seeds, columns = summary["seeds"], summary["columns"]
    lines = [f"# The paper's rows on the toy task over seeds {', '.join(map(str, seeds))} (checkpoint {summary['step']})\n",
             "Held-out greedy no-reference accuracy (%): mean ± sample standard deviation (number of seeds "
             "whose row finished); then the average of each seed.\n",
             "| row | " + " | ".join(columns) + " | " + " | ".join(f"seed {s}" for s in seeds) + " |",
             "|" + "---|" * (1 + len(columns) + len(seeds))]
    for name, cells in summary["rows"].items():
        per_seed = [f"{cells['average']['values'][s]:.2f}" if s in cells["average"]["values"] else "—" for s in seeds]
        lines.append(f"| {name} | " + " | ".join(_cell(cells[c]) for c in columns) + " | " + " | ".join(per_seed) + " |")
    return "\n".join(lines) + "\n"
