#!/usr/bin/env python
"""Average@k of a checkpoint on AIME 2024, AIME 2025 and HMMT Feb 2025 (the paper's metric).

    # a HF model directory, paper settings (n=12, T=1.0, top-p 0.95, 38,912 new tokens, thinking),
    # graded by the official OPSD grader and ours: columns Avg@12 (official) and Avg@12 (extended)
    python tools/eval_avg_at_k.py --model /models/Qwen3-1.7B --data-dir ../shared/data --out-dir runs/eval_q17b

    # base + PEFT adapter; a Megatron-Core checkpoint; any JSONL with problem/answer fields
    python tools/eval_avg_at_k.py --model /models/Qwen3-1.7B --adapter runs/phf/adapter --out-dir runs/eval_phf
    python tools/eval_avg_at_k.py --megatron-checkpoint runs/phf/iter_0000200 --model /models/Qwen3-1.7B ...
    python tools/eval_avg_at_k.py --model DIR --benchmarks my_set.jsonl --n 4 --out-dir runs/eval_mine

Rerunning the same command resumes: finished samples are kept, only missing ones are generated.
Outputs in --out-dir: samples.rank*.jsonl (one line per sample), summary.json, and with --plot
avg_at_k.png. Backend: vLLM when installed, otherwise transformers; one engine replica per GPU
(data parallel) unless --data-parallel says otherwise.
"""

from __future__ import annotations

import argparse
import sys

from phf_megatron.eval.config import PAPER_BENCHMARKS, EvalConfig
from phf_megatron.eval.runner import run_eval


def parse_args(argv=None) -> EvalConfig:
    d = EvalConfig.__dataclass_fields__
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="HF model directory (base model with --adapter)")
    p.add_argument("--adapter", help="PEFT adapter directory to merge into --model")
    p.add_argument("--megatron-checkpoint", help="Megatron-Core checkpoint (converted to HF on the fly)")
    p.add_argument("--benchmarks", nargs="+", default=list(PAPER_BENCHMARKS),
                   help="names (aime24 aime25 hmmt25) or .jsonl paths (default: the paper's three)")
    p.add_argument("--data-dir", help="directory holding <name>.jsonl; without it names load from the HF Hub")
    p.add_argument("--out-dir", required=True, help="run directory (rerun to resume)")
    p.add_argument("--n", type=int, default=d["n"].default, help="samples per problem, the k of Average@k (12)")
    p.add_argument("--temperature", type=float, default=d["temperature"].default)
    p.add_argument("--top-p", type=float, default=d["top_p"].default,
                   help="default: official, 0.95 with thinking, 0.8 with --no-thinking")
    p.add_argument("--top-k", type=int, default=d["top_k"].default, help="-1 = off")
    p.add_argument("--max-new-tokens", type=int, default=d["max_new_tokens"].default)
    p.add_argument("--no-thinking", dest="thinking", action="store_false", help="Qwen3 non-thinking mode")
    p.add_argument("--seed", type=int, default=d["seed"].default)
    p.add_argument("--backend", choices=["auto", "vllm", "hf"], default="auto")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=d["dtype"].default)
    p.add_argument("--max-model-len", type=int, default=None,
                   help="default: official, 40960 with thinking, 32768 with --no-thinking (at most the model's)")
    p.add_argument("--data-parallel", type=int, default=0,
                   help="engine replicas, each on --tensor-parallel-size GPUs (0 = fill the visible GPUs)")
    p.add_argument("--batch-size", type=int, default=d["batch_size"].default,
                   help="samples per engine call (each call's results are saved before the next)")
    p.add_argument("--grader", choices=["official", "extended"], default=d["grader"].default,
                   help="grader of pass@k, the suite average and the plot (both Avg@k columns are always shown)")
    p.add_argument("--grade-unboxed", dest="require_boxed", action="store_false",
                   help="extended grader: grade outputs without \\boxed by math-verify's fallback extraction "
                        "(official: wrong)")
    p.add_argument("--limit", type=int, default=None, help="only the first N problems of each benchmark")
    p.add_argument("--pass-k", type=int, nargs="*", default=[1], help="pass@k values besides pass@n")
    p.add_argument("--plot", action="store_true", help="write avg_at_k.png")
    p.add_argument("--gpu-memory-utilization", type=float, default=None)
    p.add_argument("--tensor-parallel-size", type=int, default=None)
    a = p.parse_args(argv)
    engine_kwargs = {k: v for k, v in (("gpu_memory_utilization", a.gpu_memory_utilization),
                                       ("tensor_parallel_size", a.tensor_parallel_size)) if v is not None}
    return EvalConfig(
        out_dir=a.out_dir, model=a.model, adapter=a.adapter, megatron_checkpoint=a.megatron_checkpoint,
        benchmarks=tuple(a.benchmarks), data_dir=a.data_dir, n=a.n, temperature=a.temperature, top_p=a.top_p,
        top_k=a.top_k, max_new_tokens=a.max_new_tokens, thinking=a.thinking, seed=a.seed, backend=a.backend,
        dtype=a.dtype, max_model_len=a.max_model_len, data_parallel=a.data_parallel, batch_size=a.batch_size,
        grader=a.grader, require_boxed=a.require_boxed, limit=a.limit, pass_ks=tuple(a.pass_k), plot=a.plot,
        engine_kwargs=engine_kwargs)


def main(argv=None) -> int:
    config = parse_args(argv)
    try:
        summary = run_eval(config)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(summary.table())
    print(f"\nsummary: {summary.summary_path}" + (f"\nplot: {summary.plot_path}" if summary.plot_path else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
