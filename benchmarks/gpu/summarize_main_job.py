"""Summarize a ``main_job.sh`` OUT directory into ``summary.json`` and ``summary.md``.

    python benchmarks/gpu/summarize_main_job.py OUT

Reads ``stages.tsv`` (stage, exit code, seconds), ``pytest.xml``, ``breakdown_*.json``
(``train_step_breakdown.py``), ``opsd_reference_step.json``, ``packing_step.json`` and ``sdpa_plans.json``; what is
missing is left out.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import xml.etree.ElementTree as ET

PARTS = ("time_rollout_s", "time_teacher_s", "time_student_s", "time_optimizer_s", "time_sync_s", "step_time")


def _load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _junit(path: str) -> dict:
    """A pytest junit file's counts and the ids of its failed or erroring tests."""
    suite = ET.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    out = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    out["failed"] = [f"{case.get('classname')}::{case.get('name')}" for case in suite.iter("testcase")
                     if case.find("failure") is not None or case.find("error") is not None]
    return out


def summarize(out: str) -> dict:
    summary: dict = {"stages": []}
    if os.path.isfile(os.path.join(out, "stages.tsv")):
        for line in open(os.path.join(out, "stages.tsv")):
            name, rc, secs = line.rstrip("\n").split("\t")
            summary["stages"].append({"stage": name, "exit": int(rc), "seconds": int(secs)})
    for xml in sorted(glob.glob(os.path.join(out, "pytest*.xml"))):   # tests, gputests, vllmtests stages
        summary.setdefault("tests", {})[os.path.basename(xml)[:-4]] = _junit(xml)
    for path in sorted(glob.glob(os.path.join(out, "breakdown_*.json"))):
        b = _load(path)
        if b:
            summary[os.path.basename(path)[:-5]] = {k: b.get(k) for k in (
                "shape", "method", "device", "rollout_backend", "batch", "micro_batch", "rollout_max_tokens", "recompute",
                "sleep_mode", "enforce_eager", "trainer_start_s", "median_later_steps", "mean_later_steps", "first_step", "peak_mem_gib",
                "peak_device_used_gib", "allocated_around_sleep_gib", "sync_s_median", "checks")}
    ref = _load(os.path.join(out, "opsd_reference_step.json"))
    if ref:
        summary["opsd_reference"] = {name: {k: v for k, v in r.items() if k != "traceback"}
                                     for name, r in ref.get("shapes", {}).items()}
    packing = _load(os.path.join(out, "packing_step.json"))
    if packing:
        summary["packing_step"] = {k: packing.get(k) for k in ("device", "attention_kernel", "shape", "layout", "summary")}
        peaks = {v: [s["variants"][v]["peak_gib"] for s in packing.get("steps", [])] for v in packing["summary"]}
        summary["packing_step"]["peak_gib"] = {v: max(p) if p and None not in p else None for v, p in peaks.items()}
    sdpa = _load(os.path.join(out, "sdpa_plans.json"))
    if sdpa:
        summary["sdpa_plans"] = {k: sdpa.get(k) for k in ("torch", "device", "heads", "runs", "varlen")}
    return summary


def sdpa_lines(p: dict) -> list[str]:
    """``benchmarks/sdpa_plans.py``'s result: new lengths vs the same again per backend set, then per-sequence SDPA
    vs varlen flash attention per layer (or why that was skipped), and varlen on grouped heads as they are."""
    lines = ["", f"## Attention at new sequence lengths ({p.get('device')}, torch {p.get('torch')}, heads {p.get('heads')})",
             ""]
    lines += [f"- backends {r['backends']}: " + (f"error ({r['error']})" if "error" in r else
              f"new lengths {r['new_s']:.3f} s, the same again {r['again_s']:.3f} s") for r in p.get("runs") or []]
    v = p.get("varlen") or {}
    if "skipped" in v or "error" in v:
        return lines + [f"- packed attention, varlen: {'skipped' if 'skipped' in v else 'error'} "
                        f"({v.get('skipped') or v['error']})"]
    if v:
        lines.append(f"- packed attention per layer and micro-batch, forward + backward: per-sequence SDPA "
                     f"{v['sdpa_per_sequence_ms_per_layer']:.3f} ms, varlen {v['varlen_ms_per_layer']:.3f} ms, "
                     f"ratio {v['sdpa_over_varlen']:.2f}")
        g = v.get("gqa_without_repeat") or {}
        if "skipped" in g or "error" in g:
            lines.append(f"- varlen on grouped K/V heads without the repeat: {g.get('skipped') or g['error']}")
        elif g:
            lines.append(f"- varlen on grouped K/V heads without the repeat: {g['native_ms']:.3f} ms against "
                         f"{g['repeat_ms']:.3f} ms repeated, largest relative difference {g['max_rel_diff']:.2e}")
    return lines


def to_markdown(s: dict) -> str:
    lines = ["# main_job summary", "", "| stage | exit | seconds |", "|---|---|---|"]
    lines += [f"| {x['stage']} | {x['exit']} | {x['seconds']} |" for x in s["stages"]]
    for name, t in (s.get("tests") or {}).items():
        lines += ["", f"{name}.xml: {t['tests']} tests, {t['failures']} failures, {t['errors']} errors, "
                  f"{t['skipped']} skipped"] + [f"- failed: {case}" for case in t["failed"]]
    for key in sorted(k for k in s if k.startswith("breakdown_")):
        b = s[key]
        med = b.get("median_later_steps") or {}
        lines += ["", f"## {key[len('breakdown_'):]}: {b.get('method') or 'phf'} at {b.get('shape')} "
                      f"({b.get('rollout_backend')}, batch {b.get('batch')}, "
                      f"micro-batch {b.get('micro_batch')}, recompute {b.get('recompute')}, "
                      f"sleep {b.get('sleep_mode')}, "
                      f"eager {b.get('enforce_eager')}; trainer + engine start {b.get('trainer_start_s')} s)",
                  "", "| part | median of later steps (s) | mean (s) |", "|---|---|---|"]
        mean = b.get("mean_later_steps") or {}
        lines += [f"| {p} | {med[p]:.3f} | {mean[p]:.3f} |" if p in mean else f"| {p} | {med[p]:.3f} | |"
                  for p in (*PARTS, *sorted(set(med) - set(PARTS))) if p in med]
        lines += ["", f"peak memory {b.get('peak_mem_gib')} GiB allocated by a step, "
                      f"{b.get('peak_device_used_gib')} GiB used on the device; "
                      f"sync_weights median {b.get('sync_s_median')} s; checks {b.get('checks')}"]
        if b.get("allocated_around_sleep_gib"):   # does the allocator count the sleeping engine? (peak_memory.py)
            last = b["allocated_around_sleep_gib"][-1]
            lines += ["", f"allocated by torch around the last engine sleep: {last['before_gib']:.2f} -> "
                          f"{last['after_gib']:.2f} GiB"]
    for name, r in (s.get("opsd_reference") or {}).items():
        if "error" in r:
            lines += ["", f"## OPSD reference, {name}: {r['error']}"]
            continue
        lines += ["", f"## Step vs official-style HF+PEFT OPSD, {name} ({r['rollout_tokens']} rollout tokens, "
                      f"{r['step_tflop']:.1f} TFLOP/step)", "",
                  "| step | median s | tokens/s | MFU | peak GiB |", "|---|---|---|---|---|"]
        for kind in ("reference", "ours_opsd", "ours_phf"):
            k = r[kind]
            lines.append(f"| {kind} | {k['step_s_median']:.4f} | {k['tokens_per_s']:.0f} | {k['mfu']:.3f} | "
                         f"{k['peak_mem_gib']} |")
        lines += ["", f"ratios {r.get('ratios')}; checks {r.get('checks')}"]
    if "packing_step" in s:
        p = s["packing_step"]
        lines += ["", f"## PHF step padded / packed / packed + budget on the real mix ({p['device']}; attention "
                      f"{p.get('attention_kernel')})", "",
                  "| variant | slowest rank s | speed-up | again: slowest rank s | speed-up | tokens / step | peak GiB | "
                  "loss vs padded |", "|---|---|---|---|---|---|---|---|"]
        for v, r in (p.get("summary") or {}).items():
            peak = (p.get("peak_gib") or {}).get(v)
            again = (f"{r['again_slowest_rank_s']:.3f} | {r['again_speedup_slowest']:.2f}x"
                     if "again_slowest_rank_s" in r else "| ")
            lines.append(f"| {v} | {r['slowest_rank_s']:.3f} | {r['speedup_slowest']:.2f}x | {again} | {r['tokens']:,.0f} | "
                         f"{peak if peak is None else f'{peak:.1f}'} | {r['max_loss_rel_diff']:.1e} |")
    if "sdpa_plans" in s:
        lines += sdpa_lines(s["sdpa_plans"])
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    out = (argv or sys.argv[1:])[0]
    s = summarize(out)
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(s, f, indent=1, default=str)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(to_markdown(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
