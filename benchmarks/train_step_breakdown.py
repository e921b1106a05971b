"""Where one PHF training step spends its time: rollout / teacher / student / optimizer / sync.

    python benchmarks/train_step_breakdown.py OUTDIR                  # GPU: Qwen3-1.7B shape, random init
    python benchmarks/train_step_breakdown.py OUTDIR --tiny --steps 2 # CPU smoke run of the same path

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
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHAPES = {
    "1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "tiny": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, tie_word_embeddings=True),
}
PARTS = ("time_rollout_s", "time_teacher_s", "time_student_s", "time_optimizer_s", "time_sync_s", "step_time")


def make_model(out_dir: str, shape: str, dtype) -> str:
    import shutil

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from phf_megatron.tokenizer import shipped_tokenizer_dir

    if os.path.isfile(os.path.join(out_dir, "config.json")):
        return out_dir
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=151936, max_position_embeddings=40960, rope_theta=1e6, **SHAPES[shape])
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen3ForCausalLM(cfg).to(dtype)
    model.save_pretrained(out_dir)
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
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=4, help="global batch (one micro-batch on one process)")
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--backend", default="auto", help="rollout backend (auto: vLLM when installed)")
    p.add_argument("--extra", nargs="*", default=[], help="more --section.field=value overrides")
    args = p.parse_args()

    import torch

    from phf_megatron.training.config_io import config_from_argv
    from phf_megatron.training.distributed import shutdown_distributed
    from phf_megatron.training.loop import Trainer

    os.makedirs(args.out_dir, exist_ok=True)
    gpu = torch.cuda.is_available() and not args.tiny
    dtype = "bfloat16" if gpu else "float32"
    t0 = time.perf_counter()
    hf_dir = make_model(os.path.join(args.out_dir, "model"), "tiny" if args.tiny else "1.7b",
                        torch.bfloat16 if gpu else torch.float32)
    data = make_data(os.path.join(args.out_dir, "toy.jsonl"), 64)
    setup_s = time.perf_counter() - t0
    run_dir = os.path.join(args.out_dir, "run")
    cfg = config_from_argv([
        f"--model.hf_dir={hf_dir}", f"--data.path={data}", f"--run_dir={run_dir}", f"--model.dtype={dtype}",
        "--model.recompute_granularity=null", f"--training.global_batch_size={args.batch}",
        f"--training.micro_batch_size={args.batch}", f"--training.train_iters={args.steps}",
        f"--rollout.max_tokens={args.max_tokens}", f"--rollout.backend={args.backend}",
        "--checkpoint.save_interval=0", "--logging.progress_bar=false", "--data.max_prompt_length=4096",
        *args.extra])
    result = {"shape": "tiny" if args.tiny else "qwen3-1.7b", "dtype": dtype, "batch": args.batch,
              "rollout_max_tokens": args.max_tokens, "model_setup_s": setup_s,
              "device": torch.cuda.get_device_name() if gpu else "cpu", "torch": torch.__version__}
    trainer = Trainer(cfg)
    try:
        result["rollout_backend"] = type(trainer.rollouts.engine).__name__ if trainer.rollouts.engine else None
        steps = []
        for _ in range(args.steps):
            metrics = trainer.train_step()
            trainer.step += 1
            steps.append({k: metrics[k] for k in PARTS + ("loss", "loss_opsd", "loss_flow", "rollout_tokens", "sync_probe_diff")
                          if k in metrics})
            print(json.dumps(steps[-1]), flush=True)
        result["first_step"] = steps[0]
        later = steps[1:] or steps
        result["median_later_steps"] = {k: statistics.median(s[k] for s in later) for k in PARTS}
        if gpu:
            result["peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
        result["steps"] = steps
    finally:
        trainer.close()
        shutdown_distributed()
    with open(os.path.join(args.out_dir, "breakdown.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "steps"}, indent=1))


if __name__ == "__main__":
    main()
