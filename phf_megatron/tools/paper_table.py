"""The paper's Table 1 and ablation table on our stack, from one command (resumable).

    # every row of Table 1 (Base, SFT, GRPO, OPSD, PHF) and Table 2 (direction only, geometry only,
    # selected layers) at one scale: train each to step 100, evaluate checkpoint 100 by Average@12
    python tools/paper_table.py --hf_model /models/Qwen3-1.7B --scale 1p7b --out runs/table_1p7b
    python tools/paper_table.py ... --rows base,opsd,phf --dry_run          # print the commands only
    python tools/paper_table.py ... --rows sft --eval_args="--limit 5" -- --training.micro_batch_size=2  # eval flags; trainer overrides after --
    python tools/paper_table.py ... --table_only       # assemble the table from the rows' directories
    python tools/paper_table.py --toy --out runs/table_toy   # the embedded toy task on a CPU (minutes)
    python tools/paper_table.py --toy --seeds 0,1,2,3,4 --out runs/table_toy  # per seed, then mean ± sd

Each row runs the trainer as the examples do (the scale's preset configs/phf_qwen3_<scale>.yaml plus
the row's flags from ``paper_recipes``, then the overrides after ``--``, which may not replace the row's
run_dir, train_iters, model.hf_dir, method or ablation, nor put two rows' checkpoints in one
``checkpoint.save``; ``torchrun`` when --ngpu > 1) into <out>/<row>/, then the
eval (``tools/eval_avg_at_k.py``, Average@k, official grader) of the run's PEFT adapter at --step into
<out>/<row>/eval_step<step>/ (Base: the HF model itself). The rows run one after the other; a row
whose training is finished and whose eval summary is present, made with the row's eval settings (k, benchmarks,
--limit, sampling: ``paper_rows.eval_differs``), is skipped, an unfinished one resumes
(the trainer and the eval resume their directories), so a rerun after a kill completes the table.
Rows can also run as separate jobs (``--rows sft`` each) and be assembled with ``--table_only``.
Writes <out>/table.md and <out>/table.json: our Average@k per benchmark and suite mean beside the
paper's (``paper_numbers.json``: the numbers with their line in the paper's LaTeX source), and the
difference; a row without them is "not run", "trained to step N of S", "trained, not evaluated" or
"evaluated with other settings (limit 5, not null)" (a --limit smoke's summary: not the row's result).
Logs: <out>/<row>/train.log, eval.log. Each row's command lines: ``paper_rows``.
"""

from __future__ import annotations

import copy
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass

from ..commands import command, parse_command_line
from ..config_errors import check_choice, fail
from ..input_files import missing_dir
from ..runtime.children import run_reaped
from .paper_recipes import ROWS, SCALES, TOY_ROWS
from .paper_rows import (
    REPO, Row, eval_finished, plan_row, prepare_steps, trained_step, training_finished,
    check_eval_dirs, check_eval_values, check_overrides, check_save_dirs, eval_settings)
from .row_table import build_table, read_scores, table_markdown, write_table


@dataclass
class PaperTable:
    """Which rows, at which scale, into which directory (trainer overrides go after ``--``)."""

    out: str
    """the table's directory: <out>/<row>/ per row (run, logs, eval_step<step>/), table.md, table.json."""
    hf_model: str | None = None
    """the HF Qwen3 directory of the scale: Base is this model, every other row starts from it."""
    scale: str | None = None
    """1p7b | 4b | 8b: the preset (configs/phf_qwen3_<scale>.yaml) and the paper's numbers."""
    toy: bool = False
    """the embedded toy task on a CPU instead (no hf_model/scale): its tiny model, configs/toy_cpu.yaml,
    the toy's held-out evaluation; no paper numbers (not comparable)."""
    rows: tuple[str, ...] = ROWS
    """comma-separated: base, sft, grpo, opsd, phf (Table 1), direction_only, geometry_only,
    selected_layers (Table 2; not on the toy, whose 2 layers have no such subset)."""
    step: int = 100
    """train each row to this step and evaluate its checkpoint (paper: 100)."""
    k: int = 12
    """samples per problem of Average@k (paper: 12)."""
    ngpu: int = 0
    """processes per training run (torchrun when > 1); 0: 8 (one node, as the examples), toy 1."""
    data: str | None = None
    """the training set; None: the official OPSD set (toy: its train.jsonl)."""
    eval_args: str = ""
    """extra flags for every evaluation, one string (e.g. "--limit 5 --dtype float32"); not --n (--k), --model,
    --adapter, --megatron_checkpoint or --out_dir: the table sets them for each row; checked as the eval checks them
    (with --k) before any row runs. Not with toy (its evaluation takes none)."""
    seed: int = 0
    """toy: the split, init and warm-up seed (trainer seed 1234 + seed, as examples/train_phf_tiny.sh)."""
    seeds: tuple[int, ...] | None = None
    """toy: the whole table once per seed into <out>/s<seed>/ (each as --seed), then <out>/table_seeds.md
    and .json: each row's mean ± sd over the seeds."""
    warmup_steps: int = 300
    """toy: supervised warm-up steps of the tiny model (python -m phf_megatron.toy prepare)."""
    dry_run: bool = False
    """print the commands (those a rerun would skip marked), run nothing; a --hf_model not here is a note."""
    table_only: bool = False
    """write the table from the rows' directories (rows run as separate jobs), run nothing."""

    def __post_init__(self) -> None:
        bad = [r for r in self.rows if r not in ROWS]
        if bad or not self.rows:
            raise fail("rows", f"unknown row {bad[0] if bad else ''!r} (rows: {', '.join(ROWS)})")
        for key in ("step", "k", "warmup_steps"):
            if getattr(self, key) < 1:
                raise fail(key, f"must be >= 1, got {getattr(self, key)}")
        if self.ngpu < 0:
            raise fail("ngpu", f"must be >= 0 (0: 8, toy 1), got {self.ngpu}")
        _check_eval_args(self.eval_args)   # here, not when the first row's eval starts (after its training)
        if self.toy and self.eval_args.strip():   # they went to `toy evaluate`, whose argparse refused them there
            raise fail("eval_args", "the toy's evaluation (python -m phf_megatron.toy evaluate) takes no flags, "
                                    f"got {self.eval_args!r}")
        if self.data and self.data.startswith(("/", ".", "~")) and not os.path.exists(self.data):
            raise fail("data", f"{self.data} does not exist")
        if self.seeds is not None and (not self.toy or not self.seeds or len(set(self.seeds)) != len(self.seeds)):
            raise fail("seeds", "distinct seeds, with --toy (a real scale's table is one run per row)")
        if self.toy:
            if self.hf_model or self.scale:
                raise fail("toy", "the toy builds its own model: drop --hf_model and --scale")
            if "selected_layers" in self.rows:
                if tuple(self.rows) != ROWS:
                    raise fail("rows", "selected_layers: the toy's 2 layers have no subset with a neighbouring pair "
                               "but both, which is the phf row (toy rows: " + ", ".join(TOY_ROWS) + ")")
                self.rows = TOY_ROWS
            return
        if self.scale is None:
            raise fail("scale", "required: 1p7b, 4b or 8b (or --toy)")
        check_choice("scale", self.scale, SCALES)
        if not self.hf_model:
            raise fail("hf_model", "required: the HF Qwen3 directory of the scale")
        if (why := hf_model_problem(self.hf_model)) and not self.dry_run:   # a dry run prints it (``one_table``)
            raise fail("hf_model", why)
        if not self.table_only:   # the eval's checks of their values (--pass_ks past --k): now, not after training
            check_eval_values(self.eval_args, self.k, self.hf_model, os.path.join(self.out, "row"))


def hf_model_problem(hf_model: str) -> str | None:
    """What keeps ``hf_model`` from being the table's HF model directory, None when it is one."""
    if why := missing_dir(hf_model):   # was "has no config.json" for a mistyped path too
        return why
    if not os.path.isfile(os.path.join(hf_model, "config.json")):
        return f"{hf_model} has no config.json (not a HF model directory)"
    return None


def _check_eval_args(eval_args: str) -> None:
    from ..cli import Settings
    from ..commands import VERBOSE
    from ..errors import UserError
    from ..eval.config import EvalConfig

    try:   # the eval's own switches (--verbose) are flags of its command, not EvalConfig fields
        given = Settings(EvalConfig, options=list(VERBOSE)).parse(eval_settings(shlex.split(eval_args)))
    except (ValueError, UserError) as err:   # "No closing quotation", "--bogus: unknown setting"
        raise fail("eval_args", f"{getattr(err, 'line', err)} (in {eval_args!r})") from None
    # the eval's last flag wins: these replaced the row's own (every row scored as --model / --adapter X, or its
    # result written elsewhere, or --n other than --k: each row's eval then "failed (exit code 0)")
    for key, instead in (("n", "the table's --k"), ("model", "--hf_model"), ("adapter", "each row's own"),
                         ("megatron_checkpoint", "each row's adapter"), ("out_dir", "<out>/<row>/eval_step<step>")):
        if key in given:
            raise fail("eval_args", f"--{key} is set by the table for each row ({instead}) (in {eval_args!r})")


def _check_trainer_args(rows: list[Row], step: int, overrides: list[str] = (), seeds: list[int] | None = None,
                        ngpu: int = 1) -> None:
    """Each row's trainer command line as the trainer parses it (keys, values, checks across settings, over ``ngpu``):
    a bad flag after ``--`` stops the table here, not when its row starts, after the rows before it. A row
    finished already is reused only if the trainer would reuse it (``training.export.finished_step``: the same
    settings), not scored again under flags it was not trained with."""
    from ..errors import SettingsDiffer, UserError
    from ..training.config_io import config_from_argv, with_checkpoint_holdout
    from ..training.export import finished_step

    for row in rows:
        if row.train_flags:
            try:
                cfg = config_from_argv(row.train_flags)
            except UserError as err:
                raise UserError(f"{err.line} (in the {row.name} row's trainer flags)") from None
            try:   # was found as the row's training started (8B at --ngpu 6: 32 samples over 3 ranks)
                cfg.check_world_size(ngpu)
            except UserError as err:
                raise UserError(f"{err.line} (the {row.name} row on --ngpu {ngpu} ranks)") from None
            if overrides:
                check_overrides(row, cfg, overrides)
            try:
                if training_finished(row, step):   # with the holdout its rerun adopts from the checkpoint
                    finished_step(with_checkpoint_holdout(cfg)[0])
            except SettingsDiffer as err:  # a damaged file of the run is its own line, naming it
                raise UserError(f"{err.line} (the {row.name} row, finished in {row.run_dir}, was trained with other "
                                "settings: give a new --out to train it with these)") from None
    check_save_dirs(rows, seeds)   # (after each row's flags are parsed: a bad one is named with its row)


def parse_args(argv: list[str]):
    """The config (absolute paths, ngpu and scale resolved) and ``overrides``: what follows ``--``,
    passed to every trainer; None after ``--help``."""
    head, overrides = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = parse_command_line(PaperTable, head, __doc__)[0]
    if args is None:
        return None
    args.out = os.path.abspath(args.out)
    args.hf_model = args.hf_model and os.path.abspath(args.hf_model)
    args.scale = "toy" if args.toy else args.scale
    args.ngpu = args.ngpu or (1 if args.toy else 8)
    args.overrides = overrides
    return args


def _say(msg: str) -> None:
    print(f"paper_table: {msg}", flush=True)


def _run(argv: list[str], log: str) -> tuple[int, float]:
    """Run ``argv`` with its output appended to ``log`` (in this process group: a kill of the
    harness's group stops it too; a SIGKILL of the harness alone stops it as well: ``run_reaped``)."""
    os.makedirs(os.path.dirname(log), exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": REPO + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")}
    start = time.monotonic()
    with open(log, "a") as f:
        f.write(f"\n$ {shlex.join(argv)}\n")
        f.flush()
        rc = run_reaped(argv, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    return rc, time.monotonic() - start


def _failed(what: str, rc: int, log: str) -> int:
    with open(log, encoding="utf-8", errors="replace") as f:   # a child killed mid-character (OOM): its bytes cut
        tail = f.read().splitlines()[-15:]
    print("\n".join(tail), file=sys.stderr)
    print(f"error: {what} failed (exit code {rc}); its log: {log}", file=sys.stderr)
    return 1


def run_rows(args, rows: list[Row]) -> int:
    for what, argv, done in prepare_steps(args):
        if os.path.exists(done):
            _say(f"{what}: present ({done})")
            continue
        log = os.path.join(args.out, "prepare.log")
        _say(f"{what}: running (log: {log})")
        rc, secs = _run(argv, log)
        if rc != 0:
            return _failed(what, rc, log)
        _say(f"{what}: done in {secs:.0f} s")
    for i, row in enumerate(rows, 1):
        tag = f"[{i}/{len(rows)}] {row.name}"
        if training_finished(row, args.step) and eval_finished(row, args.k, args.toy):
            _say(f"{tag}: finished, skipped")
            continue
        if not training_finished(row, args.step):
            log = os.path.join(row.run_dir, "train.log")
            at = trained_step(row)   # where the trainer finds it (a --checkpoint.save after -- too)
            state = "training" if at is None else f"resuming from step {at}"
            _say(f"{tag}: {state} to step {args.step} (log: {log})")
            rc, secs = _run(row.train, log)
            if rc != 0 or not training_finished(row, args.step):
                return _failed(f"{row.name}: training", rc, log)
            _say(f"{tag}: trained in {secs:.0f} s")
        log = os.path.join(row.run_dir, "eval.log")
        _say(f"{tag}: evaluating (log: {log})")
        rc, secs = _run(row.eval, log)
        if rc != 0 or not eval_finished(row, args.k, args.toy):
            return _failed(f"{row.name}: evaluation", rc, log)
        scores = read_scores(row, args.toy)
        _say(f"{tag}: " + "  ".join(f"{k} {v:.2f}" for k, v in scores.items()) + f"  ({secs:.0f} s)")
        write_table(args, rows)
    return 0


def paper_table(argv: list[str], quiet: bool) -> int:
    args = parse_args(argv)
    if args is None:
        return 0
    if args.table_only and (why := missing_dir(args.out)):   # a mistyped --out made a table of "not run" rows
        raise fail("out", f"{why} (--table_only assembles the rows run into it)")
    if os.path.exists(args.out) and not os.path.isdir(args.out):   # was "[Errno 17] File exists" at the first row
        raise fail("out", f"{args.out} is not a directory (the table's: a directory per row)")
    if args.seeds is not None:   # a seed not run yet: its rows are "not run", the summary over the others'
        return seeds_tables(args)
    return one_table(args)


def seeds_tables(args) -> int:
    """``--seeds``: the toy table of every seed (each resumable as one table is), then their summary."""
    from ..output_files import write_json, write_text
    from .seed_table import seeds_markdown, seeds_summary

    out, tables, runs = args.out, {}, [copy.copy(args) for _ in args.seeds]
    for seed, seed_args in zip(args.seeds, runs):
        seed_args.seed, seed_args.out = seed, os.path.join(out, f"s{seed}")
    if not args.table_only:   # each table checks its own rows; two seeds' rows sharing a --checkpoint.save: here
        _check_trainer_args([plan_row(a, name) for a in runs for name in args.rows], args.step, args.overrides,
                            seeds=[a.seed for a in runs for _ in args.rows], ngpu=args.ngpu)
    for seed, seed_args in zip(args.seeds, runs):
        if not args.dry_run:
            _say(f"seed {seed} -> {seed_args.out}")
        rc = one_table(seed_args)
        if rc != 0:
            return rc
        if not args.dry_run:
            tables[seed] = build_table(seed_args, [plan_row(seed_args, name) for name in args.rows])
    if args.dry_run:
        return 0
    summary = seeds_summary(tables)
    write_json(os.path.join(out, "table_seeds.json"), summary, indent=1)
    write_text(os.path.join(out, "table_seeds.md"), seeds_markdown(summary))
    _say(f"over seeds: {os.path.join(out, 'table_seeds.md')} and table_seeds.json")
    print(seeds_markdown(summary), end="")
    return 0


def one_table(args) -> int:
    rows = [plan_row(args, name) for name in args.rows]
    if not args.table_only:
        _check_trainer_args(rows, args.step, args.overrides, ngpu=args.ngpu)
        check_eval_dirs(rows, args.k, args.toy, args.step)   # the eval would refuse them after the rows before
    if args.dry_run:
        if not args.toy and (why := hf_model_problem(args.hf_model)):   # the commands still say what would run
            print(f"note: --hf_model: {why}: the commands only (a run without --dry_run refuses it)", file=sys.stderr)
        for what, argv_, done in prepare_steps(args):
            print(("# present, skipped: " if os.path.exists(done) else "+ ") + shlex.join(argv_))
        for row in rows:
            skip = training_finished(row, args.step) and eval_finished(row, args.k, args.toy)
            for argv_ in ([row.train] if row.train else []) + [row.eval]:
                print(f"# {row.name}" + (" (finished, skipped)" if skip else "") + "\n+ " + shlex.join(argv_))
        return 0
    if not args.table_only:
        _say(f"{len(rows)} rows ({', '.join(args.rows)}) at scale {args.scale}, step {args.step} -> {args.out}")
        rc = run_rows(args, rows)
        if rc != 0:
            return rc
    table = write_table(args, rows)
    _say(f"table: {os.path.join(args.out, 'table.md')} and table.json")
    print(table_markdown(table), end="")
    return 0


main = command(paper_table)


if __name__ == "__main__":
    sys.exit(main())
