"""What the per-step diagnostics cost: the clip statistics every step, the loss by rollout token every N steps.

    python -m benchmarks.diagnostics_cost OUTDIR             # CPU or GPU, ~2-4 min on a 2-core CPU
    python -m benchmarks.diagnostics_cost OUTDIR --hidden 2048 --layers 28 --rollouts 1024 1024 896 768   # GPU, 1.7B shape

One PHF step (paper recipe, ``PhfStep`` through Megatron's schedule, one micro-batch, bf16 on a
GPU / float32 on CPU) is timed three ways, interleaved (ABCABC..., so drift hits all alike):

* ``plain``: the loss without any diagnostic (``vocab_parallel_jsd(..., return_clip_stats=False)``,
  patched in for the measurement);
* ``clip_stats``: as shipped, the clip statistics on every step;
* ``loss_tokens``: as shipped on a loss-tokens step (``logging.loss_tokens_interval``), clip
  statistics plus the loss summed per rollout token id.

Step-time differences of ~1% drown in a shared CPU's noise, so the diagnostics' own cost is also
measured in isolation: the vocabulary-parallel JSD forward on the step's scored rows with and
without the statistics, back to back (the median of the paired differences; the only hot-path
work they add; ``loss_tokens`` adds one ``[V]``
index_add per micro-batch on its steps only), as a fraction of the median step. Writes
``OUTDIR/diagnostics_cost.json``; the numbers measured for the README are in ``diagnostics_cost.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

from benchmarks.phf_step import StepRunner, make_batch
from benchmarks.shapes import QWEN3_COMMON


def _model(args, device):
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads

    from phf_megatron.models import build_qwen3_model

    # Qwen3's proportions (head_dim 128, 2 query heads per KV head, FFN 3 x hidden): --hidden 2048
    # --layers 28 is Qwen3-1.7B's shape
    shape = dict(QWEN3_COMMON, num_hidden_layers=args.layers, hidden_size=args.hidden,
                 num_attention_heads=max(2, args.hidden // 128), num_key_value_heads=max(1, args.hidden // 256),
                 head_dim=args.hidden // max(2, args.hidden // 128), intermediate_size=3 * args.hidden,
                 vocab_size=args.vocab, tie_word_embeddings=True, max_position_embeddings=4096)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_qwen3_model(shape, dtype=dtype, calculate_per_token_loss=True)
    model.config.finalize_model_grads_func = finalize_model_grads
    return DistributedDataParallel(model.config, DistributedDataParallelConfig(grad_reduce_in_fp32=True), model).train()


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _jsd_forward_pairs(logits, rows, index, objective, repeats: int) -> tuple[list[float], list[float]]:
    """Forward times (ms) without and with the statistics, measured back to back (order alternating)."""
    from phf_megatron.parallel.vocab_parallel_jsd import vocab_parallel_jsd

    def once(with_stats):
        _sync()
        t0 = time.perf_counter()
        vocab_parallel_jsd(logits, rows, index, objective.jsd_beta, objective.jsd_temperature, objective.jsd_clip,
                           objective.jsd_clip_mode, return_clip_stats=with_stats)
        _sync()
        return 1e3 * (time.perf_counter() - t0)

    plain, stats = [], []
    with torch.no_grad():
        once(False), once(True)  # warm-up
        for i in range(repeats):
            for with_stats in ((False, True) if i % 2 == 0 else (True, False)):
                (stats if with_stats else plain).append(once(with_stats))
    return plain, stats


def run(args) -> dict:
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from phf_megatron.runtime.megatron_session import megatron_session
    from phf_megatron.objectives import ObjectiveConfig
    from phf_megatron.parallel import PhfStep, WindowCapture
    from phf_megatron.parallel import loss as loss_module

    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    shipped = loss_module.vocab_parallel_jsd

    def without_stats(*a, **k):
        k["return_clip_stats"] = False
        return shipped(*a, **k), None

    result = dict(args=vars(args), device=str(torch.cuda.get_device_name() if device.type == "cuda" else "cpu"),
                  threads=torch.get_num_threads())
    with megatron_session(1, 1):
        model = _model(args, device)
        capture = WindowCapture(model)
        mb = make_batch(args.vocab, args.prompt, args.reference, args.rollouts, args.window, device)
        objective = ObjectiveConfig(flow_window=args.window)
        step = PhfStep(objective, model.config, tp_group=ps.get_tensor_model_parallel_group(),
                       dp_group=ps.get_data_parallel_group(), student_capture=capture, teacher_capture=capture,
                       jsd_backend=args.jsd_backend)
        runner = StepRunner(model, mb, get_forward_backward_func())

        def timed(kind):
            loss_module.vocab_parallel_jsd = without_stats if kind == "plain" else shipped
            step.collect_loss_tokens = kind == "loss_tokens"
            try:
                return runner.step(step)
            finally:
                loss_module.vocab_parallel_jsd = shipped

        kinds = ("plain", "clip_stats", "loss_tokens")
        for kind in kinds * args.warmup:
            timed(kind)
        times = {k: [] for k in kinds}
        for i in range(args.steps):
            order = kinds[i % 3:] + kinds[: i % 3]
            for kind in order:
                times[kind].append(timed(kind)["step_s"])
        median = {k: statistics.median(v) for k, v in times.items()}
        result["step_ms_median"] = {k: round(1e3 * v, 2) for k, v in median.items()}
        result["paired_ratio_median"] = {
            k: round(statistics.median(a / b for a, b in zip(times[k], times["plain"])), 4) for k in kinds[1:]}

        # the JSD forward on the step's scored rows, with and without the statistics
        with torch.no_grad():
            mb.teacher_out.clear()
            step.prepare([mb])
            get_forward_backward_func()(forward_step_func=step.teacher_forward_step, data_iterator=iter([mb]),
                                        model=[model], num_microbatches=1, seq_length=mb.teacher_tokens.shape[1],
                                        micro_batch_size=mb.batch_size, forward_only=True)
            rows = mb.teacher_out["logits"]
            logits = rows + 0.1 * torch.randn_like(rows)
        index = torch.arange(rows.shape[0], device=device)
        plain, stats = _jsd_forward_pairs(logits, rows, index, objective, args.jsd_repeats)
        extra = statistics.median(b - a for a, b in zip(plain, stats))
        result["jsd_forward_ms"] = {"without_stats": round(statistics.median(plain), 3),
                                    "with_stats": round(statistics.median(stats), 3)}
        result["clip_stats_extra_ms"] = round(extra, 3)
        result["clip_stats_extra_fraction_of_step"] = round(extra / (1e3 * median["plain"]), 5)
        # the loss-tokens step's extra work per micro-batch: two [V] index_adds (on those steps only)
        per_token = torch.rand(rows.shape[0], device=device)
        tokens = mb.score_tokens.to(device)
        token_ms = []
        for _ in range(args.jsd_repeats):
            _sync()
            t0 = time.perf_counter()
            loss_module._token_logs(per_token, tokens, args.vocab)
            _sync()
            token_ms.append(1e3 * (time.perf_counter() - t0))
        result["loss_tokens_extra_ms"] = round(statistics.median(token_ms), 3)
        result["loss_tokens_extra_fraction_of_step"] = round(statistics.median(token_ms) / (1e3 * median["plain"]), 6)
        result["scored_tokens"] = mb.num_tokens
        capture.remove()
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--vocab", type=int, default=151936, help="Qwen3's vocabulary (the diagnostics scale with it)")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--reference", type=int, default=64)
    parser.add_argument("--rollouts", type=int, nargs="+", default=[96, 80])
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--jsd_backend", default="auto")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--jsd_repeats", type=int, default=15)
    args = parser.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    result = run(args)
    with open(os.path.join(args.out_dir, "diagnostics_cost.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
