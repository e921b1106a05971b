"""Each row of the paper's table as commands: the shared inputs (toy model, HF -> Megatron-Core conversion),
the row's trainer and eval command lines, and whether a rerun skips it (``tools/paper_table.py`` runs them).

``plan_row(args, name)`` builds a row from ``paper_table.parse_args``'s config: the trainer as the examples
launch it (the scale's preset plus the row's flags from ``paper_recipes``; ``torchrun`` when ngpu > 1) into
<out>/<row>/, and the eval of its PEFT adapter at the step into <out>/<row>/eval_step<step>/.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shlex
import sys
from dataclasses import dataclass

from ..errors import InputFileError
from ..input_files import checkpoint_saved, read_json, read_latest
from .paper_recipes import PAPER_COMMON, SCALE_LAYERS, method_flags, toy_method_flags

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OFFICIAL_DATA = "siyanzhao/Openthoughts_math_30k_opsd"


@dataclass
class Row:
    name: str
    run_dir: str
    train: list[str] | None        # the trainer's command line; None: Base (the model itself)
    adapter: str | None
    eval: list[str]
    eval_result: str               # present once the eval has finished
    train_flags: list[str] | None = None   # the flags in ``train`` after the launcher: what the trainer parses


def _python(*module_args: str) -> list[str]:
    return [sys.executable, "-m", *module_args]


def _train_launcher(ngpu: int) -> list[str]:
    if ngpu > 1:  # examples/launch_phf.sh's torchrun --standalone --nproc-per-node NGPU
        return _python("torch.distributed.run", "--standalone", f"--nproc-per-node={ngpu}", "-m", "phf_megatron.train")
    return _python("phf_megatron.train")


def toy_paths(args) -> dict[str, str]:
    toy = os.path.join(args.out, "toy")
    return {"toy": toy, "hf": os.path.join(toy, "hf"), "mcore": os.path.join(toy, "mcore"),
            "train": os.path.join(toy, "train.jsonl")}


def prepare_steps(args) -> list[tuple[str, list[str], str]]:
    """``(what, argv, done_path)``: the inputs every row shares, made once (as examples/launch_phf.sh
    and examples/train_phf_tiny.sh do); the conversion only when a row trains."""
    steps, trains = [], any(r != "base" for r in args.rows)
    if args.toy:
        p = toy_paths(args)
        steps.append(("toy model + data", _python("phf_megatron.toy", "prepare", "--out", p["toy"], "--seed",
                                                  str(args.seed), "--warmup-steps", str(args.warmup_steps)),
                      os.path.join(p["hf"], "model.safetensors")))
        hf, mcore, dtype = p["hf"], p["mcore"], "fp32"
    else:
        hf, mcore, dtype = args.hf_model, os.path.join(args.out, "mcore_base"), "bf16"
    if trains:
        steps.append(("convert HF -> Megatron-Core", _python("phf_megatron.tools.hf_to_mcore", "--hf_dir", hf,
                                                             "--out_dir", mcore, "--dtype", dtype), mcore))
    return steps


def plan_row(args, name: str) -> Row:
    run_dir = os.path.join(args.out, name)
    eval_dir = os.path.join(run_dir, f"eval_step{args.step}")
    adapter = None if name == "base" else os.path.join(run_dir, "export", "peft_adapter")
    if args.toy:
        p = toy_paths(args)
        flags = None if name == "base" else [
            "--config", os.path.join(REPO, "configs", "toy_cpu.yaml"),
            f"--run_dir={run_dir}", f"--model.hf_dir={p['hf']}", f"--model.pretrained_checkpoint={p['mcore']}",
            f"--data.path={args.data or p['train']}", f"--training.seed={1234 + args.seed}",
            f"--training.train_iters={args.step}", *toy_method_flags(name), *args.overrides]
        result = os.path.join(eval_dir, "toy_eval.json")
        ev = _python("phf_megatron.toy", "evaluate", "--hf-dir", p["hf"], "--seed", str(args.seed),
                     *(["--adapter", adapter] if adapter else []), "--json", result, *shlex.split(args.eval_args))
        return Row(name, run_dir, flags and [*_train_launcher(args.ngpu), *flags], adapter, ev, result, flags)
    flags = None if name == "base" else [
        "--config", os.path.join(REPO, "configs", f"phf_qwen3_{args.scale}.yaml"),
        f"--run_dir={run_dir}", f"--model.hf_dir={args.hf_model}",
        f"--model.pretrained_checkpoint={os.path.join(args.out, 'mcore_base')}", f"--data.path={args.data or OFFICIAL_DATA}",
        *PAPER_COMMON, f"--training.train_iters={args.step}", *method_flags(name, SCALE_LAYERS[args.scale]),
        *args.overrides]
    ev = _python("phf_megatron.tools.eval_avg_at_k", "--model", args.hf_model, *(["--adapter", adapter] if adapter else []),
                 "--out_dir", eval_dir, "--n", str(args.k), *shlex.split(args.eval_args))
    return Row(name, run_dir, flags and [*_train_launcher(args.ngpu), *flags], adapter, ev,
               os.path.join(eval_dir, "summary.json"), flags)


def training_finished(row: Row, step: int) -> bool:
    """The latest checkpoint has reached ``step`` and the export is written (as ``training.export.finished_step``
    decides; whether its settings are the row's is checked before any row runs: ``paper_table._check_trainer_args``)."""
    if row.train is None:
        return True
    latest = trained_step(row)
    return (latest is not None and latest >= step and os.path.isdir(row.adapter or "")
            and checkpoint_saved(_save_dir(tuple(row.train_flags)), latest))


def trained_step(row: Row) -> int | None:
    """The step of the row's latest checkpoint (where a rerun resumes), None before its first or when the
    latest file is damaged (the training rerun names it)."""
    if not row.train_flags:
        return None
    try:
        return read_latest(_save_dir(tuple(row.train_flags)))
    except InputFileError:
        return None


@functools.lru_cache(maxsize=None)
def _save_dir(train_flags: tuple[str, ...]) -> str:
    """The row's checkpoints directory as the trainer sees it (``--checkpoint.save`` after ``--`` moves it out of
    the row's); parsed once per command line, as a table asks each row many times."""
    from ..training.config_io import config_from_argv   # (no torch)

    return config_from_argv(list(train_flags)).save_dir


def eval_finished(row: Row, k: int, toy: bool) -> bool:
    return os.path.isfile(row.eval_result) and eval_differs(row, k, toy) is None


#: the eval's settings a row's numbers depend on (Average@k by the official grader): a summary.json written
#: with others (a --limit smoke, another --n or benchmark set) is not the row's result
SCORE_KEYS = ("n", "benchmarks", "data_dir", "data_revision", "limit", "temperature", "top_p", "top_k",
              "max_new_tokens", "thinking", "seed", "dtype", "max_model_len")


def eval_differs(row: Row, k: int, toy: bool) -> str | None:
    """How the row's eval result was made otherwise than its eval command says (``"limit 5, not null"``: JSON values),
    or None: the same settings (the toy's: no settings recorded)."""
    return "; ".join(diff for _, diff in _differences(row, k, toy)) or None


def check_eval_dirs(rows: list[Row], k: int, toy: bool, step: int) -> None:
    """Before any row runs: a row's eval directory holding samples its eval does not resume is refused by that eval,
    after the rows before it ran; its samples are the user's to remove (a --limit, --n or --benchmarks difference
    resumes). Its summary's settings the eval's resume compares (``GENERATION_KEYS``, top_p, max_model_len), then,
    as the eval will meet them, the settings its samples were made with (``run_config.json``, written when the eval
    starts: a partial directory) and the problems they were made for; not a row the table skips (trained, its
    summary its own)."""
    from ..eval.config import GENERATION_KEYS

    for row in rows:
        if toy or (training_finished(row, step) and eval_finished(row, k, toy)):
            continue
        summary = _differences(row, k, toy) if os.path.isfile(row.eval_result) else []
        refused = [diff for key, diff in summary if key in (*GENERATION_KEYS, "top_p", "max_model_len")]
        other = None
        if not refused:
            refused, other = _sample_refusals(row)
        if refused or other:
            what = (f"made with other settings ({'; '.join(refused)})" if refused else
                    f"of other problems under the same ids ({other}: the benchmark's file or --data_dir changed)")
            raise InputFileError(os.path.dirname(row.eval_result), f"row {row.name}'s eval holds samples {what}, "
                                 "which its eval does not resume; remove the directory (or give another --out) to "
                                 "evaluate the row with its settings")


def _sample_refusals(row: Row) -> tuple[list[str], str | None]:
    """``"top_p 0.8, not 0.95"`` (JSON values) for each setting the row's eval refuses to resume its directory's
    samples with, and the problems it refuses them for (``resume.planned_resume_refusals``: the eval's own rules,
    before its model is merged)."""
    from ..eval.resume import RUN_CONFIG

    if not os.path.isfile(os.path.join(os.path.dirname(row.eval_result), RUN_CONFIG)):
        return [], None   # no eval started there (its shards are not read)
    from ..cli import Settings
    from ..eval.config import EvalConfig
    from ..eval.resume import planned_resume_refusals

    settings = Settings(EvalConfig)
    config = settings.build(settings.parse(eval_settings(row.eval[3:])))   # python -m <module> FLAGS
    differences, other = planned_resume_refusals(config)
    return [f"{key} {json.dumps(old)}, not {json.dumps(new)}" for key, (old, new) in differences.items()], other


def _differences(row: Row, k: int, toy: bool) -> list[tuple[str, str]]:
    """(setting, ``"limit 5, not null"``) for each setting of the row's eval result that its eval command changes."""
    data = read_json(row.eval_result)   # damaged: one line naming it
    if toy:
        return []
    result_value(data, row.eval_result, number=False)
    k_diff = [] if data.get("k") == k else [("n", f"k {data.get('k')}, not {k}")]   # (its config's n: the same)
    done = data.get("config")
    if not isinstance(done, dict):   # a summary written before it recorded its settings: k alone
        return k_diff
    from ..cli import Settings, coerce
    from ..eval.config import EvalConfig
    from ..models.choices import dtype_name

    # the command's values over the defaults, not the config built: its checks (the benchmark files there, from
    # this working directory) are the eval's, and a --table_only reads the summary elsewhere, later
    settings = Settings(EvalConfig)
    want = {f.name: f.default for f in dataclasses.fields(EvalConfig) if f.default is not dataclasses.MISSING}
    want.update((key, coerce(raw, settings.types[key], key))
                for key, raw in settings.parse(eval_settings(row.eval[3:])).items())   # python -m <module> FLAGS
    want["dtype"] = dtype_name(want["dtype"])   # as the eval records it: --dtype bf16 made "bfloat16, not bf16"
    done, same = _sampled(done), _sampled(json.loads(json.dumps(want, default=str)))
    return k_diff + [(key, f"{key} {json.dumps(done.get(key))}, not {json.dumps(same[key])}") for key in SCORE_KEYS
                     if key in done and done[key] != same[key] and key != "n"]


def _sampled(config: dict) -> dict:
    """``config`` with its top_p as sampled (None: the official choice for its thinking mode, as the eval's resume
    compares it): a summary written before the default was None (1289de6) holds the paper's 0.95."""
    from ..eval.config import OFFICIAL_TOP_P

    if "top_p" not in config or config["top_p"] is not None:
        return config
    return {**config, "top_p": OFFICIAL_TOP_P[bool(config.get("thinking", True))]}


def result_value(data, path: str, *keys: str, number: bool = True):
    """``data[keys[0]][keys[1]]...`` of a row's eval result: a number (``number=False``: a JSON object); a file
    of another shape (a list, a key missing, a number where an object goes) is an ``InputFileError`` naming it."""
    from ..errors import InputFileError

    what = ("a summary.json of tools/eval_avg_at_k.py" if path.endswith("summary.json")
            else "a toy evaluate --json file")

    def wrong(expected: str, at: str, found) -> InputFileError:
        return InputFileError(path, f"expected {expected} at {at or 'the top level'}, "
                              f"found {json.dumps(found)[:40]} (not {what}?)")

    for depth, key in enumerate(keys):
        if not isinstance(data, dict):
            raise wrong("a JSON object", ".".join(keys[:depth]), data)
        if key not in data:
            raise InputFileError(path, f"no {'.'.join(keys[:depth + 1])} in the file (not {what}?)")
        data = data[key]
    if number and not (isinstance(data, (int, float)) and not isinstance(data, bool)):
        raise wrong("a number", ".".join(keys), data)
    if not number and not isinstance(data, dict):
        raise wrong("a JSON object", ".".join(keys), data)
    return data


def eval_settings(flags: list[str]) -> list[str]:
    """The eval's flags that set ``EvalConfig`` fields: without its command's own switches (``--verbose``)."""
    from ..commands import VERBOSE

    return [a for a in flags if a not in VERBOSE]


def check_eval_values(eval_args: str, k: int, hf_model: str, out_dir: str) -> None:
    """The eval's own checks of ``--eval_args``' values with the table's ``--k`` (a --pass_ks past it, a --top_p
    of 2): one line before any row runs, not each row's eval failing after its training."""
    from ..cli import Settings
    from ..config_errors import fail
    from ..errors import UserError
    from ..eval.config import EvalConfig

    settings = Settings(EvalConfig)
    try:
        settings.build({**settings.parse(eval_settings(shlex.split(eval_args))), "n": k, "model": hf_model, "out_dir": out_dir})
    except UserError as err:
        raise fail("eval_args", f"{err.line} (in {eval_args!r}, with the table's --k {k})") from None


#: trainer settings each row sets itself (``plan_row``), and the table's flag for them: one after ``--``
#: replaced every row's (the last flag wins): rows trained on another base than evaluated, all rows one method
ROW_SETTINGS = (("run_dir", "--out"), ("training.train_iters", "--step"), ("model.hf_dir", "--hf_model"),
                ("method", "--rows"), ("ablation", "--rows"))


def _setting(cfg, key: str):
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def check_overrides(row: Row, cfg, overrides: list[str]) -> None:
    """The overrides after ``--`` (last in the row's flags) replace none of ``ROW_SETTINGS`` in ``cfg``, the
    row's config."""
    from ..errors import UserError
    from ..training.config_io import config_from_argv

    own = config_from_argv(row.train_flags[:len(row.train_flags) - len(overrides)])
    for key, flag in ROW_SETTINGS:
        given, mine = _setting(cfg, key), _setting(own, key)
        if key in ("run_dir", "model.hf_dir") and isinstance(given, str) and isinstance(mine, str):
            given, mine = os.path.realpath(given), os.path.realpath(mine)   # the same directory, typed otherwise
        if given != mine:
            raise UserError(f"--{key}: set by the table for each row (the {row.name} row's: "
                            f"{_setting(own, key)}; the table's {flag}), not after --")


def check_save_dirs(rows: list[Row], seeds: list[int] | None = None) -> None:
    """No two rows train into one checkpoints directory: a ``--checkpoint.save`` after ``--`` is every row's, and
    the second row would resume from the first's checkpoints (one row per table run may move its own there).
    ``seeds``: each row's seed (``--seeds``: every seed's table trains each row again)."""
    from ..errors import ConfigError

    seen: dict[str, str] = {}
    for i, row in enumerate(rows):
        if row.train_flags:
            save_dir = os.path.realpath(_save_dir(tuple(row.train_flags)))
            name, one = (row.name, f"--rows {row.name}") if seeds is None else \
                (f"{row.name} (seed {seeds[i]})", f"--rows {row.name} --seed {seeds[i]}")
            if save_dir in seen:
                raise ConfigError("checkpoint.save", f"the {seen[save_dir]} and {name} rows would share the "
                                  f"checkpoints in {save_dir}: give it after -- with one row ({one}) per table "
                                  "run, or leave it out (each row's <out>/<row>/checkpoints)")
            seen[save_dir] = name
