"""The paper's tables as recipes: one row = one training run (or none, for Base) + one evaluation.

Table 1 (``tab:main``): Base, SFT, GRPO, OPSD, PHF per scale; Table 2 (``tab:ablations``, in
the source file ``tables/table3_ablations.tex``, hence the key ``table3``): OPSD, PHF,
direction only, geometry only, selected layers. Every row trains to checkpoint ``--step`` (100) and
is evaluated there by Average@12 (official grader). The settings of each row are the ones the
examples use (``examples/train_{phf,sft,grpo}_qwen3*.sh``: the scale's preset
``configs/phf_qwen3_<scale>.yaml`` plus the method's flags); the paper's shared settings (LoRA r 64 /
α 128, lr 5e-6, effective batch 32, step 100) are spelled out on every command line so that a
printed command says what it trains. ``paper_numbers.json`` holds the paper's numbers, each with the
line of the LaTeX source it was transcribed from.

The toy mode (``--toy``) runs the same rows on the embedded toy task (``docs/toy_task.md``,
``configs/toy_cpu.yaml``) with the toy's own settings; its numbers are greedy held-out accuracy, not
comparable with the paper's.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

#: Table 1's rows, then the ablation rows of Table 2 (OPSD and PHF are in both).
TABLE1_ROWS = ("base", "sft", "grpo", "opsd", "phf")
ABLATION_ROWS = ("direction_only", "geometry_only", "selected_layers")
ROWS = TABLE1_ROWS + ABLATION_ROWS
#: The toy's rows: all but selected_layers (its 2-layer model has no subset of layers with a neighbouring
#: pair other than both layers, which is the phf row; ``selected_layers``).
TOY_ROWS = tuple(r for r in ROWS if r != "selected_layers")
SCALES = ("1p7b", "4b", "8b")
#: Table 1's benchmark columns (phf_megatron/eval/config.py PAPER_BENCHMARKS) and the toy's.
BENCHMARKS = ("aime24", "aime25", "hmmt25")
TOY_BENCHMARKS = ("unseen", "seen")
#: Transformer layers per scale (Qwen3-1.7B: 28; 4B and 8B: 36; the toy model: 2).
SCALE_LAYERS = {"1p7b": 28, "4b": 36, "8b": 36, "toy": 2}

#: The settings the paper states for every trained row (appendix "Hyperparameters"; SFT and GRPO rows:
#: Appendix, "Base, SFT, and GRPO"): written on each command line, equal to the presets' values.
PAPER_COMMON = ("--lora.r=64", "--lora.alpha=128", "--optimizer.lr=5e-6", "--training.global_batch_size=32")


def selected_layers(num_layers: int) -> list[int]:
    """The selected-layers ablation's subset. The paper does not name its layers ("a fixed
    hand-picked subset"); ours: two adjacent pairs at a quarter and three quarters of the depth
    (28 layers: 6, 7, 20, 21; 36: 8, 9, 26, 27), so that both the local and the adjacent-layer terms
    have rows. A model of fewer than 8 layers has no such subset (the toy's 2 layers: the only
    neighbouring pair is all of them, i.e. the phf row): ``TOY_ROWS`` leave the row out."""
    if num_layers < 8:
        raise ValueError(f"selected_layers: {num_layers} layers have no proper subset of two neighbouring pairs")
    q = num_layers // 4
    return [q - 1, q, 3 * q - 1, 3 * q]


def method_flags(row: str, num_layers: int) -> tuple[str, ...]:
    """What tells a row's training apart (the same for the real scales and the toy); () for PHF."""
    if row == "sft":    # examples/train_sft_qwen3.sh
        return ("--method=sft", "--training.micro_batch_size=1")
    if row == "grpo":   # examples/train_grpo_qwen3.sh (G = 8; the correction needs unfiltered sampling)
        return ("--method=grpo", "--rollout.n=8", "--rollout.top_k=0", "--rollout.top_p=1.0")
    if row == "opsd":
        return ("--ablation=opsd_only",)
    if row == "phf":
        return ()
    if row == "selected_layers":
        return ("--ablation=selected_layers", "--objective.flow_layers=" + ",".join(map(str, selected_layers(num_layers))))
    if row in ABLATION_ROWS:
        return (f"--ablation={row}",)
    raise ValueError(f"no training recipe for row {row!r}")


def toy_method_flags(row: str) -> tuple[str, ...]:
    """The toy's version: configs/toy_cpu.yaml's batch (64 = 2 micro-batches of 32) and sampling
    (T 1.0, no top-k/top-p) stay; SFT keeps the toy's micro-batch and fits its sequences to the tiny
    model's 512 positions; GRPO draws G = 8 per prompt (the toy rows carry answers the official
    reward grades: ``7+8=15 \\boxed{5}`` against ``5``)."""
    flags = tuple(f for f in method_flags(row, SCALE_LAYERS["toy"]) if not f.startswith("--training.micro_batch_size"))
    return flags + (("--sft.max_length=512",) if row == "sft" else ())


@dataclass(frozen=True)
class PaperNumbers:
    """The paper's Average@12 (percent) for a scale, transcribed in ``paper_numbers.json``."""

    table1: dict
    table3: dict

    @classmethod
    def load(cls) -> "PaperNumbers":
        with open(os.path.join(os.path.dirname(__file__), "paper_numbers.json")) as f:
            data = json.load(f)
        return cls(data["table1"], data["table3"])

    def row(self, scale: str, row: str) -> dict | None:
        """``{aime24, aime25, hmmt25, average, source}`` (Table 1 rows) or ``{average, source}``
        (ablation rows); None for a scale or row the paper does not report."""
        t1 = self.table1["rows"].get(scale, {}).get(row)
        if t1 is not None:
            return {**{b: t1[b] for b in (*BENCHMARKS, "average")},
                    "source": f"Table 1 ({self.table1['file']}), phf_paper.tex line {t1['line']}"}
        t3 = self.table3["rows"].get(row)
        if t3 is not None and scale in t3:
            return {"average": t3[scale], "source": f"Table 2 ({self.table3['file']}), phf_paper.tex line {t3['line']}"}
        return None
