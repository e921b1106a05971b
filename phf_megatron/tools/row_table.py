"""The rows' results as the paper's table: ``table.json`` and ``table.md`` under ``paper_table``'s ``--out``.

``build_table`` reads each row's state (not run, trained to step N, trained, evaluated with other settings, done)
and, for a finished row, its eval summary beside the paper's numbers (``paper_numbers.json``); ``table_markdown``
renders it; ``write_table`` writes both.
"""

from __future__ import annotations

import os

from ..input_files import read_json
from .paper_recipes import BENCHMARKS, TOY_BENCHMARKS, PaperNumbers
from .paper_rows import Row, eval_differs, result_value, trained_step, training_finished

TOY_NOTE = "n/a: toy task, not comparable"


def read_scores(row: Row, toy: bool) -> dict | None:
    """Our numbers for a finished row: ``{benchmark: percent, ..., "average": percent}``; a file of another
    shape (a list, a key missing, a number where an object goes) is one line naming it and the key."""
    if not os.path.isfile(row.eval_result):
        return None
    data = read_json(row.eval_result)   # damaged: one line naming it
    if toy:  # greedy held-out no-reference accuracy (phf_megatron/toy/evaluate.py)
        scores = {b: 100.0 * result_value(data, row.eval_result, f"noref_{b}") for b in TOY_BENCHMARKS}
        return {**scores, "average": sum(scores.values()) / len(scores)}
    benchmarks = result_value(data, row.eval_result, "benchmarks", number=False)
    scores = {b: result_value(data, row.eval_result, "benchmarks", b, "average_at_k_by_grader", "official")
              for b in BENCHMARKS if b in benchmarks}
    return {**scores, "average": result_value(data, row.eval_result, "suite_average_at_k_by_grader", "official")}


def build_table(args, rows: list[Row]) -> dict:
    paper = PaperNumbers.load()
    out = {"scale": args.scale, "step": args.step, "k": args.k, "toy": args.toy,
           "benchmarks": list(TOY_BENCHMARKS if args.toy else BENCHMARKS), "rows": {}}
    for row in rows:
        ours, status = None, "not run"
        if row.train and (at := trained_step(row)) is not None and at < args.step:
            status = f"trained to step {at} of {args.step}"   # stopped short (preempted, failed): a rerun resumes
        elif row.train and training_finished(row, args.step) and not os.path.isfile(row.eval_result):
            status = "trained, not evaluated"   # was "not run": its eval (a separate job) is what is left
        elif training_finished(row, args.step) and os.path.isfile(row.eval_result):
            differs = eval_differs(row, args.k, args.toy)   # a --limit smoke, another --n: not the row's numbers
            if differs:
                status = f"evaluated with other settings ({differs})"
            else:
                ours, status = read_scores(row, args.toy), "done"
        ref = None if args.toy else paper.row(args.scale, row.name)
        entry = {"ours": ours, "paper": ref, "run_dir": row.run_dir, "eval": row.eval_result, "status": status}
        if args.toy:
            entry["paper_note"] = TOY_NOTE
        if ours is not None and ref is not None:
            entry["delta_average"] = round(ours["average"] - ref["average"], 2)
        out["rows"][row.name] = entry
    return out


def _cell(ours: dict | None, ref: dict | None, key: str, toy: bool) -> str:
    a = "—" if ours is None or key not in ours else f"{ours[key]:.2f}"
    if toy:
        return a
    return f"{a} / {'—' if ref is None or key not in ref else f'{ref[key]:.2f}'}"


def table_markdown(table: dict) -> str:
    toy, bench = table["toy"], table["benchmarks"]
    if toy:
        head = (f"# The paper's rows on the toy task (checkpoint {table['step']})\n\n"
                "Held-out greedy no-reference accuracy (%) of the toy's evaluation (`python -m phf_megatron.toy "
                "evaluate`): `unseen` = cells the warm-up never showed, `seen` = the others; average = their mean. "
                f"Paper numbers: {TOY_NOTE}.\n")
        cols = ["row", *bench, "average", "status"]
    else:
        head = (f"# The paper's tables on our stack: Qwen3 {table['scale']}, checkpoint {table['step']}, "
                f"Average@{table['k']} (official grader)\n\nEach cell: ours / paper (percent); Δ = ours − paper on "
                "the suite average. Paper: Table 1 (tab:main) and, for the ablation rows (average only), Table 2 "
                "(tab:ablations); sources in `phf_megatron/tools/paper_numbers.json`.\n")
        cols = ["row", *bench, "average", "Δ average", "status"]
    lines = [head, "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for name, e in table["rows"].items():
        cells = [name, *[_cell(e["ours"], e["paper"], b, toy) for b in bench], _cell(e["ours"], e["paper"], "average", toy)]
        if not toy:
            cells.append(f"{e['delta_average']:+.2f}" if "delta_average" in e else "—")
        cells.append(e["status"])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_table(args, rows: list[Row]) -> dict:
    from ..output_files import write_json, write_text

    table = build_table(args, rows)
    write_json(os.path.join(args.out, "table.json"), table, indent=1)
    write_text(os.path.join(args.out, "table.md"), table_markdown(table))
    return table
