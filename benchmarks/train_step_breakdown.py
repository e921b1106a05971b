"""Where one PHF training step spends its time: rollout / teacher / student / optimizer / sync.

    python -m benchmarks.train_step_breakdown OUTDIR                  # GPU: Qwen3-1.7B shape, random init
    python -m benchmarks.train_step_breakdown OUTDIR --shape 8b --steps 5 --batch 8 --micro-batch 2 \
        --recompute --sleep-mode --check                              # GPU: Qwen3-8B shape on one GPU
    python -m benchmarks.train_step_breakdown OUTDIR --tiny --steps 2 # CPU smoke run of the same path
    python -m benchmarks.train_step_breakdown OUTDIR --method grpo --steps 4 --batch 32 --micro-batch 4 \
        --sleep-mode --check                                          # the GRPO / SFT baselines' steps (issue 22)

``--check`` makes the run fail (exit 1, ``checks`` in the JSON) unless every step has a non-zero
gradient norm and a verified sync (probe within tolerance, and on backends that read weights
back, matching fingerprints). Peak memory (``benchmarks/peak_memory.py``: per-step allocator peaks
and the device's used memory, by our own counter, since vLLM resets torch's; on CUDA also
``allocated_around_sleep_gib``, torch's allocated memory before and after each engine sleep) and the sync times
(``time_sync_s`` per step: wake, push, fingerprints, probe, sleep; ``sync_s``: the ``sync_weights``
call alone) are reported. ``--eager``: vLLM without compilation and CUDA graphs (``rollout.enforce_eager``).

Builds a random-weight HF Qwen3 at the chosen shape with the real Qwen3 tokenizer in
``OUTDIR/model``, writes the embedded toy math set, and runs the real trainer
(``phf_megatron.training.loop.Trainer``: rollouts from the engine, teacher pass, student pass with
L_OPSD + alpha L_flow, Megatron optimizer step, EMA update, verified weight sync) for a few steps on
one process. The first step (start-up, compilation) is reported apart. Writes
``OUTDIR/breakdown.json`` and the run's ``metrics.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from benchmarks.peak_memory import PeakMemory, allocated_around_sleep
from benchmarks.shapes import QWEN3_COMMON, QWEN3_SIZES, QWEN3_VOCAB, qwen3_config

PARTS = ("time_rollout_s", "time_teacher_s", "time_student_s", "time_optimizer_s", "time_sync_s", "step_time")


def make_model(out_dir: str, shape: str, dtype) -> str:
    import shutil

    import torch
    from transformers import Qwen3ForCausalLM

    from phf_megatron.tokenizer import shipped_tokenizer_dir

    if os.path.isfile(os.path.join(out_dir, "config.json")):
        return out_dir
    torch.manual_seed(0)
    # the real tokenizer's ids and the trainer's prompts must fit, the tiny shape included; vLLM-CPU
    # attention needs head_dim >= 32
    tiny = dict(head_dim=32) if shape == "tiny" else {}
    cfg = qwen3_config(shape, vocab_size=QWEN3_VOCAB, max_position_embeddings=QWEN3_COMMON["max_position_embeddings"],
                       **tiny)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen3ForCausalLM(cfg).to(dtype)
    model.save_pretrained(out_dir)
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    for name in os.listdir(shipped_tokenizer_dir()):
        shutil.copy(os.path.join(shipped_tokenizer_dir(), name), out_dir)
    return out_dir


def make_data(path: str, rows: int) -> str:
    from phf_megatron.data.toy import toy_row

    with open(path, "w") as f:
        for i in range(rows):
            r = toy_row(10 + i % 90, 10 + (7 * i) % 90)
            f.write(json.dumps({"problem": r.problem, "solution": r.solution, "answer": r.answer}) + "\n")
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--tiny", action="store_true", help="same as --shape tiny (CPU smoke run)")
    p.add_argument("--shape", choices=sorted(QWEN3_SIZES), default="1.7b")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=4, help="global batch (rollouts per step, one process)")
    p.add_argument("--micro-batch", type=int, default=None, help="micro-batch size (default: the batch)")
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--backend", default="auto", help="rollout backend (auto: vLLM when installed)")
    p.add_argument("--recompute", action="store_true", help="full activation recomputation (8B on one GPU)")
    p.add_argument("--sleep-mode", action="store_true", help="colocated vLLM sleeps while the trainer steps")
    p.add_argument("--gpu-memory-utilization", type=float, default=None, help="vLLM's share of the GPU")
    p.add_argument("--eager", action="store_true",
                   help="vLLM in eager mode (rollout.enforce_eager: no compile / CUDA graphs; starts in seconds)")
    p.add_argument("--name", default=None, help="results file OUTDIR/breakdown_NAME.json (default: the shape)")
    p.add_argument("--check", action="store_true", help="fail unless grad_norm > 0 and the sync verified every step")
    p.add_argument("--method", choices=("phf", "sft", "grpo"), default="phf",
                   help="what a step trains (the trainer's --method): the paper's PHF, or the SFT / GRPO baselines")
    p.add_argument("--group-size", type=int, default=8, help="--method=grpo: completions per prompt (rollout.n)")
    p.add_argument("--extra", nargs="*", default=[], help="more section.field=value overrides (no leading --)")
    args = p.parse_args()
    if args.tiny:
        args.shape = "tiny"

    import torch

    from phf_megatron.training.config_io import config_from_argv
    from phf_megatron.training.distributed import shutdown_distributed
    from phf_megatron.training.loop import Trainer

    os.makedirs(args.out_dir, exist_ok=True)
    gpu = torch.cuda.is_available() and args.shape != "tiny"
    dtype = "bfloat16" if gpu else "float32"
    t0 = time.perf_counter()
    hf_dir = make_model(os.path.join(args.out_dir, f"model_{args.shape}"), args.shape,
                        torch.bfloat16 if gpu else torch.float32)
    data = make_data(os.path.join(args.out_dir, "toy.jsonl"), 64)
    setup_s = time.perf_counter() - t0
    run_dir = os.path.join(args.out_dir, "run")
    cfg = config_from_argv([
        f"--model.hf_dir={hf_dir}", f"--data.path={data}", f"--run_dir={run_dir}", f"--model.dtype={dtype}",
        "--model.recompute_granularity=" + ("full" if args.recompute else "null"),
        f"--training.global_batch_size={args.batch}", f"--training.micro_batch_size={args.micro_batch or args.batch}",
        f"--training.train_iters={args.steps}", f"--rollout.max_tokens={args.max_tokens}",
        f"--rollout.backend={args.backend}", f"--rollout.enable_sleep_mode={str(args.sleep_mode).lower()}",
        *(["--rollout.enforce_eager=true"] if args.eager else []),
        *([f"--rollout.gpu_memory_utilization={args.gpu_memory_utilization}"] if args.gpu_memory_utilization else []),
        "--checkpoint.save_interval=0", "--logging.progress_bar=false", "--data.max_prompt_length=4096",
        f"--method={args.method}",
        # GRPO as examples/train_grpo_qwen3.sh runs it (unfiltered sampling: the vLLM IS correction's need)
        *([f"--rollout.n={args.group_size}", "--rollout.top_k=0", "--rollout.top_p=1.0"] if args.method == "grpo" else []),
        *(e if e.startswith("--") else f"--{e}" for e in args.extra)])
    result = {"shape": f"qwen3-{args.shape}" if args.shape != "tiny" else "tiny", "method": args.method, "dtype": dtype,
              "batch": args.batch, "micro_batch": args.micro_batch or args.batch, "recompute": args.recompute,
              "sleep_mode": args.sleep_mode, "enforce_eager": args.eager or not torch.cuda.is_available(),
              "rollout_max_tokens": args.max_tokens, "model_setup_s": setup_s,
              "device": torch.cuda.get_device_name() if gpu else "cpu", "torch": torch.__version__}
    t_start = time.perf_counter()
    trainer = Trainer(cfg)
    result["trainer_start_s"] = time.perf_counter() - t_start   # model, optimizer, engine start
    peak = PeakMemory()   # after the engine started: vLLM resets torch's peak statistics then
    try:
        engine = getattr(trainer.rollouts, "engine", None) if trainer.rollouts is not None else None
        result["rollout_backend"] = type(engine).__name__ if engine else None
        # torch's allocated memory around each engine sleep (CUDA only, else None): does the allocator's
        # peak count vLLM's sleeping weights and KV cache? (benchmarks/peak_memory.py)
        result["allocated_around_sleep_gib"] = allocated_around_sleep(engine)
        steps = []
        with peak:
            for _ in range(args.steps):
                metrics = trainer.train_step()
                trainer.step += 1
                trainer.sync(metrics)
                peak.step_done()
                steps.append({k: v for k, v in metrics.items() if k in PARTS + ("loss", "loss_opsd", "loss_flow",
                              "rollout_tokens", "grad_norm", "sync_probe_diff", "sync_fingerprint_diff",
                              "sync_fingerprints_checked", "reward", "frac_reward_zero_std") or (k.startswith("time_") and k.endswith("_s"))})
                last_sync = getattr(trainer.rollouts, "last_sync", None) if trainer.rollouts is not None else None
                if last_sync and "time_sync_s" in metrics:
                    steps[-1]["sync_s"] = max(s["seconds"] for s in last_sync)
                print(json.dumps(steps[-1]), flush=True)
        result["first_step"] = steps[0]
        later = steps[1:] or steps
        timed = sorted({k for s in later for k in s if (k.startswith("time_") and k.endswith("_s")) or k == "step_time"})
        result["median_later_steps"] = {k: statistics.median(s[k] for s in later if s.get(k) is not None)
                                        for k in timed if any(s.get(k) is not None for s in later)}
        # GRPO samples once per round of num_iterations steps: the mean is the amortized cost per step
        result["mean_later_steps"] = {k: sum(s.get(k) or 0.0 for s in later) / len(later) for k in timed}
        result.update(peak.result())
        syncs = [s["sync_s"] for s in later if "sync_s" in s]
        result["sync_s_median"] = statistics.median(syncs) if syncs else None
        result["checks"] = step_checks(steps, synced=args.method != "sft")
        result["steps"] = steps
    finally:
        trainer.close()
        shutdown_distributed()
    with open(os.path.join(args.out_dir, f"breakdown_{args.name or args.shape}.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "steps"}, indent=1))
    if args.check and not result["checks"]["ok"]:
        raise SystemExit(f"checks failed: {result['checks']}")


def step_checks(steps: list[dict], synced: bool = True) -> dict:
    """Every step: a finite, non-zero gradient norm (zero allowed where every GRPO group had one reward) and (``synced``: methods with rollouts) a verified
    sync wherever one ran (probe value present, fingerprints matched where the backend reads weights
    back: a mismatch raises in the sync); GRPO syncs once per round of ``num_iterations`` steps."""
    import math

    # a GRPO step whose every group drew one reward has zero advantages: its gradient is exactly 0
    grad_ok = all(math.isfinite(s.get("grad_norm", float("nan")))
                  and (s["grad_norm"] > 0 or s.get("frac_reward_zero_std") == 1.0) for s in steps)
    syncs = [s for s in steps if "time_sync_s" in s]
    probe_ok = not synced or (bool(syncs) and all(s.get("sync_probe_diff") is not None for s in syncs))
    return {"ok": grad_ok and probe_ok, "grad_norm_positive_every_step": grad_ok, "probe_every_step": probe_ok,
            "probe_max": max((s["sync_probe_diff"] for s in steps if s.get("sync_probe_diff") is not None), default=None),
            "fingerprints_checked": [s.get("sync_fingerprints_checked") for s in steps]}


if __name__ == "__main__":
    main()
