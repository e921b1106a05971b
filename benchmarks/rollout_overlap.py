#!/usr/bin/env python
"""Step time of the toy run: on-policy vs overlapped rollouts (``rollout.async_steps``), one vs several engines.

    # CPU: the README's toy run (configs/toy_cpu.yaml, vLLM), async_steps 0 then 1, in one invocation
    PYTHONPATH=. OMP_NUM_THREADS=2 python benchmarks/rollout_overlap.py --out runs/bench_overlap
    # the toy still learns with the overlap: 100 steps each, then held-out accuracy of each export
    PYTHONPATH=. OMP_NUM_THREADS=2 python benchmarks/rollout_overlap.py --out runs/bench_overlap --steps 100 --evaluate
    # a 2-rank world (DP = 2): one engine for both ranks vs one per rank
    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/rollout_overlap.py --out runs/bench_engines --nproc 2 \\
        --variants engines=1 engines=2

The toy inputs (``python -m phf_megatron.toy prepare`` + the Megatron conversion) are made under
``--out`` unless ``--toy`` names an existing ``runs/phf_tiny/toy``. Each variant trains
``--steps`` steps of the toy run from the same start (the trainer as ``examples/train_phf_tiny.sh``
runs it, one checkpoint at the end); reported: the median over the steps after the first of the step time
and its parts from ``metrics.jsonl`` (``time_rollout_s``: getting the step's rollouts, near 0 when
prefetched; ``time_update_s``; ``time_sync_s``, which waits for the prefetch when sampling takes
longer than the update; ``time_engine_s``: the slowest engine's sampling; ``time_engine_sync_s``:
its push + verification), the sum and the slowest of the step times (contention shows there
first), and the staleness seen. ``--evaluate`` adds the held-out greedy accuracy of each
variant's exported student (``python -m phf_megatron.toy evaluate``, as the main job reports it;
``noref_unseen`` is the number PHF must raise) and of the warmed-up start. Unattended: writes
``rollout_overlap.json`` and ``rollout_overlap.md`` (a table for BENCHMARKS.md) to ``--out``. Not a timed test: the numbers
depend on the machine and its load. Measured on the 2-core CPU (issue 16): ``rollout_overlap.md``
next to this file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTS = ("step_time", "time_rollout_s", "time_update_s", "time_sync_s", "time_engine_s", "time_engine_sync_s",
         "time_prefetch_wait_s")
#: the toy's seed (split, init, warm-up) and the trainer's, as the main job's default (SEED=0)
TOY_SEED, TRAINING_SEED = 0, 1234
#: variant name -> trainer flags
VARIANT_FLAGS = {
    "async=0": ["--rollout.async_steps=0"],
    "async=1": ["--rollout.async_steps=1"],
    "engines=1": ["--rollout.num_engines=1"],
    "engines=2": ["--rollout.num_engines=2"],
    "engines=2,async=1": ["--rollout.num_engines=2", "--rollout.async_steps=1"],
}


def prepare_toy(out: str) -> str:
    """The toy task's model, Megatron checkpoint and data under ``out/toy`` (reused when present)."""
    toy = os.path.join(out, "toy")
    if not os.path.isfile(os.path.join(toy, "hf", "model.safetensors")):
        subprocess.run([sys.executable, "-m", "phf_megatron.toy", "prepare", "--out", toy, "--seed", str(TOY_SEED)],
                       check=True, cwd=REPO)
    if not os.path.isdir(os.path.join(toy, "mcore")):
        subprocess.run([sys.executable, "tools/convert/hf_to_mcore.py", "--hf_dir", os.path.join(toy, "hf"),
                        "--out_dir", os.path.join(toy, "mcore"), "--dtype", "fp32"], check=True, cwd=REPO)
    return toy


def run_variant(toy: str, run_dir: str, flags: list[str], steps: int, nproc: int) -> list[dict]:
    """Train ``steps`` toy steps with ``flags``; the metrics of every step."""
    launcher = [sys.executable, "-m", "phf_megatron.train"] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        "-m", "phf_megatron.train"]
    cmd = launcher + [
        "--config", "configs/toy_cpu.yaml", f"--run_dir={run_dir}", f"--model.hf_dir={toy}/hf",
        f"--model.pretrained_checkpoint={toy}/mcore", f"--data.path={toy}/train.jsonl", f"--training.seed={TRAINING_SEED}",
        f"--training.train_iters={steps}", "--checkpoint.save_interval=0", "--logging.tensorboard=false",
        "--logging.progress_bar=false", *flags]
    subprocess.run(cmd, check=True, cwd=REPO)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def evaluate(toy: str, adapter: str | None, out_json: str) -> dict:
    """Held-out greedy accuracy of the toy model (with ``adapter`` applied), as ``toy_eval_*.json``."""
    subprocess.run([sys.executable, "-m", "phf_megatron.toy", "evaluate", "--hf-dir", os.path.join(toy, "hf"),
                    "--seed", str(TOY_SEED), *(["--adapter", adapter] if adapter else []), "--json", out_json],
                   check=True, cwd=REPO)
    with open(out_json) as f:
        return json.load(f)


def summarize(metrics: list[dict]) -> dict:
    later = metrics[1:] or metrics
    out = {k: statistics.median(m[k] for m in later) for k in PARTS if all(m.get(k) is not None for m in later)}
    out["step_time_sum"] = sum(m["step_time"] for m in metrics)
    out["step_time_max"] = max(m["step_time"] for m in later)
    out["staleness"] = sorted({m["rollout_staleness"] for m in metrics})
    out["rollout_tokens"] = statistics.mean(m["rollout_tokens"] for m in metrics)
    return out


def table(results: dict, nproc: int) -> str:
    base = next(iter(results.values()))["step_time"]
    acc = all("accuracy" in r for r in results.values())
    rows = ["| variant | step | × first | rollout | update | sync (+ prefetch wait) | engine sampling | "
            "engine push + verify | sum of steps (slowest) | staleness |" + (" no-ref `unseen` / `seen` after |" if acc else ""),
            "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if acc else "")]
    for name, r in results.items():
        wait = f" ({r['time_prefetch_wait_s']:.2f})" if "time_prefetch_wait_s" in r else ""
        rows.append(f"| {name} ({nproc} rank{'s' if nproc > 1 else ''}) | {r['step_time']:.2f} s | "
                    f"{r['step_time'] / base:.2f} | {r['time_rollout_s']:.2f} s | {r['time_update_s']:.2f} s | "
                    f"{r['time_sync_s']:.2f} s{wait} | {r['time_engine_s']:.2f} s | {r['time_engine_sync_s']:.2f} s | "
                    f"{r['step_time_sum']:.1f} s ({r['step_time_max']:.2f} s) | {r['staleness']} |" + (f" {r['accuracy']['noref_unseen']:.3f} / "
                                              f"{r['accuracy']['noref_seen']:.3f} |" if acc else ""))
    return "\n".join(rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "runs/bench_overlap"))
    parser.add_argument("--toy", help="an existing toy directory (hf/, mcore/, train.jsonl)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--nproc", type=int, default=1)
    parser.add_argument("--evaluate", action="store_true",
                        help="also the held-out accuracy of the start and of each variant's exported student")
    parser.add_argument("--variants", nargs="+", default=["async=0", "async=1"], choices=sorted(VARIANT_FLAGS))
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    toy = os.path.abspath(args.toy or prepare_toy(args.out))
    results, raw = {}, {}
    for name in args.variants:
        t0 = time.perf_counter()
        run_dir = os.path.join(os.path.abspath(args.out), name.replace(",", "_").replace("=", ""))
        raw[name] = run_variant(toy, run_dir, VARIANT_FLAGS[name], args.steps, args.nproc)
        results[name] = summarize(raw[name]) | {"wall_s": time.perf_counter() - t0}
        if args.evaluate:
            results[name]["accuracy"] = evaluate(toy, os.path.join(run_dir, "export", "peft_adapter"),
                                                 os.path.join(run_dir, "toy_eval_after.json"))
        print(name, json.dumps(results[name]), flush=True)
    meta = {"steps": args.steps, "nproc": args.nproc, "machine": platform.node(), "cpus": os.cpu_count(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "date": time.strftime("%Y-%m-%d")}
    md = table(results, args.nproc)
    if args.evaluate:
        b = meta["accuracy_before"] = evaluate(toy, None, os.path.join(args.out, "toy_eval_before.json"))
        first, *rest = results
        md += f"\n\nheld-out no-reference accuracy on `unseen` cells before (the warmed-up start): {b['noref_unseen']:.3f}"
        for n in rest:
            delta = results[n]["accuracy"]["noref_unseen"] - results[first]["accuracy"]["noref_unseen"]
            md += f"; after, {n} minus {first}: {delta:+.3f}"
    with open(os.path.join(args.out, "rollout_overlap.json"), "w") as f:
        json.dump({"meta": meta, "results": results, "metrics": raw}, f, indent=1)
    with open(os.path.join(args.out, "rollout_overlap.md"), "w") as f:
        f.write(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
