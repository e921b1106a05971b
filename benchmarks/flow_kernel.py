"""Benchmark of the fused flow loss (fwd+bwd): CUDA extension vs eager reference vs torch.compile.

    python -m benchmarks.flow_kernel --out OUTDIR [--quick]

For each shape (L, B, m, H) and dtype it times the forward+backward of the PHF flow loss
(median of many CUDA-event-timed runs after warm-up) for:
  cuda       the extension, product precision "auto" (3xTF32 for fp32, 3xBF16 for bf16);
  cuda-bf16  precision "bf16" (one bf16 product; the fastest, less accurate; 16-bit inputs only);
  cuda-fp32  precision "fp32" (fp32 FMA on CUDA cores, the fallback);
  eager      the PyTorch reference (phf_megatron.objectives.flow equations, no input checks);
  compile    torch.compile of that same reference (Inductor, which emits Triton kernels;
             no hand-written Triton version exists).
Roofline columns (csrc/README.md): the memory floor (student and teacher read once, the
gradient written once, at a measured device-to-device copy bandwidth) and the compute floor
(the useful FLOPs: symmetric Grams counted once, at a measured 8192³ GEMM rate: bf16 for 16-bit
inputs, three TF32 products for fp32 inputs, the least that reaches fp32 accuracy on tensor
cores). The loss of each implementation is compared with a float64 evaluation of the same
inputs. Writes flow_kernel.json and flow_kernel.md into OUTDIR (atomically, after every
measurement, so a killed run keeps what it had).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from benchmarks.shapes import QWEN3_SIZES
from phf_megatron.objectives.flow import (
    FlowTerms,
    LayerPlan,
    adjacent_layer_loss,
    batch_mean,
    direction_loss,
    geometry_loss,
    per_sample_flow,
    transitions,
    unit_directions,
)
from phf_megatron.output_files import write_text

#: (L, B, m, H): Qwen3-8B's and Qwen3-1.7B's layers and hidden size, 4 samples, a window of 128
SHAPES = tuple((QWEN3_SIZES[n]["num_hidden_layers"], 4, 128, QWEN3_SIZES[n]["hidden_size"]) for n in ("8b", "1.7b"))
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
TARGETS = {"vs_eager": 3.0, "vs_compile": 1.5, "vs_floor": 2.0}
CUDA_IMPLS = {"cuda": {}, "cuda-bf16": {"precision": "bf16"}, "cuda-fp32": {"precision": "fp32"}}


def useful_flops(L: int, B: int, m: int, H: int) -> float:
    """FLOPs of the PHF loss's products (all layers), fwd+bwd, n = m - 1 transitions:
    two symmetric Grams per layer n(n+1)H each, two cross products per pair 2n²H each; backward
    W'·Δh: one per layer (geometry) and two per pair (adjacent), 2n²H each."""
    n, pairs = m - 1, L - 1
    return float(B * H * (2 * L * n * (n + 1) + 4 * pairs * n * n + 2 * L * n * n + 4 * pairs * n * n))


def gemm_tflops(dtype: torch.dtype, size: int = 8192) -> float:
    """Measured dense GEMM rate (fp32 runs on TF32 tensor cores here)."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        a = torch.randn(size, size, device="cuda", dtype=dtype)
        b = torch.randn(size, size, device="cuda", dtype=dtype)
        ms = statistics.median(time_ms(lambda: a @ b, 10, 3))
        return 2 * size**3 / (ms * 1e-3) / 1e12
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def float64_loss(student, teacher, valid, plan: LayerPlan) -> float:
    with torch.no_grad():
        return float(reference_loss(student.double(), teacher.double(), valid, plan))


def reference_loss(student, teacher, valid, plan: LayerPlan, eps: float = 1e-6):
    """The PHF flow loss from the reference's equations, without input checks (compilable);
    returned in the compute dtype (float32 for 16-bit inputs)."""
    idx = torch.tensor(plan.layers, device=student.device)
    dtype = torch.float32 if student.dtype in (torch.bfloat16, torch.float16) else student.dtype
    h_s = student.index_select(0, idx).to(dtype)
    h_t = teacher.detach().index_select(0, idx).to(dtype)
    delta_s, tv = transitions(h_s, valid)
    delta_t, _ = transitions(h_t, valid)
    d_s, d_t = unit_directions(delta_s, tv, eps), unit_directions(delta_t, tv, eps)
    lower = torch.tensor([a for a, _ in plan.pairs], device=student.device)
    upper = torch.tensor([b for _, b in plan.pairs], device=student.device)
    terms = FlowTerms(
        direction_loss(d_s, d_t, tv),
        geometry_loss(d_s, d_t, tv),
        adjacent_layer_loss(d_s[lower], d_s[upper], d_t[lower], d_t[upper], tv),
        None,
        valid.sum(-1) >= 2,
    )
    per_sample = per_sample_flow(terms, "phf", len(plan.layers), len(plan.pairs))
    return batch_mean(per_sample, terms.sample_mask)


def time_ms(fn, iters: int, warmup: int) -> list[float]:
    """Each run timed alone with CUDA events, after `warmup` untimed runs."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write counted)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = statistics.median(time_ms(lambda: dst.copy_(src), 30, 5))
    return 2 * nbytes / (ms * 1e-3)


def make_case(shape, dtype):
    L, B, m, H = shape
    gen = torch.Generator(device="cuda").manual_seed(0)
    shared = 4.0 * torch.randn(L, B, 1, H, device="cuda", generator=gen)  # residual-stream-like offset
    student = (shared + torch.randn(L, B, m, H, device="cuda", generator=gen)).to(dtype).requires_grad_(True)
    teacher = (shared + torch.randn(L, B, m, H, device="cuda", generator=gen)).to(dtype)
    valid = torch.ones(B, m, dtype=torch.bool, device="cuda")
    return student, teacher, valid, LayerPlan.build(L, "phf")


def step_fn(impl: str, student, teacher, valid, plan, compiled):
    """One forward+backward of `impl` (the gradient buffer is dropped each time)."""
    if impl in CUDA_IMPLS:  # no input checks (no host sync), like eager/compile
        from phf_megatron.kernels.flow_cuda import flow_terms_cuda

        def loss_fn():
            terms = flow_terms_cuda(student, teacher, valid, plan, "phf", **CUDA_IMPLS[impl])
            return batch_mean(per_sample_flow(terms, "phf", len(plan.layers), len(plan.pairs)), terms.sample_mask)
    elif impl == "eager":
        loss_fn = lambda: reference_loss(student, teacher, valid, plan)  # noqa: E731
    elif impl == "compile":
        loss_fn = lambda: compiled(student, teacher, valid, plan)  # noqa: E731
    else:
        raise ValueError(f"impl: unknown {impl!r}")

    def run():
        student.grad = None
        loss = loss_fn()
        loss.backward()
        return loss

    return run


def kernel_breakdown(run) -> dict[str, float]:
    """Mean CUDA time per kernel name (µs) over a few profiled steps of the extension."""
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                run()
            torch.cuda.synchronize()
        out = {}
        for evt in prof.key_averages():
            dev = getattr(evt, "device_time_total", None) or getattr(evt, "cuda_time_total", 0.0)
            if dev > 0:
                out[evt.key[:90]] = round(dev / 5, 1)
        return dict(sorted(out.items(), key=lambda kv: -kv[1])[:12])
    except Exception as exc:  # the profiler is a diagnostic, never a failure
        return {"error": f"{type(exc).__name__}: {exc}"}


def markdown(results: dict) -> str:
    lines = [
        f"Device: {results['device']}; copy bandwidth {results['copy_GBps']:.0f} GB/s; dense 8192³ GEMM "
        f"{results['gemm_TFLOPs']['bf16']:.0f} TFLOP/s bf16, {results['gemm_TFLOPs']['tf32']:.0f} TFLOP/s TF32; "
        f"median of {results['iters']} runs after {results['warmup']} warm-up runs, fwd+bwd.",
        "",
        "| L,B,m,H | dtype | impl | ms | × eager | × compile | mem floor ms | × mem floor | compute floor ms "
        "| × compute floor | useful TFLOP/s | loss rel. diff vs float64 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        fmt = lambda x, f="{:.2f}": "-" if x is None else f.format(x)  # noqa: E731
        lines.append(
            f"| {row['shape']} | {row['dtype']} | {row['impl']} | {fmt(row['ms'], '{:.3f}')} | "
            f"{fmt(row.get('speedup_vs_eager'))} | {fmt(row.get('speedup_vs_compile'))} | "
            f"{fmt(row.get('mem_floor_ms'), '{:.3f}')} | {fmt(row.get('time_over_floor'))} | "
            f"{fmt(row.get('compute_floor_ms'), '{:.3f}')} | {fmt(row.get('time_over_compute_floor'))} | "
            f"{fmt(row.get('useful_TFLOPs'), '{:.0f}')} | {fmt(row.get('loss_rel_diff_vs_float64'), '{:.1e}')} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"), help="output directory")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--impls", default="cuda,cuda-bf16,cuda-fp32,eager,compile")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--quick", action="store_true", help="small shapes, few runs (a smoke test)")
    ap.add_argument("--budget-s", type=float, default=240.0, help="skip torch.compile runs once this is spent")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.flow_kernel needs a CUDA device")
    os.makedirs(args.out, exist_ok=True)
    shapes = ((4, 2, 128, 512),) if args.quick else SHAPES
    iters, warmup = (5, 2) if args.quick else (args.iters, args.warmup)
    impls = args.impls.split(",")
    t_start = time.time()

    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "iters": iters,
               "warmup": warmup, "copy_GBps": copy_bandwidth() / 1e9, "targets": TARGETS, "rows": [],
               "gemm_TFLOPs": {"bf16": gemm_tflops(torch.bfloat16), "tf32": gemm_tflops(torch.float32)},
               "breakdown_us": {}, "notes": ["triton: no hand-written Triton kernel; 'compile' is Inductor/Triton",
                                             "compute floor: useful FLOPs at the bf16 GEMM rate (16-bit inputs) or "
                                             "3x at the TF32 GEMM rate (fp32 inputs, fp32-accurate products)"]}
    reference64 = {}
    json_path, md_path = os.path.join(args.out, "flow_kernel.json"), os.path.join(args.out, "flow_kernel.md")
    compiled = torch.compile(reference_loss, dynamic=False) if "compile" in impls else None
    # Fast implementations for every configuration first; the slow-to-compile one last.
    order = [i for i in impls if i != "compile"] + (["compile"] if "compile" in impls else [])
    for impl in order:
        for shape in shapes:
            for dname in args.dtypes.split(","):
                if impl == "compile" and time.time() - t_start > args.budget_s:
                    results["notes"].append(f"compile {shape} {dname}: skipped (time budget)")
                    continue
                if impl == "cuda-bf16" and dname == "fp32":
                    continue  # one bf16 product cannot meet fp32 accuracy: not an fp32 option
                student, teacher, valid, plan = make_case(shape, DTYPES[dname])
                key = (shape, dname)
                if key not in reference64:
                    reference64[key] = float64_loss(student, teacher, valid, plan)
                    torch.cuda.empty_cache()
                run = step_fn(impl, student, teacher, valid, plan, compiled)
                try:
                    t0 = time.time()
                    first = run()
                    torch.cuda.synchronize()
                    first_s = time.time() - t0
                    ms = statistics.median(time_ms(run, iters, warmup))
                except Exception as exc:  # one failing implementation must not lose the others
                    results["notes"].append(f"{impl} {shape} {dname}: {type(exc).__name__}: {exc}"[:500])
                    print(results["notes"][-1], flush=True)
                    del student, teacher, run
                    torch.cuda.empty_cache()
                    continue
                numel, item = student.numel(), student.element_size()
                floor_bytes = 3 * numel * item  # student + teacher read once, gradient written once
                flops = useful_flops(*shape)
                mem_floor_ms = floor_bytes / (results["copy_GBps"] * 1e9) * 1e3
                peak = results["gemm_TFLOPs"]["tf32"] / 3 if dname == "fp32" else results["gemm_TFLOPs"]["bf16"]
                compute_floor_ms = flops / (peak * 1e12) * 1e3
                loss = float(first.detach())
                row = {"shape": ",".join(map(str, shape)), "dtype": dname, "impl": impl, "ms": ms,
                       "first_call_s": round(first_s, 2), "loss": loss, "loss_float64": reference64[key],
                       "loss_rel_diff_vs_float64": abs(loss - reference64[key]) / max(abs(reference64[key]), 1e-30),
                       "floor_bytes": floor_bytes, "achieved_GBps": floor_bytes / (ms * 1e-3) / 1e9,
                       "mem_floor_ms": mem_floor_ms, "time_over_floor": ms / mem_floor_ms, "useful_flops": flops,
                       "useful_TFLOPs": flops / (ms * 1e-3) / 1e12, "compute_floor_ms": compute_floor_ms,
                       "time_over_compute_floor": ms / compute_floor_ms}
                if impl == "cuda":
                    results["breakdown_us"][f"{impl}/{row['shape']}/{dname}"] = kernel_breakdown(run)
                results["rows"].append(row)
                del student, teacher, run
                torch.cuda.empty_cache()
                _fill_ratios(results["rows"])
                write_text(json_path, json.dumps(results, indent=1))
                write_text(md_path, markdown(results))
                print(f"{impl:9s} {row['shape']:16s} {dname}: {ms:8.3f} ms  (first call {first_s:.1f} s)", flush=True)
    print(markdown(results))
    print(f"wrote {json_path} and {md_path} in {time.time() - t_start:.0f} s")


def _fill_ratios(rows: list[dict]) -> None:
    by = {(r["shape"], r["dtype"], r["impl"]): r for r in rows}
    for r in rows:
        eager, comp = by.get((r["shape"], r["dtype"], "eager")), by.get((r["shape"], r["dtype"], "compile"))
        r["speedup_vs_eager"] = eager["ms"] / r["ms"] if eager else None
        r["speedup_vs_compile"] = comp["ms"] / r["ms"] if comp else None


if __name__ == "__main__":
    main()
