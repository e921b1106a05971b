"""Average@k of a checkpoint on AIME 2024, AIME 2025 and HMMT Feb 2025 (the paper's metric).

    # a HF model directory, paper settings (n=12, T=1.0, top-p 0.95, 38,912 new tokens, thinking),
    # graded by the official OPSD grader and ours: columns Avg@12 (official) and Avg@12 (extended);
    # the problems are the copies shipped with the package (phf_megatron/eval/sets/, offline); --data_dir DIR
    # reads DIR/aime24.jsonl ... instead, --data_dir hub the HF datasets official OPSD evaluates on
    # (at their main branch; --data_revision SHA pins them, as published numbers should)
    python tools/eval_avg_at_k.py --model /models/Qwen3-1.7B --out_dir runs/eval_q17b

    # base + PEFT adapter; a training run's checkpoint (LoRA merged); any JSONL with problem/answer fields
    python tools/eval_avg_at_k.py --model /models/Qwen3-1.7B --adapter runs/phf/export/peft_adapter --out_dir runs/eval_phf
    python tools/eval_avg_at_k.py --megatron_checkpoint runs/phf/checkpoints/iter_0000100 --model /models/Qwen3-1.7B ...
    python tools/eval_avg_at_k.py --megatron_checkpoint runs/phf --model /models/Qwen3-1.7B ...   # the latest one
    python tools/eval_avg_at_k.py --model DIR --benchmarks my_set.jsonl --n 4 --out_dir runs/eval_mine
    python tools/eval_avg_at_k.py ... --engine_kwargs "{gpu_memory_utilization: 0.8, tensor_parallel_size: 2}"
    phf-eval ...                              # the same command, installed by pip

Rerunning the same command resumes: finished samples are kept, only missing ones are generated
(the progress bar counts on from those: 700/1080 samples); samples of a problem whose text has changed
since (an edited file, another --data_dir: same ids), or converted from another iteration of a
--megatron_checkpoint run (it saved a later one since), are refused, naming the directory.
Outputs in --out_dir: samples.rank*.jsonl (one line per sample), summary.json (the scores, in
percent), run_config.json (the generation settings a resume must match), merged_model/ (--adapter)
or converted_model/ (--megatron_checkpoint): the HF model evaluated (--no-keep_model deletes it at
the end), and with --plot avg_at_k.png. Backend: vLLM when installed, otherwise transformers; one engine replica per GPU
(data parallel) unless --data_parallel says otherwise. Every field of ``EvalConfig``
(``phf_megatron/eval/config.py``) is a flag; a bad flag or value is one line and exit code 2.
"""

from __future__ import annotations

import os
import sys

from ..commands import command, tool_config
from ..errors import ConfigError
from ..eval.config import EvalConfig
from ..input_files import missing_dir


def _missing_path(config: EvalConfig) -> tuple[str, str] | None:
    """``(flag, why)`` for the first model path given that is not a directory, in the order the runner reads them
    (``eval.models.resolve_model_dir``: its words), None when none: said before torch loads (~0.1 s, not ~4 s)."""
    paths = ([("megatron_checkpoint", config.megatron_checkpoint)] if config.megatron_checkpoint is not None
             else [("model", config.model), ("adapter", config.adapter)])
    return next(((key, why) for key, path in paths if path is not None and (why := missing_dir(path))), None)


def evaluate(argv: list[str], quiet: bool) -> int:
    config = tool_config(EvalConfig, argv, __doc__, quiet)
    if config is None:
        return 0
    if missing := _missing_path(config):
        raise ConfigError(*missing)
    from ..eval.runner import run_eval

    summary = run_eval(config)
    print(summary.table())
    out = config.out_dir
    outputs = sorted(f"{f}/" if os.path.isdir(os.path.join(out, f)) else f for f in os.listdir(out))
    print(f"\noutputs in {out}: {', '.join(outputs)}")
    print(f"summary: {summary.summary_path}" + (f"\nplot: {summary.plot_path}" if summary.plot_path else ""))
    return 0


main = command(evaluate)


if __name__ == "__main__":
    sys.exit(main())
