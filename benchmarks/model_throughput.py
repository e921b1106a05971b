"""Training throughput of Qwen3 (fwd + bwd, bf16): our Megatron-Core model vs HF transformers SDPA.

    python -m benchmarks.model_throughput --variant hf mcore_fused --out-dir OUT     # GPU, 1.7B shape
    python -m benchmarks.model_throughput --tiny --variant hf mcore_plain --out-dir OUT  # CPU smoke run

Shape (default): Qwen3-1.7B — 28 layers, hidden 2048, 16 heads / 8 KV groups, head_dim 128,
FFN 6144, vocabulary 151,936, tied embeddings — random init, batch 4 x 1536 tokens. One step
= zero grads, forward, mean cross entropy over all tokens, backward (no optimizer; gradients
kept in the parameter dtype on both sides). Reported: median step time over ``--steps``
timed steps after ``--warmup`` steps, tokens/s, and peak ``torch.cuda.max_memory_allocated``.

Variants (the Megatron ones use TP=1 and our layer spec; weights copied from the same HF init,
so every variant's loss on the same batch is comparable):
* ``hf``: ``Qwen3ForCausalLM`` with ``attn_implementation="sdpa"``, loss through ``labels=``;
* ``mcore_plain``: local spec + SDPA core attention, Megatron's own loss (``labels=``);
* ``mcore_chunked``: + chunked vocabulary-parallel linear cross entropy (``models/lm_head.py``);
* ``mcore_fused``: + compiled RMSNorm / RoPE / SwiGLU (``fused=True``);
* ``mcore_compiled``: + ``compile_layers=True`` (each decoder layer ``torch.compile``'d).

Writes ``bench_<variant>.json`` per variant into ``--out-dir`` (an error is recorded there too,
so one failing variant does not hide the others).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import traceback

import torch

from benchmarks import shapes

VARIANTS = ("hf", "mcore_plain", "mcore_chunked", "mcore_fused", "mcore_compiled")
MCORE_OPTIONS = {
    "mcore_plain": dict(options={}, chunked=False),
    "mcore_chunked": dict(options={}, chunked=True),
    "mcore_fused": dict(options={"fused": True}, chunked=True),
    "mcore_compiled": dict(options={"fused": True, "compile_layers": True}, chunked=True),
}


def qwen3_config(tiny: bool):
    """Qwen3-1.7B's shape, or (``--tiny``) the tiny one cut to 2 layers (the CPU smoke run of four
    variants, compiled ones included, stays short) with head_dim 32 != hidden / heads."""
    if tiny:
        return shapes.qwen3_config("tiny", num_hidden_layers=2, head_dim=32, vocab_size=256, max_position_embeddings=256)
    return shapes.qwen3_config("1.7b")


def _device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def hf_model(config, dtype, seed: int = 0):
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    with _device():
        model = Qwen3ForCausalLM._from_config(config, attn_implementation="sdpa", dtype=dtype)
    model.config.use_cache = False
    return model.train()


def profile_top(step, rows: int = 25) -> str:
    """One profiled step: the kernels that take the most device time (for the next round of tuning)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        step()
        _sync()
    key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=60)


def measure(step, warmup: int, steps: int, profile: bool = False) -> dict:
    """Median step time, peak memory; ``step()`` returns the loss (a 0-dim tensor)."""
    losses = [float(step()) for _ in range(warmup)]
    _sync()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = step()
        _sync()
        times.append(time.perf_counter() - start)
        losses.append(float(loss))
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    result = dict(step_s=times, median_step_s=statistics.median(times), peak_mem_gib=peak,
                  losses=losses, first_loss=losses[0])
    if profile:
        result["profile_top"] = profile_top(step)
    return result


def bench_hf(config, ids, dtype, args) -> dict:
    model = hf_model(config, dtype)

    def step():
        model.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss.detach()

    return measure(step, args.warmup, args.steps, args.profile)


def bench_mcore(variant, config, ids, dtype, args) -> dict:
    from phf_megatron.convert.live_model import load_hf_weights
    from phf_megatron.runtime.megatron_session import megatron_session
    from phf_megatron.models.qwen3_arch import Qwen3Arch
    from phf_megatron.models import build_qwen3_model, fused
    from phf_megatron.models.lm_head import final_hidden_states, lm_cross_entropy

    spec = MCORE_OPTIONS[variant]
    fused.set_compile_backend(args.compile_backend)
    with megatron_session(1, 1):
        arch = Qwen3Arch.from_hf(config)
        model = build_qwen3_model(arch, dtype=dtype, **spec["options"])
        source = hf_model(config, dtype)  # same init as the hf variant
        load_hf_weights(model, source.state_dict().__getitem__, arch)
        del source
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        model.train()
        b, s = ids.shape
        positions = torch.arange(s, device=ids.device)[None].expand(b, -1)
        labels = torch.roll(ids, -1, dims=1)  # next token; last position masked below
        weights = torch.ones(b, s, device=ids.device)
        weights[:, -1] = 0
        weights /= weights.sum()

        def step():
            model.zero_grad(set_to_none=True)
            if spec["chunked"]:
                hidden = final_hidden_states(model, ids, positions)
                loss = lm_cross_entropy(model, hidden, labels, weights, chunk_tokens=args.chunk_tokens)
            else:
                per_token = model(ids, positions, None, labels=labels)  # [b, s] fp32
                loss = (per_token * weights).sum()
            loss.backward()
            return loss.detach()

        return measure(step, args.warmup, args.steps, args.profile)


def run_variant(variant, args) -> dict:
    import transformers

    dtype = torch.float32 if args.tiny and not torch.cuda.is_available() else torch.bfloat16
    config = qwen3_config(args.tiny)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, config.vocab_size, (args.batch, args.seq), generator=gen).to(_device())
    result = dict(variant=variant, batch=args.batch, seq=args.seq, tokens=args.batch * args.seq,
                  dtype=str(dtype), layers=config.num_hidden_layers, hidden=config.hidden_size,
                  vocab=config.vocab_size, device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                  torch=torch.__version__, transformers=transformers.__version__)
    try:
        import megatron.core

        result["megatron_core"] = getattr(megatron.core, "__version__", "?")
    except Exception:
        pass
    started = time.time()
    try:
        stats = bench_hf(config, ids, dtype, args) if variant == "hf" else bench_mcore(variant, config, ids, dtype, args)
        result.update(stats, ok=True, tokens_per_s=args.batch * args.seq / stats["median_step_s"])
    except Exception as e:  # record and continue with the next variant
        result.update(ok=False, error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-4000:])
    result["wall_s"] = time.time() - started
    return result


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--variant", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--out-dir", required=True)
    p.add_argument("--tiny", action="store_true", help="tiny model, for a CPU smoke run")
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--chunk-tokens", type=int, default=2048)
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend of the fused kernels")
    p.add_argument("--profile", action="store_true", help="add a profiled step's top kernels to the JSON")
    args = p.parse_args(argv)
    args.batch = args.batch or (2 if args.tiny else 4)
    args.seq = args.seq or (32 if args.tiny else 1536)
    os.makedirs(args.out_dir, exist_ok=True)
    for variant in args.variant:
        result = run_variant(variant, args)
        with open(os.path.join(args.out_dir, f"bench_{variant}.json"), "w") as f:
            json.dump(result, f, indent=2)
        summary = (f"{result['tokens_per_s']:.0f} tok/s, peak {result['peak_mem_gib']} GiB, loss {result['first_loss']:.4f}"
                   if result["ok"] else result["error"])
        print(f"[{variant}] {summary}", flush=True)


if __name__ == "__main__":
    main()
