"""CPU step time of a PHF step on the real length mix: padded, packed, packed + token budget (issue 23).

    python -m benchmarks.packing_step --out runs/packing_step.json        # ~10 min on 2 cores
    python -m benchmarks.packing_step --rows 32 --steps 1 --shape tiny --scale 16   # seconds (the test)

The lengths are ``benchmarks.packing``'s (the real mix: the trainer's student and teacher prompts with the
real Qwen3 tokenizer, the stated completion distribution; ``--config``'s layout: global batch, data-parallel
size on ``--gpus``, micro-batch size, TP multiple, budget), divided by ``--scale`` (default 1: the real
lengths). On a GPU (when one is present) the model runs in bf16 there and each variant's peak allocated
memory is recorded (``--shape 1.7b``: the issue's GPU point). The model is small (``--shape``, default ``small``: 4 layers, hidden 128, 4/2 heads of 32,
FFN 384, vocabulary 1,024; random init, float32), so the attention's ``L²`` and the padding weigh as they
do at scale while a step fits a CPU. Tokens are random; only the lengths matter.

Per step and variant, every data-parallel rank's micro-batches run one rank after the other in this one
process: the teacher pass (forward, no grad) and the student pass (forward + backward) of
``parallel.PhfStep`` (the paper's PHF objective, flow window 128) through Megatron-Core's schedule,
micro-batches built by the trainer's own builders (``padded``: every micro-batch of a rank right-padded to the
rank's longest; ``packed``: each side of a micro-batch in one row of its own packed length, as the
trainer packs without pipelining (``training.batches.Packing``); ``packed+budget``: ``training.microbatch_plan`` with the budget, packed). A step waits for its
slowest rank: the step time of a variant is the slowest rank's; the sum over ranks is the compute.

``--again`` runs each variant's ranks a second time right after its timed run (``again_*``): a cost paid only for
a length never seen before (a per-length kernel plan, a recompilation) shows as the first run far above the second
in the variant that meets those lengths first (a later variant on the same lengths is warm in both runs), and the
second runs compare the variants whatever their order. ``attention_kernel``: the SDPA kernel PyTorch takes for the model's
heads and dtype (``training.model_setup.sdpa_kernel_in_use``, as the trainer's start line says it).

Check: the logs of all ranks reduced together give the step's global loss, OPSD and flow terms, which
must not depend on the layout (``loss_rel_diff`` against padded, float32).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks import packing
from benchmarks.shapes import layer_shape, qwen3_shape

VARIANTS = packing.VARIANTS
SMALL = dict(layer_shape(128, 4, 4, 2, 32, 384, tied=True), vocab_size=1024, max_position_embeddings=40_960)


def model_shape(name: str) -> dict:
    return qwen3_shape("tiny", **SMALL) if name == "small" else qwen3_shape(name)


def sample_ids(student: int, teacher: int, completion: int, vocab: int, g: torch.Generator):
    """One sample's ``(student prompt, teacher prompt, completion)`` ids (random; never the pad id ``vocab - 1``)."""
    draw = lambda n: torch.randint(0, vocab - 1, (n,), generator=g).tolist()  # noqa: E731
    return draw(student - completion), draw(teacher - completion), draw(completion)


def rank_microbatches(cuts: list[list[int]], samples: list, variant: str, window: int, vocab: int) -> list:
    """A rank's micro-batches, built by the trainer's own builders (``data.build_distill_batch``,
    ``training.batches.phf_microbatches``; no pipeline: each packed micro-batch its own length)."""
    from phf_megatron.data import build_distill_batch
    from phf_megatron.training.batches import PADDED, Packing, phf_microbatches

    idx = [i for c in cuts for i in c]
    batch = build_distill_batch([samples[i][0] for i in idx], [samples[i][1] for i in idx],
                                [samples[i][2] for i in idx], pad_id=vocab - 1)
    return phf_microbatches(batch, [len(c) for c in cuts], window,
                            PADDED if variant == "padded" else Packing(True, one_length=False))


def read_mix(path: str) -> dict:
    """``--mix``: a JSON of ``python -m benchmarks.packing --out`` (one line naming the file otherwise)."""
    try:
        mix = json.loads(Path(path).read_text())
        if not mix["presets"] or not next(iter(mix["presets"].values()))["steps"]:
            raise ValueError("no preset with steps")
        return mix
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise SystemExit(f"error: --mix: {path}: not a length mix of `python -m benchmarks.packing --out` "
                         f"({type(e).__name__}: {e})") from None


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_rank(model, step, mbs, fb) -> tuple[float, list]:
    """One rank's teacher pass and student pass; ``(seconds, the student pass's logs)``."""
    _sync()
    t0 = time.perf_counter()
    step.prepare(mbs)
    with torch.no_grad():
        fb(forward_step_func=step.teacher_forward_step, data_iterator=iter(mbs), model=[model],
           num_microbatches=len(mbs), seq_length=mbs[0].teacher_tokens.shape[1], micro_batch_size=mbs[0].batch_size,
           forward_only=True)
    model.zero_grad_buffer()
    logs = fb(forward_step_func=step.student_forward_step, data_iterator=iter(mbs), model=[model],
              num_microbatches=len(mbs), seq_length=step.student_seq_length(mbs[0].student_tokens.shape[1]),
              micro_batch_size=mbs[0].batch_size, forward_only=False)
    step.finish()
    _sync()
    return time.perf_counter() - t0, logs


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=packing.PRESETS[0], help="the preset whose layout the step follows")
    ap.add_argument("--data", default=packing.DATA)
    ap.add_argument("--rows", type=int, default=None)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=None, help="budget per side (default: benchmarks.packing's)")
    ap.add_argument("--scale", type=int, default=1, help="divide every length by this (1: the real lengths)")
    ap.add_argument("--shape", default="small", help="'small' (default) or a benchmarks.shapes name")
    ap.add_argument("--warmup", type=int, default=1, help="untimed rank passes per variant first")
    ap.add_argument("--mix", default=None, help="the lengths from a JSON of `python -m benchmarks.packing --out` "
                    "(its first preset) instead of tokenizing here: a machine without the Qwen3 tokenizer")
    ap.add_argument("--again", action="store_true", help="time each variant's ranks a second time right after "
                    "(again_*: a cost paid once per new length shows as the first run above the second)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from phf_megatron.models import build_qwen3_model
    from phf_megatron.objectives import ObjectiveConfig
    from phf_megatron.parallel import PhfStep, WindowCapture
    from phf_megatron.runtime.megatron_session import megatron_session
    from phf_megatron.training.model_setup import sdpa_kernel_in_use

    mix_argv = ["--configs", args.config, "--data", args.data, "--steps", str(args.steps), "--gpus", str(args.gpus)]
    mix_argv += ["--rows", str(args.rows)] if args.rows else []
    mix_argv += ["--max-tokens", str(args.max_tokens)] if args.max_tokens else []
    mix = read_mix(args.mix) if args.mix else packing.main(mix_argv)
    preset = next(iter(mix["presets"].values()))
    preset["steps"] = preset["steps"][: args.steps]
    lay = packing.Layout(**preset["layout"])
    shape = model_shape(args.shape)
    objective = ObjectiveConfig()
    result = dict(args=vars(args), layout=preset["layout"], shape=shape, threads=torch.get_num_threads(),
                  objective=dict(flow_variant=objective.flow_variant, flow_window=objective.flow_window), steps=[])
    cuda = torch.cuda.is_available()
    dtype = torch.bfloat16 if cuda else torch.float32
    result["device"] = torch.cuda.get_device_name() if cuda else "cpu"
    with megatron_session(1, 1):
        model = build_qwen3_model(shape, dtype=dtype, calculate_per_token_loss=True)
        result["attention_kernel"] = sdpa_kernel_in_use(model.config, cuda)
        model = DistributedDataParallel(model.config, DistributedDataParallelConfig(), model).train()
        capture, fb = WindowCapture(model), get_forward_backward_func()
        step = PhfStep(objective, model.config, tp_group=None, dp_group=None, student_capture=capture,
                       teacher_capture=capture)
        for k, record in enumerate(preset["steps"]):
            g = torch.Generator().manual_seed(k)
            lengths = []
            for s, t, c in zip(record["student"], record["teacher"], record["completions"]):
                c = max(1, c // args.scale)
                lengths.append((max(c + 1, s // args.scale), max(c + 1, t // args.scale), c))
            samples = [sample_ids(s, t, c, shape["vocab_size"], g) for s, t, c in lengths]
            row = dict(step=k, variants={})
            for variant in VARIANTS:
                plan = packing.plan_for(variant, lay, [x[0] for x in lengths], [x[1] for x in lengths])
                ranks = [rank_microbatches([list(mb) for mb in plan.microbatches(r)], samples, variant,
                                           objective.flow_window, shape["vocab_size"]) for r in range(plan.dp_size)]
                if cuda:
                    ranks = [[mb.to("cuda") for mb in r] for r in ranks]
                    torch.cuda.reset_peak_memory_stats()
                for _ in range(args.warmup if k == 0 else 0):
                    run_rank(model, step, ranks[0], fb)
                times, logs = [], []
                for mbs in ranks:
                    seconds, rank_logs = run_rank(model, step, mbs, fb)
                    times.append(seconds)
                    logs += rank_logs
                metrics = step.reduce_logs(logs)
                again = [run_rank(model, step, mbs, fb)[0] for mbs in ranks] if args.again else None
                row["variants"][variant] = dict(
                    slowest_rank_s=max(times), sum_ranks_s=sum(times), microbatches=sum(len(m) for m in ranks),
                    rank_s=times, rank_shapes=[[(list(m.student_tokens.shape), list(m.teacher_tokens.shape))
                                                for m in r] for r in ranks],   # (what a slow rank held)
                    tokens=sum(m.student_tokens.numel() + m.teacher_tokens.numel() for r in ranks for m in r),
                    loss=metrics["loss"], loss_opsd=metrics["loss_opsd"], loss_flow=metrics["loss_flow"],
                    peak_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else None)
                if again:
                    row["variants"][variant].update(again_slowest_rank_s=max(again), again_sum_ranks_s=sum(again),
                                                    again_rank_s=again)
            base = row["variants"]["padded"]
            for v in row["variants"].values():
                v["loss_rel_diff"] = max(abs(v[key] - base[key]) / max(abs(base[key]), 1e-12)
                                         for key in ("loss", "loss_opsd", "loss_flow"))
            print(f"step {k}: " + "; ".join(f"{n} {v['slowest_rank_s']:.2f} s " + (
                f"(again {v['again_slowest_rank_s']:.2f} s) " if args.again else "") + f"(sum {v['sum_ranks_s']:.2f} s, "
                f"{v['tokens']:,} tokens)" for n, v in row["variants"].items()), flush=True)
            result["steps"].append(row)
    result["summary"] = summarize(result["steps"])
    print(table(result["summary"]))
    if args.out:
        from phf_megatron.output_files import write_json

        write_json(args.out, result)
    return result


def summarize(steps: list[dict]) -> dict:
    """Per variant: median over steps of the slowest rank's time and of the sum over ranks (and of the second run's,
    ``--again``); tokens; vs padded."""
    times = ("slowest_rank_s", "sum_ranks_s") + (("again_slowest_rank_s", "again_sum_ranks_s")
                                                  if "again_slowest_rank_s" in steps[0]["variants"]["padded"] else ())
    out = {}
    for v in VARIANTS:
        out[v] = {key: statistics.median(s["variants"][v][key] for s in steps) for key in times}
        out[v].update(tokens=statistics.mean(s["variants"][v]["tokens"] for s in steps),
                      max_loss_rel_diff=max(s["variants"][v]["loss_rel_diff"] for s in steps))
    for v in VARIANTS:
        for key in times:
            name = key.replace("slowest_rank_s", "speedup_slowest").replace("sum_ranks_s", "speedup_sum")
            out[v][name] = out["padded"][key] / out[v][key]
    return out


def table(summary: dict) -> str:
    again = "again_slowest_rank_s" in summary["padded"]
    lines = ["| variant | step (slowest rank) s | speed-up | all ranks s | speed-up | " +
             ("again: slowest rank s | speed-up | " if again else "") + "tokens computed / step | "
             "loss vs padded (max rel.) |", "|" + "---|" * (9 if again else 7)]
    for v, s in summary.items():
        lines.append(f"| {v} | {s['slowest_rank_s']:.2f} | {s['speedup_slowest']:.2f}x | {s['sum_ranks_s']:.2f} | "
                     f"{s['speedup_sum']:.2f}x | " + (f"{s['again_slowest_rank_s']:.2f} | {s['again_speedup_slowest']:.2f}x | "
                                                     if again else "") +
                     f"{s['tokens']:,.0f} | {s['max_loss_rel_diff']:.1e} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
