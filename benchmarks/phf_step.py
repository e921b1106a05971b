"""Cost of PHF over OPSD: one training step each, on one GPU at Qwen3-1.7B shape (bf16, TP=1).

    python benchmarks/phf_step.py OUTDIR --profile       # GPU, ~3 min; target: PHF <= 1.05 x OPSD
    python benchmarks/phf_step.py OUTDIR --tiny          # CPU smoke run of the same code path

On the GPU image megatron-core comes from its carried wheel, as for ``gpu_model_check.sh``:
``pip install --no-deps --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:$PWD``.

Both steps run through Megatron-Core's own schedule (``get_forward_backward_func``, one
micro-batch) with ``phf_megatron.parallel.PhfStep`` on the same model, batch and weights:

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
clock and thermal drift hit both alike; reported: median step time, teacher/student pass
medians, peak memory per step kind, and the step metrics.

Writes ``OUTDIR/phf_step.json`` (and ``OUTDIR/phf_step.log``; ``--profile`` adds
``OUTDIR/phf_profile.txt``, the top kernels of one PHF step). Any error is recorded in the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

QWEN3_1_7B = dict(model_type="qwen3", num_hidden_layers=28, hidden_size=2048, num_attention_heads=16, num_key_value_heads=8,
                  head_dim=128, intermediate_size=6144, vocab_size=151936, tie_word_embeddings=True,
                  rope_theta=1e6, max_position_embeddings=40960, rms_norm_eps=1e-6)
TINY = dict(model_type="qwen3", num_hidden_layers=4, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            intermediate_size=128, vocab_size=512, tie_word_embeddings=True, rope_theta=1e6,
            max_position_embeddings=512, rms_norm_eps=1e-6)


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
    model = build_qwen3_model(TINY if args.tiny else QWEN3_1_7B, dtype=dtype, calculate_per_token_loss=True, **options)
    model.config.finalize_model_grads_func = finalize_model_grads
    ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(grad_reduce_in_fp32=True), model)
    return ddp.train(), dtype


def run(args) -> dict:
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from phf_megatron.convert.megatron_session import megatron_session
    from phf_megatron.objectives import ObjectiveConfig
    from phf_megatron.parallel import PhfStep, WindowCapture

    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    result: dict = dict(args=vars(args))
    with megatron_session(1, 1):
        model, dtype = build(args, device)
        cfg = model.config
        capture = WindowCapture(model)
        vocab = (TINY if args.tiny else QWEN3_1_7B)["vocab_size"]
        mb = make_batch(vocab, args.prompt, args.reference, args.rollouts, args.window, device)
        tp, dp = ps.get_tensor_model_parallel_group(), ps.get_data_parallel_group()
        steps = {
            "opsd": PhfStep(ObjectiveConfig(flow_variant="none"), cfg, tp_group=tp, dp_group=dp),
            "phf": PhfStep(ObjectiveConfig(flow_window=args.window), cfg, tp_group=tp, dp_group=dp,
                           student_capture=capture, teacher_capture=capture),
        }
        fb = get_forward_backward_func()
        b, ts, tt = mb.batch_size, mb.student_tokens.shape[1], mb.teacher_tokens.shape[1]
        result.update(dtype=str(dtype), batch=b, student_seq=ts, teacher_seq=tt, scored_tokens=mb.num_tokens,
                      window=list(mb.student_window.shape), layers=cfg.num_layers, hidden=cfg.hidden_size, vocab=vocab)

        def one_step(kind: str) -> dict:
            step = steps[kind]
            mb.teacher_out.clear()
            step.prepare([mb])
            t0 = time.perf_counter()
            with torch.no_grad():
                fb(forward_step_func=step.teacher_forward_step, data_iterator=iter([mb]), model=[model],
                   num_microbatches=1, seq_length=tt, micro_batch_size=b, forward_only=True)
            _sync()
            t1 = time.perf_counter()
            model.zero_grad_buffer()
            logs = fb(forward_step_func=step.student_forward_step, data_iterator=iter([mb]), model=[model],
                      num_microbatches=1, seq_length=step.student_seq_length(ts), micro_batch_size=b)
            step.finish()
            _sync()
            t2 = time.perf_counter()
            return dict(step_s=t2 - t0, teacher_s=t1 - t0, student_s=t2 - t1, metrics=step.reduce_logs(logs))

        for kind in ("opsd", "phf"):  # compile / autotune / allocator warm-up
            for _ in range(args.warmup):
                one_step(kind)
        peak = {}
        for kind in ("opsd", "phf"):
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            res = one_step(kind)
            peak[kind] = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
            result[f"metrics_{kind}"] = res["metrics"]
        timings = {"opsd": [], "phf": []}
        for i in range(args.steps):
            for kind in (("opsd", "phf") if i % 2 == 0 else ("phf", "opsd")):
                timings[kind].append(one_step(kind))
        for kind, runs in timings.items():
            result[kind] = {
                "step_s_median": statistics.median(r["step_s"] for r in runs),
                "teacher_s_median": statistics.median(r["teacher_s"] for r in runs),
                "student_s_median": statistics.median(r["student_s"] for r in runs),
                "step_s": [r["step_s"] for r in runs],
                "peak_mem_gib": peak[kind],
            }
            log(args.out_dir, f"[{kind}] median step {result[kind]['step_s_median'] * 1e3:.1f} ms "
                f"(teacher {result[kind]['teacher_s_median'] * 1e3:.1f}, student {result[kind]['student_s_median'] * 1e3:.1f})"
                f" peak {peak[kind]} GiB")
        result["ratio_phf_over_opsd"] = result["phf"]["step_s_median"] / result["opsd"]["step_s_median"]
        if args.profile and torch.cuda.is_available():
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                one_step("phf")
            table = prof.key_averages()
            try:  # the sort key's name changed across torch versions
                text = table.table(sort_by="self_device_time_total", row_limit=40, max_name_column_width=70)
            except (AttributeError, KeyError, ValueError):
                text = table.table(sort_by="self_cuda_time_total", row_limit=40, max_name_column_width=70)
            with open(os.path.join(args.out_dir, "phf_profile.txt"), "w") as f:
                f.write(text)
        capture.remove()
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out_dir", nargs="?", default=os.environ.get("OUT"), help="results directory (default: $OUT)")
    p.add_argument("--tiny", action="store_true", help="tiny model and sequences: a CPU smoke run")
    p.add_argument("--prompt", type=int, default=None, help="student prompt tokens (256; tiny 8)")
    p.add_argument("--reference", type=int, default=None, help="extra teacher prompt tokens (512; tiny 6)")
    p.add_argument("--rollouts", type=int, nargs="+", default=None, help="rollout length per sample")
    p.add_argument("--window", type=int, default=128, help="|W|, flow window budget")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10, help="timed steps of each kind")
    p.add_argument("--fused", action=argparse.BooleanOptionalAction, default=torch.cuda.is_available(),
                   help="the model's compiled RMSNorm/RoPE/SwiGLU fast paths (default on GPU)")
    p.add_argument("--compile-layers", action="store_true", help="torch.compile each decoder layer")
    p.add_argument("--recompute", action="store_true", help="full activation recomputation")
    p.add_argument("--profile", action="store_true", help="write the top kernels of one PHF step")
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
    tmp = os.path.join(args.out_dir, "phf_step.json.tmp")
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1, default=str)
    os.replace(tmp, os.path.join(args.out_dir, "phf_step.json"))
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
