"""Summarise benchmarks/gpu_model_check.sh results: speed-up and memory vs HF, loss agreement.

    python benchmarks/summarize_model_bench.py OUTDIR      # writes OUTDIR/summary.json

Target (issue 3): >= 1.3x HF tokens/s at no more peak memory. Losses of all variants are on
the same weights and batch, so they must agree with HF's within bf16 rounding (2% relative).
"""

import glob
import json
import os
import sys


def summarize(out_dir: str) -> dict:
    runs = {}
    for path in sorted(glob.glob(os.path.join(out_dir, "bench_*.json"))):
        with open(path) as f:
            r = json.load(f)
        runs[r["variant"]] = r
    hf = runs.get("hf")
    summary = {"variants": {}}
    for name, r in runs.items():
        row = {"ok": r.get("ok"), "tokens_per_s": r.get("tokens_per_s"), "peak_mem_gib": r.get("peak_mem_gib"),
               "median_step_ms": 1e3 * r["median_step_s"] if r.get("ok") else None, "error": r.get("error")}
        if hf and hf.get("ok") and r.get("ok"):
            row["speedup_vs_hf"] = r["tokens_per_s"] / hf["tokens_per_s"]
            if r.get("peak_mem_gib") and hf.get("peak_mem_gib"):
                row["mem_ratio_vs_hf"] = r["peak_mem_gib"] / hf["peak_mem_gib"]
            row["loss_rel_diff_vs_hf"] = abs(r["first_loss"] - hf["first_loss"]) / abs(hf["first_loss"])
            row["loss_agrees"] = row["loss_rel_diff_vs_hf"] <= 0.02
            row["meets_target"] = (row["speedup_vs_hf"] >= 1.3 and row.get("mem_ratio_vs_hf", 9) <= 1.0
                                   and row["loss_agrees"])
        summary["variants"][name] = row
    ok = [n for n, row in summary["variants"].items() if row.get("meets_target")]
    summary["variants_meeting_target"] = ok
    logits = os.path.join(out_dir, "logits.json")
    if os.path.isfile(logits):
        with open(logits) as f:
            summary["logits_check_ok"] = json.load(f).get("ok")
    return summary


if __name__ == "__main__":
    out = sys.argv[1]
    result = summarize(out)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))
