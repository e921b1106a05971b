"""Where one PHF training step spends its time: rollout / teacher / student / optimizer / sync.

    python -m benchmarks.train_step_breakdown OUTDIR                  # GPU: Qwen3-1.7B shape, random init
    python -m benchmarks.train_step_breakdown OUTDIR --shape 8b --steps 5 --batch 8 --micro-batch 2 \
        --recompute --sleep-mode --check                              # GPU: Qwen3-8B shape on one GPU
    python -m benchmarks.train_step_breakdown OUTDIR --tiny --steps 2 # CPU smoke run of the same path

``--check`` makes the run fail (exit 1, ``checks`` in the JSON) unless every step has a non-zero
gradient norm and a verified sync (probe within tolerance, and on backends that read weights
back, matching fingerprints). Peak memory (``benchmarks/peak_memory.py``: per-step allocator peaks
and the device's used memory, by our own counter, since vLLM resets torch's) and the sync times
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

from benchmarks.peak_memory import PeakMemory
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
    p.add_argument("--extra", nargs="*", default=[], help="more --section.field=value overrides")
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
        *args.extra])
    result = {"shape": f"qwen3-{args.shape}" if args.shape != "tiny" else "tiny", "dtype": dtype,
              "batch": args.batch, "micro_batch": args.micro_batch or args.batch, "recompute": args.recompute,
              "sleep_mode": args.sleep_mode, "enforce_eager": args.eager or not torch.cuda.is_available(),
              "rollout_max_tokens": args.max_tokens, "model_setup_s": setup_s,
              "device": torch.cuda.get_device_name() if gpu else "cpu", "torch": torch.__version__}
    t_start = time.perf_counter()
    trainer = Trainer(cfg)
    result["trainer_start_s"] = time.perf_counter() - t_start   # model, optimizer, engine start
    peak = PeakMemory()   # after the engine started: vLLM resets torch's peak statistics then
    try:
        result["rollout_backend"] = type(trainer.rollouts.engine).__name__ if trainer.rollouts.engine else None
        steps = []
        with peak:
            for _ in range(args.steps):
                metrics = trainer.train_step()
                trainer.step += 1
                trainer.sync(metrics)
                peak.step_done()
                steps.append({k: metrics[k] for k in PARTS + ("loss", "loss_opsd", "loss_flow", "rollout_tokens",
                                                               "grad_norm", "sync_probe_diff", "sync_fingerprint_diff",
                                                               "sync_fingerprints_checked") if k in metrics})
                steps[-1]["sync_s"] = max(s["seconds"] for s in trainer.rollouts.last_sync)
                print(json.dumps(steps[-1]), flush=True)
        result["first_step"] = steps[0]
        later = steps[1:] or steps
        result["median_later_steps"] = {k: statistics.median(s[k] for s in later) for k in PARTS}
        result.update(peak.result())
        result["sync_s_median"] = statistics.median(s["sync_s"] for s in later)
        result["checks"] = step_checks(steps)
        result["steps"] = steps
    finally:
        trainer.close()
        shutdown_distributed()
    with open(os.path.join(args.out_dir, f"breakdown_{args.name or args.shape}.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "steps"}, indent=1))
    if args.check and not result["checks"]["ok"]:
        raise SystemExit(f"checks failed: {result['checks']}")


def step_checks(steps: list[dict]) -> dict:
    """Every step: a finite, non-zero gradient norm and a verified sync (probe value present,
    fingerprints matched where the backend reads weights back: a mismatch raises in the sync)."""
    import math

    grad_ok = all(math.isfinite(s.get("grad_norm", float("nan"))) and s["grad_norm"] > 0 for s in steps)
    probe_ok = all(s.get("sync_probe_diff") is not None for s in steps)
    return {"ok": grad_ok and probe_ok, "grad_norm_positive_every_step": grad_ok, "probe_every_step": probe_ok,
            "probe_max": max((s["sync_probe_diff"] for s in steps if s.get("sync_probe_diff") is not None), default=None),
            "fingerprints_checked": [s.get("sync_fingerprints_checked") for s in steps]}


if __name__ == "__main__":
    main()
