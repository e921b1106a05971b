"""Cost of PHF over OPSD: one training step each, on one GPU at Qwen3-1.7B shape (bf16, TP=1).

    python -m benchmarks.phf_step OUTDIR --profile       # GPU, ~2-3 min; target: PHF <= 1.05 x OPSD
    python -m benchmarks.phf_step OUTDIR --tiny          # CPU smoke run of the same code path

On the GPU image megatron-core comes from its carried wheel, as for ``gpu_model_check.sh``:
``pip install --no-deps --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:$PWD``.

First the fused flow CUDA extension is found or JIT-built (``kernels.loader``, ~40 s once; the
result and why it is missing, if so, go to ``flow_extension``). Both steps then run through
Megatron-Core's own schedule (``get_forward_backward_func``, one micro-batch) with
``phf_megatron.parallel.PhfStep`` on the same model, batch and weights:

* OPSD step: teacher forward (no grad) keeping the scored logit rows, student forward + backward,
  vocabulary-parallel clipped JSD (``flow_variant="none"``: no capture, no flow loss);
* PHF step: the same plus window capture at every layer (student with gradient, teacher
  without) and the flow loss (paper recipe: phf, alpha 0.05, |W| = 128).

The teacher is the student model itself run under ``torch.no_grad()`` on the privileged
sequence (with LoRA the EMA teacher shares the frozen base; its adapter swap is not timed here).
Shape (default): Qwen3-1.7B (28 layers, hidden 2048, 16/8 heads, head_dim 128, FFN 6144,
vocabulary 151,936, tied), random init; batch 4; student = prompt 256 + rollout, teacher =
prompt 256 + reference 512 + rollout; rollouts of 1024, 1024, 896 and 768 tokens (right-padded).
No optimizer step (identical in both). The two steps alternate (ABAB...) after warm-up, so
clock and thermal drift hit both alike. Reported in ``OUTDIR/phf_step.json``:

* ``backends``: what each step ran (flow: "cuda" kernels or "torch" equations; jsd: "triton"
  or "torch");
* per step kind: median step time; per pass the wall time, the host time until the schedule
  returned (about the wall time when the host is the bottleneck) and the device time between
  CUDA events; peak memory; the step metrics;
* ``breakdown_ms``: device time per region of a few instrumented steps (``parallel.timing``:
  capture, capture_bwd, flow_fwd, flow_bwd, jsd_fwd, jsd_bwd, teacher_rows): the PHF-only
  costs are capture + capture_bwd + flow_fwd + flow_bwd;
* ``checks``: a PHF step on the reference paths (Megatron's full output layer, eager JSD, flow
  equations) against the fast ones: relative differences of the OPSD and flow values.

Also ``OUTDIR/phf_step.log``; ``--profile`` adds ``OUTDIR/{phf,opsd}_profile.txt``, the top
kernels of one step of each kind. Any error is recorded in the JSON.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import traceback

import torch

from benchmarks.shapes import qwen3_shape
from phf_megatron.output_files import write_json


def log(out_dir: str, *parts) -> None:
    line = " ".join(str(p) for p in parts)
    print(line, flush=True)
    with open(os.path.join(out_dir, "phf_step.log"), "a") as f:
        f.write(line + "\n")


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def make_batch(vocab: int, prompt: int, reference: int, rollouts: list[int], window: int, device):
    """One micro-batch: the same random rollout after a plain and a privileged prompt."""
    from phf_megatron.parallel import PhfMicroBatch

    g = torch.Generator().manual_seed(0)
    n_max = max(rollouts)
    ts, tt = prompt + n_max, prompt + reference + n_max
    st = torch.randint(0, vocab, (len(rollouts), ts), generator=g)
    tt_tokens = torch.randint(0, vocab, (len(rollouts), tt), generator=g)
    sr = torch.zeros(len(rollouts), ts, dtype=torch.bool)
    tr = torch.zeros(len(rollouts), tt, dtype=torch.bool)
    for b, n in enumerate(rollouts):
        tt_tokens[b, : prompt] = st[b, : prompt]
        tt_tokens[b, prompt + reference: prompt + reference + n] = st[b, prompt: prompt + n]
        sr[b, prompt: prompt + n] = True
        tr[b, prompt + reference: prompt + reference + n] = True
    to = dict(device=device)
    return PhfMicroBatch(st.to(**to), tt_tokens.to(**to), sr.to(**to), tr.to(**to), window_budget=window)


def shape(args) -> dict:
    """The model: Qwen3-1.7B's shape, or the tiny one (``--tiny``)."""
    return qwen3_shape("tiny" if args.tiny else "1.7b")


def build(args, device):
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads

    from phf_megatron.models import build_qwen3_model

    dtype = torch.float32 if args.tiny and not torch.cuda.is_available() else torch.bfloat16
    options = {}
    if args.fused:
        options["fused"] = True
    if args.compile_layers:
        options["compile_layers"] = True
    if args.recompute:
        options.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    model = build_qwen3_model(shape(args), dtype=dtype, calculate_per_token_loss=True, **options)
    model.config.finalize_model_grads_func = finalize_model_grads
    ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(grad_reduce_in_fp32=True), model)
    return ddp.train(), dtype


def build_flow_extension() -> dict:
    """JIT-build (or find) the fused flow CUDA extension before timing anything (~40 s once)."""
    from phf_megatron.kernels.loader import load_extension, unavailable_reason

    t0 = time.perf_counter()
    module = load_extension(verbose=False)
    return dict(available=module is not None, seconds=round(time.perf_counter() - t0, 1),
                reason=None if module is not None else unavailable_reason())


def preflight_triton_jsd(vocab: int) -> dict:
    """The Triton JSD against the eager one on a small bf16 batch (fwd + bwd). On failure the
    benchmark falls back to the eager JSD (recorded), so that one GPU run still yields its numbers."""
    from phf_megatron.parallel.vocab_parallel_jsd import vocab_parallel_jsd

    try:
        g = torch.Generator(device="cuda").manual_seed(0)
        zs = (4 * torch.randn(2, 64, vocab, generator=g, device="cuda")).bfloat16()
        rows = (4 * torch.randn(100, vocab, generator=g, device="cuda")).bfloat16()
        idx = torch.arange(10, 110, device="cuda")
        out = {}
        for backend in ("torch", "triton"):
            x = zs.clone().requires_grad_()
            per_token = vocab_parallel_jsd(x, rows, idx, 0.5, 1.0, 0.05, backend=backend)
            (grad,) = torch.autograd.grad(per_token.sum(), x)
            out[backend] = (per_token.detach().float(), grad.float())
        rel = [float((b - a).abs().max() / a.abs().max()) for a, b in zip(out["torch"], out["triton"])]
        return dict(ok=rel[0] < 1e-4 and rel[1] < 2e-2, value_rel_diff=rel[0], grad_rel_diff=rel[1])
    except Exception as e:  # noqa: BLE001 - recorded, then the eager JSD runs
        return dict(ok=False, error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-3000:])


class StepRunner:
    """One teacher pass + one student pass of a ``PhfStep`` through Megatron's schedule, timed.

    Per pass: wall time to the synchronized end, host time until ``forward_backward_func``
    returned (close to the wall time when the host is the bottleneck), and on GPU the device
    time between CUDA events around the pass.
    """

    def __init__(self, model, mb, fb):
        self.model, self.mb, self.fb = model, mb, fb

    def _pass(self, step, fn, seq_length, forward_only):
        mb, cuda = self.mb, torch.cuda.is_available()
        events = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if cuda else None
        t0 = time.perf_counter()
        if cuda:
            events[0].record()
        logs = self.fb(forward_step_func=fn, data_iterator=iter([mb]), model=[self.model], num_microbatches=1,
                       seq_length=seq_length, micro_batch_size=mb.batch_size, forward_only=forward_only)
        t_host = time.perf_counter() - t0
        if cuda:
            events[1].record()
        _sync()
        timing = dict(wall_s=time.perf_counter() - t0, host_s=t_host,
                      device_s=events[0].elapsed_time(events[1]) / 1e3 if cuda else None)
        return logs, timing

    def step(self, step) -> dict:
        mb = self.mb
        mb.teacher_out.clear()
        step.prepare([mb])
        with torch.no_grad():
            _, teacher = self._pass(step, step.teacher_forward_step, mb.teacher_tokens.shape[1], True)
        self.model.zero_grad_buffer()
        logs, student = self._pass(step, step.student_forward_step, step.student_seq_length(mb.student_tokens.shape[1]),
                                   False)
        step.finish()
        return dict(step_s=teacher["wall_s"] + student["wall_s"], teacher=teacher, student=student,
                    metrics=step.reduce_logs(logs))


def _median(runs, *keys):
    values = []
    for r in runs:
        for k in keys:
            r = r[k]
        values.append(r)
    return statistics.median(values) if None not in values else None


def summarize(runs: list[dict], peak) -> dict:
    return {
        "step_s_median": _median(runs, "step_s"),
        "teacher_s_median": _median(runs, "teacher", "wall_s"),
        "student_s_median": _median(runs, "student", "wall_s"),
        "teacher_host_s_median": _median(runs, "teacher", "host_s"),
        "student_host_s_median": _median(runs, "student", "host_s"),
        "teacher_device_s_median": _median(runs, "teacher", "device_s"),
        "student_device_s_median": _median(runs, "student", "device_s"),
        "step_s": [r["step_s"] for r in runs],
        "peak_mem_gib": peak,
    }


def ratios(timings: dict) -> dict:
    """PHF / OPSD by several estimators: step medians, medians of the time-adjacent pairs (robust to
    clock or host drift shared by a pair), best steps, and device time (CUDA events) of the passes."""
    phf, opsd = timings["phf"], timings["opsd"]
    out = {"median": _median(phf, "step_s") / _median(opsd, "step_s"),
           "paired_median": statistics.median(p["step_s"] / o["step_s"] for p, o in zip(phf, opsd)),
           "best": min(r["step_s"] for r in phf) / min(r["step_s"] for r in opsd)}
    if phf[0]["student"]["device_s"] is not None:
        device = [(p["teacher"]["device_s"] + p["student"]["device_s"]) / (o["teacher"]["device_s"] + o["student"]["device_s"])
                  for p, o in zip(phf, opsd)]
        out["device_paired_median"] = statistics.median(device)
    return {k: round(v, 4) for k, v in out.items()}


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-30)


def run(args) -> dict:
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from phf_megatron.runtime.megatron_session import megatron_session
    from phf_megatron.objectives import ObjectiveConfig
    from phf_megatron.parallel import PhfStep, WindowCapture
    from phf_megatron.parallel.timing import RegionTimer

    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    result: dict = dict(args=vars(args))
    if torch.cuda.is_available() and args.flow_backend != "torch":
        result["flow_extension"] = build_flow_extension()
        log(args.out_dir, f"flow extension: {result['flow_extension']}")
    if torch.cuda.is_available() and args.jsd_backend != "torch":
        result["triton_jsd_preflight"] = preflight_triton_jsd(shape(args)["vocab_size"])
        log(args.out_dir, f"Triton JSD preflight: {result['triton_jsd_preflight']}")
        if not result["triton_jsd_preflight"]["ok"]:
            args.jsd_backend = "torch"
    with megatron_session(1, 1):
        model, dtype = build(args, device)
        cfg = model.config
        capture = WindowCapture(model)
        vocab = shape(args)["vocab_size"]
        mb = make_batch(vocab, args.prompt, args.reference, args.rollouts, args.window, device)
        groups = dict(tp_group=ps.get_tensor_model_parallel_group(), dp_group=ps.get_data_parallel_group())
        phf_objective = ObjectiveConfig(flow_window=args.window)
        backends = dict(flow_backend=args.flow_backend, jsd_backend=args.jsd_backend)
        steps = {
            "opsd": PhfStep(ObjectiveConfig(flow_variant="none"), cfg, **groups, **backends),
            "phf": PhfStep(phf_objective, cfg, **groups, student_capture=capture, teacher_capture=capture, **backends),
        }
        runner = StepRunner(model, mb, get_forward_backward_func())
        result.update(dtype=str(dtype), batch=mb.batch_size, student_seq=mb.student_tokens.shape[1],
                      teacher_seq=mb.teacher_tokens.shape[1], scored_tokens=mb.num_tokens,
                      window=list(mb.student_window.shape), layers=cfg.num_layers, hidden=cfg.hidden_size, vocab=vocab)

        t0 = time.perf_counter()
        for kind in ("opsd", "phf"):  # compile / autotune / allocator warm-up
            for _ in range(args.warmup):
                runner.step(steps[kind])
        result["backends"] = {kind: dict(step.backends_used) for kind, step in steps.items()}
        result["warmup_s"] = round(time.perf_counter() - t0, 1)
        log(args.out_dir, f"backends {result['backends']}; warm-up {result['warmup_s']} s")
        peak = {}
        for kind in ("opsd", "phf"):
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            res = runner.step(steps[kind])
            peak[kind] = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
            result[f"metrics_{kind}"] = res["metrics"]
        timings = {"opsd": [], "phf": []}
        for i in range(args.steps):
            for kind in (("opsd", "phf") if i % 2 == 0 else ("phf", "opsd")):
                timings[kind].append(runner.step(steps[kind]))
        for kind, runs in timings.items():
            result[kind] = summarize(runs, peak[kind])
            r = result[kind]
            log(args.out_dir, f"[{kind}] median step {r['step_s_median'] * 1e3:.1f} ms (teacher {r['teacher_s_median'] * 1e3:.1f},"
                f" student {r['student_s_median'] * 1e3:.1f}; host until return: teacher "
                f"{r['teacher_host_s_median'] * 1e3:.1f}, student {r['student_host_s_median'] * 1e3:.1f}) peak {peak[kind]} GiB")
        result["ratio_phf_over_opsd"] = result["phf"]["step_s_median"] / result["opsd"]["step_s_median"]
        result["ratios"] = ratios(timings)
        log(args.out_dir, f"ratios: {result['ratios']}")

        result["breakdown_ms"] = {}  # device time per region, mean over a few instrumented steps
        for kind in ("opsd", "phf"):
            with RegionTimer() as timer:
                for _ in range(args.breakdown_steps):
                    runner.step(steps[kind])
            result["breakdown_ms"][kind] = {k: v / args.breakdown_steps for k, v in sorted(timer.totals_ms().items())}
            log(args.out_dir, f"[{kind}] breakdown ms per step: "
                + ", ".join(f"{k} {v:.2f}" for k, v in result["breakdown_ms"][kind].items()))

        result["checks"] = cross_check_backends(runner, steps, phf_objective, cfg, groups, capture, args, result)
        log(args.out_dir, f"backend cross-checks: {result['checks']}")
        if args.profile and torch.cuda.is_available():
            for kind in ("phf", "opsd"):
                write_profile(runner, steps[kind], os.path.join(args.out_dir, f"{kind}_profile.txt"))
        capture.remove()
    return result


def cross_check_backends(runner, steps, phf_objective, cfg, groups, capture, args, result) -> dict:
    """One PHF step on the reference paths (full output layer, eager JSD, flow equations): same metrics?"""
    from phf_megatron.parallel import PhfStep

    reference = PhfStep(phf_objective, cfg, **groups, student_capture=capture, teacher_capture=capture,
                        flow_backend="torch", jsd_backend="torch", score_rows_only=False)
    ref = runner.step(reference)["metrics"]
    fast = result["metrics_phf"]
    return {"backends": result["backends"]["phf"],
            "opsd_rel_diff": _rel(fast["loss_opsd"], ref["loss_opsd"]),
            "flow_rel_diff": _rel(fast["loss_flow"], ref["loss_flow"])}


def write_profile(runner, step, path: str) -> None:
    """The top kernels of one step by device time (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        runner.step(step)
    table = prof.key_averages()
    try:  # the sort key's name changed across torch versions
        text = table.table(sort_by="self_device_time_total", row_limit=40, max_name_column_width=70)
    except (AttributeError, KeyError, ValueError):
        text = table.table(sort_by="self_cuda_time_total", row_limit=40, max_name_column_width=70)
    with open(path, "w") as f:
        f.write(text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out_dir", nargs="?", default=os.environ.get("OUT"), help="results directory (default: $OUT)")
    p.add_argument("--tiny", action="store_true", help="tiny model and sequences: a CPU smoke run")
    p.add_argument("--prompt", type=int, default=None, help="student prompt tokens (256; tiny 8)")
    p.add_argument("--reference", type=int, default=None, help="extra teacher prompt tokens (512; tiny 6)")
    p.add_argument("--rollouts", type=int, nargs="+", default=None, help="rollout length per sample")
    p.add_argument("--window", type=int, default=128, help="|W|, flow window budget")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=15, help="timed steps of each kind")
    p.add_argument("--breakdown-steps", type=int, default=3, help="instrumented steps of each kind (region times)")
    p.add_argument("--flow-backend", choices=("auto", "torch", "cuda"), default="auto",
                   help="flow loss: fused CUDA kernels (auto: when the extension builds) or the equations")
    p.add_argument("--jsd-backend", choices=("auto", "torch", "triton"), default="auto",
                   help="vocabulary-parallel JSD: Triton kernels (auto: on CUDA) or the chunked eager loop")
    p.add_argument("--fused", action=argparse.BooleanOptionalAction, default=torch.cuda.is_available(),
                   help="the model's compiled RMSNorm/RoPE/SwiGLU fast paths (default on GPU)")
    p.add_argument("--compile-layers", action="store_true", help="torch.compile each decoder layer")
    p.add_argument("--recompute", action="store_true", help="full activation recomputation")
    p.add_argument("--profile", action="store_true", help="write the top kernels of one PHF and one OPSD step")
    args = p.parse_args(argv)
    if not args.out_dir:
        p.error("give OUTDIR (or set $OUT)")
    if args.tiny:
        args.prompt, args.reference = args.prompt or 8, args.reference or 6
        args.rollouts = args.rollouts or [12, 10, 7, 3]
    else:
        args.prompt, args.reference = args.prompt or 256, args.reference or 512
        args.rollouts = args.rollouts or [1024, 1024, 896, 768]
    os.makedirs(args.out_dir, exist_ok=True)
    result: dict = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                    "torch": torch.__version__}
    try:
        import megatron.core
        import transformers

        result.update(megatron_core=megatron.core.__version__, transformers=transformers.__version__)
        result.update(run(args), ok=True)
        log(args.out_dir, f"PHF / OPSD step time: {result['ratio_phf_over_opsd']:.4f} (target <= 1.05)")
    except Exception as e:  # unattended: keep the error with the results
        result.update(ok=False, error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-6000:])
        log(args.out_dir, result["traceback"])
    write_json(os.path.join(args.out_dir, "phf_step.json"), result, indent=1, default=str)
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
