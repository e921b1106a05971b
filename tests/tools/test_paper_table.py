"""``tools/paper_table.py``: the paper's rows from one table of recipes, run, resumed and skipped.

The real scales cannot train here: their dry run must print the recipe of every row (method, the
paper's batch, lr, LoRA, step 100, torchrun on 8 GPUs) and each trainer command line must load as a
valid config. The toy mode runs every Table 1 row end to end on the CPU, is killed during a row's
training and completes on a rerun (that row's trainer resumes), and a third run relaunches nothing.
"""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

from phf_megatron.tools import paper_rows, paper_table
from phf_megatron.tools.paper_recipes import (ABLATION_ROWS, BENCHMARKS, PAPER_COMMON, ROWS, TABLE1_ROWS, TOY_ROWS,
                                               PaperNumbers, method_flags)

from ..helpers import REPO, python_env
from .rows import fake_trained



def _fake_model(tmp_path, layers=28, name="hf"):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"num_hidden_layers": layers}))
    return str(d)


def _commands(out: str) -> dict[str, list[list[str]]]:
    """The dry run's commands by row (``# row`` then ``+ argv``), prepare steps under ``""``."""
    by_row, row = {}, ""
    for line in out.splitlines():
        if line.startswith("# "):
            row = line[2:].split()[0]
        elif line.startswith("+ "):
            by_row.setdefault(row, []).append(shlex.split(line[2:]))
    return by_row


def _flags(argv: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)


# ----------------------------------------------------------------------------- the paper's numbers


def test_paper_numbers_are_consistent_transcriptions():
    """Each Table 1 average is the mean of its three benchmarks (to the paper's rounding), and Table
    2's OPSD and PHF columns repeat Table 1's averages. The ablation table is the paper's Table 2 (its
    source file is tables/table3_ablations.tex; Table 3 of the paper is the hyperparameters)."""
    paper = PaperNumbers.load()
    for scale in ("1p7b", "4b", "8b"):
        for row in TABLE1_ROWS:
            r = paper.row(scale, row)
            assert abs(sum(r[b] for b in BENCHMARKS) / 3 - r["average"]) <= 0.011, (scale, row)
            assert "Table 1" in r["source"]
        for row in ("opsd", "phf"):
            assert paper.table3["rows"][row][scale] == paper.row(scale, row)["average"]
        for row in ABLATION_ROWS:
            assert set(paper.row(scale, row)) == {"average", "source"}
            assert paper.row(scale, row)["source"].startswith("Table 2 (tables/table3_ablations.tex)"), row


def test_paper_numbers_are_the_numbers_of_their_tex_lines():
    """Every number is the one on its row of the paper's LaTeX (``tex``: the line verbatim, kept with
    the numbers as their provenance), in column order, and the line names the row."""
    data = json.load(open(os.path.join(REPO, "phf_megatron", "tools", "paper_numbers.json")))
    for scale, rows in data["table1"]["rows"].items():
        for row, r in rows.items():
            nums = [float(x) for x in re.findall(r"\d+\.\d+", r["tex"])]
            assert nums == [r[c] for c in data["table1"]["columns"]], (scale, row)
            assert row.lower() in r["tex"].lower()
    for row, r in data["table3"]["rows"].items():
        assert [float(x) for x in re.findall(r"\d+\.\d+", r["tex"])] == [r[c] for c in ("1p7b", "4b", "8b")], row


# ----------------------------------------------------------------------------- the real scales: dry run


@pytest.mark.parametrize("scale,layers", [("1p7b", 28), ("8b", 36)])
def test_dry_run_prints_every_rows_recipe_and_runs_nothing(tmp_path, capsys, scale, layers):
    hf, out = _fake_model(tmp_path, layers), str(tmp_path / "table")
    assert paper_table.main(["--hf_model", hf, "--scale", scale, "--out", out, "--dry_run"]) == 0
    cmds = _commands(capsys.readouterr().out)
    assert not os.path.exists(out)                                        # nothing ran, nothing written
    assert set(cmds) == {"", *ROWS}
    assert cmds[""][0][2] == "phf_megatron.tools.hf_to_mcore"
    assert cmds["base"] == [[sys.executable, "-m", "phf_megatron.tools.eval_avg_at_k", "--model", hf, "--out_dir",
                             os.path.join(out, "base", "eval_step100"), "--n", "12"]]
    expected_method = {"sft": "sft", "grpo": "grpo"}
    for row in ROWS[1:]:
        train, ev = cmds[row]
        assert train[:6] == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=8", "-m"]
        assert train[6:9] == ["phf_megatron.train", "--config", os.path.join(REPO, "configs", f"phf_qwen3_{scale}.yaml")]
        f = _flags(train)
        assert f.get("method", "phf") == expected_method.get(row, "phf"), row
        assert (f["training.global_batch_size"], f["optimizer.lr"], f["lora.r"], f["lora.alpha"],
                f["training.train_iters"]) == ("32", "5e-6", "64", "128", "100"), row
        assert f["run_dir"] == os.path.join(out, row) and f["model.hf_dir"] == hf
        assert f.get("ablation") == {"opsd": "opsd_only", "sft": None, "grpo": None, "phf": None}.get(row, row)
        assert ev[ev.index("--adapter") + 1] == os.path.join(out, row, "export", "peft_adapter")
        assert ev[ev.index("--n") + 1] == "12"
    assert _flags(cmds["grpo"][0])["rollout.n"] == "8"
    assert _flags(cmds["sft"][0])["training.micro_batch_size"] == "1"
    assert _flags(cmds["selected_layers"][0])["objective.flow_layers"] == (
        "6,7,20,21" if layers == 28 else "8,9,26,27")


@pytest.mark.parametrize("made", [False, True])
def test_a_dry_run_prints_the_commands_for_a_model_not_here(tmp_path, capsys, made):
    """README's "the commands only" (--dry_run): a --hf_model not on this machine (or without config.json) was
    refused as a run refuses it; now the commands, and a note on stderr. The run itself still refuses it."""
    hf, out = str(tmp_path / "Qwen3-1.7B"), str(tmp_path / "table")
    why = f"{hf} has no config.json (not a HF model directory)" if made else f"{hf} does not exist"
    if made:
        os.mkdir(hf)
    argv = ["--hf_model", hf, "--scale", "1p7b", "--out", out]
    assert paper_table.main([*argv, "--dry_run"]) == 0
    said = capsys.readouterr()
    cmds = _commands(said.out)
    assert set(cmds) == {"", *ROWS} and cmds["base"][0][3:5] == ["--model", hf]
    assert said.err == f"note: --hf_model: {why}: the commands only (a run without --dry_run refuses it)\n"
    assert not os.path.exists(out)
    assert paper_table.main(argv) == 2
    assert capsys.readouterr().err == f"error: --hf_model: {why}\n"


@pytest.mark.parametrize("row", ROWS[1:])
def test_every_rows_command_line_is_a_valid_training_config(tmp_path, row):
    """The trainer's own loader accepts each row's flags at each scale (no setting a typo or a
    combination the trainer refuses)."""
    from transformers import Qwen3Config

    from phf_megatron.training.config_io import load_config
    from phf_megatron.training.model_setup import check_settings_fit_model

    for scale, layers in (("1p7b", 28), ("4b", 36), ("8b", 36)):
        args = paper_table.parse_args(["--hf_model", _fake_model(tmp_path, layers, scale), "--scale", scale, "--out", "o"])
        train = paper_table.plan_row(args, row).train
        cfg = load_config(train[train.index("--config") + 1], train[train.index("--config") + 2:])
        check_settings_fit_model(cfg, Qwen3Config(num_hidden_layers=layers, num_attention_heads=32,
                                                  num_key_value_heads=8, max_position_embeddings=40960))
        assert cfg.training.train_iters == 100 and cfg.training.global_batch_size == 32
        assert (cfg.lora.r, cfg.lora.alpha, cfg.optimizer.lr) == (64, 128, 5e-6)
        assert cfg.method == {"sft": "sft", "grpo": "grpo"}.get(row, "phf")


def test_every_toy_rows_command_line_is_a_valid_training_config(tmp_path, capsys):
    """The toy's default rows on its 2-layer model (the selected-layers row, whose subset the toy cannot
    have, failed at its training before it was left out; asking for it is one line)."""
    from transformers import Qwen3Config

    from phf_megatron.toy.model import ToyModelConfig
    from phf_megatron.training.config_io import load_config
    from phf_megatron.training.model_setup import check_settings_fit_model

    out = str(tmp_path / "toy")
    args = paper_table.parse_args(["--toy", "--out", out])
    assert args.rows == TOY_ROWS and "selected_layers" not in TOY_ROWS
    hf = paper_rows.toy_paths(args)["hf"]
    os.makedirs(os.path.dirname(hf))
    _fake_model(tmp_path / "toy" / "toy", layers=2, name="hf")
    toy = ToyModelConfig()
    model = Qwen3Config(num_hidden_layers=toy.layers, num_attention_heads=toy.heads, num_key_value_heads=toy.kv_heads,
                        hidden_size=toy.hidden, head_dim=toy.head_dim, max_position_embeddings=512)
    for row in args.rows[1:]:
        train = paper_table.plan_row(args, row).train
        cfg = load_config(train[train.index("--config") + 1], train[train.index("--config") + 2:])
        check_settings_fit_model(cfg, model)          # what the trainer checks against the model at its start
        assert cfg.training.train_iters == 100
    assert paper_table.main(["--toy", "--out", out, "--rows", "opsd,selected_layers"]) == 2
    assert capsys.readouterr().err.startswith("error: --rows: selected_layers: the toy's 2 layers")


@pytest.mark.parametrize("script,row", [("train_sft_qwen3.sh", "sft"), ("train_grpo_qwen3.sh", "grpo")])
def test_the_examples_train_the_recipes_rows(script, row):
    """The shell examples and the harness's table agree: every flag the example adds is the row's."""
    text = open(os.path.join(REPO, "examples", script)).read()
    exec_line = text[text.index("exec bash"):]
    example = set(re.findall(r"--[\w.]+=\S+", exec_line.split('"$@"')[0]))
    assert example <= set(method_flags(row, 28)) | set(PAPER_COMMON), example


@pytest.mark.parametrize("argv,line", [
    (["--toy", "--out", "o", "--rows", "base,nope"], "error: --rows: unknown row 'nope'"),
    # a mistyped path was "has no config.json" (not a HF model directory)
    (["--scale", "1p7b", "--out", "o", "--hf_model", "/no/such/model"], "error: --hf_model: /no/such/model does not exist"),
    (["--scale", "1p7b", "--out", "o", "--hf_model", "{tmp}"], "error: --hf_model: {tmp} has no config.json"),
    (["--out", "o", "--hf_model", "x"], "error: --scale: required"),
    (["--toy", "--scale", "4b", "--out", "o"], "error: --toy: the toy builds its own model"),
    (["--scale", "4b", "--out", "o", "--hf_model", "x", "--seeds", "0,1"], "error: --seeds: distinct seeds, with --toy"),
    (["--toy", "--out", "o", "--seeds", "3,3"], "error: --seeds: distinct seeds, with --toy"),
    # each was found only when the first row's eval or training started (a traceback, or hours later)
    (["--toy", "--out", "o", "--eval_args=--bogus 1"], "error: --eval_args: --bogus: unknown setting; the flags: "
                                                       "--out_dir, --model, --adapter, "),
    # no switch of the table's own (its rows' logs hold the output): was "unknown setting" alone, which flags are?
    (["--toy", "--out", "o", "--verbose"], "error: --verbose: unknown setting; the flags: --out, --hf_model, --scale, "
                                           "--toy, --rows, --step, --k, --ngpu, --data, --eval_args, --seed, --seeds, "
                                           "--warmup_steps, --dry_run, --table_only"),
    (["--toy", "--out", "o", "--eval_args=--limit '5"], "error: --eval_args: No closing quotation"),
    (["--toy", "--out", "o", "--eval_args", "--limit 5"], "error: --eval_args: missing a value (one that starts "
                                                         "with -- goes as --eval_args=VALUE)"),
    # valid eval flags, but the toy's evaluation takes none: its first row stopped on argparse's "unrecognized arguments"
    (["--toy", "--out", "o", "--eval_args=--limit 5"], "error: --eval_args: the toy's evaluation (python -m "
                                                       "phf_megatron.toy evaluate) takes no flags, got '--limit 5'"),
    (["--toy", "--out", "o", "--ngpu", "-1"], "error: --ngpu: must be >= 0 (0: 8, toy 1), got -1"),
    (["--toy", "--out", "o", "--data", "/no/such.jsonl"], "error: --data: /no/such.jsonl does not exist"),
    # the trainer's flags after --: found when their row's training started (after the Base eval), --dry_run passed
    (["--toy", "--out", "o", "--", "--training.micro_batch_sz=2"], "error: --training.micro_batch_sz: unknown setting; "
                                                                  "did you mean training.micro_batch_size"),
    (["--toy", "--out", "o", "--dry_run", "--", "--lr=abc"],
     "error: --optimizer.lr: expected float, got 'abc' (in the sft row's trainer flags)"),
    (["--toy", "--out", "o", "--rows", "phf", "--dry_run", "--", "--training.micro_batch_size=3"],
     "error: --training.global_batch_size: 64 is not a multiple of micro_batch_size = 3 (in the phf row's trainer"),
    (["--toy", "--out", "{tmp}/no_such_table", "--table_only"],   # was a table of "not run" rows in a new directory
     "error: --out: {tmp}/no_such_table does not exist (--table_only assembles the rows run into it)"),
])
def test_one_line_errors(capsys, tmp_path, argv, line):
    assert paper_table.main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(line.format(tmp=tmp_path)) and "\n" not in err, err


@pytest.mark.parametrize("ngpu, line", [
    ("6", "error: --training.global_batch_size: 32 samples do not split over 3 data-parallel ranks (the sft row on "
          "--ngpu 6 ranks)"),
    ("3", "error: --model.tensor_model_parallel_size: world size 3 is not a multiple of tensor_model_parallel_size x "
          "pipeline_model_parallel_size = 2 (the sft row on --ngpu 3 ranks)"),
])
def test_a_layout_the_ranks_do_not_fit_is_refused_before_any_row(capsys, tmp_path, ngpu, line):
    """The 8B preset (TP 2, 32 samples a step) on --ngpu ranks it does not fit: found as the first row's training
    started, after the conversion and the Base row's evaluation."""
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    argv = ["--hf_model", str(tmp_path / "hf"), "--scale", "8b", "--out", str(tmp_path / "t"), "--dry_run", "--ngpu", ngpu]
    assert paper_table.main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [line]


def test_the_evals_own_verbose_switch_passes_eval_args(capsys, tmp_path):
    """``--verbose`` is a switch of tools/eval_avg_at_k.py (README: "tools: --verbose"), not an EvalConfig
    field: --eval_args refused it as "unknown setting"; it goes to every row's eval command."""
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    argv = ["--scale", "1p7b", "--hf_model", str(tmp_path / "hf"), "--out", str(tmp_path / "t"), "--rows", "base",
            "--eval_args=--verbose --limit 5", "--dry_run"]
    assert paper_table.main(argv) == 0, capsys.readouterr().err
    evals = [line for line in capsys.readouterr().out.splitlines() if "eval_avg_at_k" in line]
    assert len(evals) == 1 and evals[0].endswith(" --verbose --limit 5"), evals
    # and its summary is compared with the command's settings, --verbose aside (was "--verbose: unknown setting")
    row = paper_table.plan_row(paper_table.parse_args(argv), "base")
    os.makedirs(os.path.dirname(row.eval_result))
    with open(row.eval_result, "w") as f:
        json.dump({"k": 12, "config": {"limit": 4}, "average": 1.0}, f)
    assert paper_rows.eval_differs(row, 12, toy=False) == "limit 4, not 5"



@pytest.mark.parametrize("given", ["bf16", "bfloat16"])
def test_a_rows_eval_summary_is_its_own_whichever_dtype_spelling_eval_args_give(tmp_path, given):
    """The eval takes --dtype bf16 and records it as bfloat16: a finished row's summary was "dtype "bfloat16", not
    "bf16"" (evaluated again, or its directory refused as made with other settings)."""
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    argv = ["--scale", "1p7b", "--hf_model", str(tmp_path / "hf"), "--out", str(tmp_path / "t"), "--rows", "base",
            f"--eval_args=--dtype {given}", "--dry_run"]
    row = paper_table.plan_row(paper_table.parse_args(argv), "base")
    os.makedirs(os.path.dirname(row.eval_result))
    with open(row.eval_result, "w") as f:
        json.dump({"k": 12, "config": {"dtype": "bfloat16"}, "average": 1.0}, f)
    assert paper_rows.eval_differs(row, 12, toy=False) is None
    with open(row.eval_result, "w") as f:
        json.dump({"k": 12, "config": {"dtype": "float16"}, "average": 1.0}, f)
    assert paper_rows.eval_differs(row, 12, toy=False) == 'dtype "float16", not "bfloat16"'


def test_a_finished_row_is_reused_only_with_the_settings_it_was_trained_with(capsys, tmp_path):
    """A rerun into the same --out with other trainer flags after ``--`` skipped the finished rows and scored
    them again as if trained with the new flags (the trainer itself refuses such a run: finished_step)."""
    import json

    from phf_megatron.tools.paper_rows import plan_row
    from phf_megatron.training.config_io import config_from_argv, resume_fingerprint

    argv = ["--toy", "--out", str(tmp_path), "--rows", "sft", "--step", "4", "--dry_run", "--"]
    row = plan_row(paper_table.parse_args(argv), "sft")
    iteration = tmp_path / "sft" / "checkpoints" / "iter_0000004"
    iteration.mkdir(parents=True)
    (tmp_path / "sft" / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("4")
    (tmp_path / "sft" / "export" / "peft_adapter").mkdir(parents=True)
    trained = json.loads(json.dumps(resume_fingerprint(config_from_argv(row.train_flags)), default=str))
    (iteration / "meta.json").write_text(json.dumps({"fingerprint": trained}))
    assert paper_table.main(argv) == 0 and capsys.readouterr().err == ""   # its own settings: reused
    old = {k: v for k, v in trained.items() if not k.startswith("data.holdout")}   # saved before the holdout
    (iteration / "meta.json").write_text(json.dumps({"fingerprint": old}))
    assert paper_table.main(argv) == 0 and capsys.readouterr().err == ""   # reused, as the trainer's rerun does
    (iteration / "meta.json").write_text(json.dumps({"fingerprint": trained}))
    assert paper_table.main([*argv, "--optimizer.lr=3e-5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {iteration}: the run's settings differ from the checkpoint's: ") and "lr" in err
    assert err.endswith(f"(the sft row, finished in {tmp_path / 'sft'}, was trained with other settings: give a "
                        "new --out to train it with these)") and "\n" not in err, err
    (iteration / "meta.json").write_text('{"fingerprint": {"lr"')   # damaged: named as such, no settings said
    assert paper_table.main(argv) == 2
    assert capsys.readouterr().err.strip() == (f"error: {iteration / 'meta.json'}: not valid JSON: Expecting ':' "
                                               "delimiter at line 1 column 22")


# ----------------------------------------------------------------------------- the toy, end to end

#: the smallest toy that still trains: a short warm-up, 4 steps of 16 (GRPO: 2 prompts x G 8), a
#: checkpoint at step 2, the transformers engine (starts in seconds)
TOY = ["--toy", "--warmup_steps", "20", "--step", "4", "--rows", "base,sft,grpo,opsd,phf", "--",
       "--rollout.backend=hf", "--checkpoint.save_interval=2", "--training.global_batch_size=16",
       "--training.micro_batch_size=8", "--logging.tensorboard=false", "--logging.progress_bar=false"]


def _harness(out):
    return [sys.executable, os.path.join(REPO, "tools", "paper_table.py"), "--out", out, *TOY]


@pytest.mark.slow
@pytest.mark.timeout(900)  # ~3-4 min on a quiet 2-core machine
def test_toy_table_survives_a_kill_and_a_rerun_skips_finished_rows(tmp_path):
    out = str(tmp_path / "toy_table")
    env = python_env(OMP_NUM_THREADS="1")
    # 1. run until the OPSD row has saved its step-2 checkpoint, then SIGKILL the harness's process group
    log1 = open(tmp_path / "run1.log", "w")
    proc = subprocess.Popen(_harness(out), cwd=REPO, env=env, stdout=log1, stderr=subprocess.STDOUT,
                            start_new_session=True)
    latest = os.path.join(out, "opsd", "checkpoints", "latest_checkpointed_iteration.txt")
    while proc.poll() is None and not (os.path.isfile(latest) and open(latest).read().strip() == "2"):
        time.sleep(0.05)
    assert proc.poll() is None, open(tmp_path / "run1.log").read()[-3000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    first = open(tmp_path / "run1.log").read()
    assert "[4/5] opsd: training to step 4" in first and "[4/5] opsd: trained" not in first, first

    # 2. rerun: finished rows are skipped, the killed row resumes from its checkpoint, the table completes
    second = subprocess.run(_harness(out), cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    for i, row in enumerate(("base", "sft", "grpo"), 1):
        assert f"[{i}/5] {row}: finished, skipped" in second.stdout
    assert "[4/5] opsd: resuming from step 2 to step 4" in second.stdout and "[5/5] phf: training to step 4" in second.stdout
    assert "phf_megatron.train: resuming from step 2 of 4" in open(os.path.join(out, "opsd", "train.log")).read()
    table = json.load(open(os.path.join(out, "table.json")))
    assert list(table["rows"]) == ["base", "sft", "grpo", "opsd", "phf"] and table["toy"]
    for row, e in table["rows"].items():
        assert e["status"] == "done" and e["paper"] is None and e["paper_note"].startswith("n/a"), row
        assert set(e["ours"]) == {"unseen", "seen", "average"}
        assert all(0 <= v <= 100 for v in e["ours"].values())
        assert e["ours"]["average"] == pytest.approx((e["ours"]["unseen"] + e["ours"]["seen"]) / 2)
    md = open(os.path.join(out, "table.md")).read()
    for row in table["rows"]:
        assert re.search(rf"^\| {row} \| [\d.]+ \| [\d.]+ \| [\d.]+ \| done \|$", md, re.M), (row, md)
    for row in ("sft", "grpo", "opsd", "phf"):   # every trained row reached step 4 through its own method
        metrics = [json.loads(line) for line in open(os.path.join(out, row, "metrics.jsonl"))]
        assert metrics[-1]["step"] == 4
    assert "reward" in json.loads(open(os.path.join(out, "grpo", "metrics.jsonl")).readline())

    # 3. a third run relaunches nothing: every row skipped, no log touched
    logs = {p: os.stat(p).st_mtime_ns for row in table["rows"] for p in (os.path.join(out, row, "train.log"),
                                                                         os.path.join(out, row, "eval.log"))
            if os.path.exists(p)}
    third = subprocess.run(_harness(out), cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert third.returncode == 0, third.stderr[-3000:]
    assert [line for line in third.stdout.splitlines() if ": training" in line or ": evaluating" in line
            or ": resuming" in line or "running" in line] == []
    assert third.stdout.count("finished, skipped") == 5
    assert {p: os.stat(p).st_mtime_ns for p in logs} == logs


def test_table_only_assembles_rows_run_as_separate_jobs(tmp_path, capsys):
    """Rows finished elsewhere (a trainer's checkpoint + export, an eval summary.json) are read into
    table.md / table.json beside the paper's numbers with the difference; a row without its
    directory is "not run"; nothing is launched."""
    hf, out = _fake_model(tmp_path), str(tmp_path / "t")
    argv = ["--hf_model", hf, "--scale", "4b", "--out", out, "--rows", "base,sft,geometry_only"]
    args = paper_table.parse_args(argv)
    for name, score in (("base", 60.0), ("geometry_only", 62.0)):
        row = paper_table.plan_row(args, name)
        os.makedirs(os.path.dirname(row.eval_result))
        json.dump({"k": 12, "suite_average_at_k_by_grader": {"official": score, "extended": 99.0},
                   "benchmarks": {b: {"average_at_k_by_grader": {"official": score + i, "extended": 99.0}}
                                  for i, b in enumerate(BENCHMARKS)}}, open(row.eval_result, "w"))
        if row.train:
            fake_trained(row, 100)
    assert paper_table.main([*argv, "--table_only"]) == 0
    assert "training" not in capsys.readouterr().out
    table = json.load(open(os.path.join(out, "table.json")))
    base, sft, geo = (table["rows"][r] for r in ("base", "sft", "geometry_only"))
    assert base["ours"] == {"aime24": 60.0, "aime25": 61.0, "hmmt25": 62.0, "average": 60.0}   # the official grader
    assert base["paper"]["aime24"] == 74.17 and base["delta_average"] == round(60.0 - 60.30, 2)
    assert sft["status"] == "not run" and sft["ours"] is None and sft["paper"]["average"] == 57.22
    assert geo["paper"]["average"] == 62.59 and "aime24" not in geo["paper"] and geo["delta_average"] == -0.59
    md = open(os.path.join(out, "table.md")).read()
    assert "| base | 60.00 / 74.17 | 61.00 / 66.67 | 62.00 / 40.06 | 60.00 / 60.30 | -0.30 | done |" in md
    assert "| sft | — / 70.00 | — / 66.11 | — / 35.56 | — / 57.22 | — | not run |" in md


def test_a_damaged_summary_or_latest_file_is_one_line_or_not_finished(tmp_path, capsys):
    """A row's summary.json cut short was a JSONDecodeError traceback; a latest_checkpointed_iteration.txt of
    garbage bytes a UnicodeDecodeError one: it is now a training not finished (the rerun trainer names the file)."""
    hf, out = _fake_model(tmp_path), str(tmp_path / "t")
    argv = ["--hf_model", hf, "--scale", "4b", "--out", out, "--rows", "sft"]
    row = paper_table.plan_row(paper_table.parse_args(argv), "sft")
    os.makedirs(os.path.dirname(row.eval_result))
    open(row.eval_result, "w").write('{"k": 12, "suite_aver')
    latest = os.path.join(fake_trained(row, 100), "..", "latest_checkpointed_iteration.txt")
    assert paper_table.main([*argv, "--table_only"]) == 2
    assert capsys.readouterr().err.strip() == (f"error: {row.eval_result}: not valid JSON: Unterminated string "
                                               "starting at line 1 column 11")
    open(latest, "wb").write(b"\xff\xfe")
    assert not paper_rows.training_finished(row, 100)


def test_a_row_saved_elsewhere_by_checkpoint_save_is_finished_where_it_saved(capsys, tmp_path):
    """``-- --checkpoint.save=DIR``: the rows' checkpoints are in DIR; training_finished looked only at
    <row>/checkpoints, so a row that trained there was 'training failed' (rc 0) and one finished there was
    trained again, its settings never compared with the row's (f73716f's check reads the row's own save dir)."""
    from phf_megatron.training.config_io import config_from_argv, resume_fingerprint

    argv = ["--toy", "--out", str(tmp_path), "--rows", "sft", "--step", "4", "--dry_run", "--",
            f"--checkpoint.save={tmp_path / 'elsewhere'}"]
    row = paper_rows.plan_row(paper_table.parse_args(argv), "sft")
    trained = json.loads(json.dumps(resume_fingerprint(config_from_argv(row.train_flags)), default=str))
    iteration = fake_trained(row, 4, meta={"fingerprint": trained}, save=str(tmp_path / "elsewhere"))
    assert paper_rows.training_finished(row, 4) and not paper_rows.training_finished(row, 5)
    assert paper_table.main([*argv, "--optimizer.lr=3e-5"]) == 2
    assert capsys.readouterr().err.startswith(f"error: {iteration}: the run's settings differ")


# ----------------------------------------------------------------------------- the toy over seeds


def test_seeds_run_one_toy_table_per_seed(tmp_path, capsys):
    """``--seeds`` plans every seed's table in its own directory with that seed's split and trainer seed."""
    out = str(tmp_path / "t")
    assert paper_table.main(["--toy", "--out", out, "--seeds", "0,3", "--rows", "base,opsd", "--dry_run"]) == 0
    text = capsys.readouterr().out
    for seed in (0, 3):
        assert f"prepare --out {out}/s{seed}/toy --seed {seed}" in text
        assert f"--run_dir={out}/s{seed}/opsd" in text and f"--training.seed={1234 + seed}" in text
    assert not os.path.exists(out)
    args = paper_table.parse_args(["--toy", "--out", out, "--seeds", "0,3", "--dry_run"])
    seed, before = args.seed, vars(args).copy()
    assert paper_table.seeds_tables(args) == 0
    assert vars(args) == before and args.out == out and args.seed == seed   # each seed's table has its own args


def test_table_only_over_seeds_assembles_the_seeds_run_so_far(tmp_path, capsys):
    """``--seeds 0,3 --table_only`` with only seed 0 run: seed 3's rows are "not run" and the summary is over the
    seeds that finished (it stopped on "--out: <out>/s3 does not exist", a directory the user never named)."""
    out = str(tmp_path / "t")
    argv = ["--toy", "--out", out, "--seeds", "0,3", "--rows", "base,opsd", "--table_only"]
    base = paper_table.plan_row(paper_table.parse_args(["--toy", "--out", f"{out}/s0"]), "base")   # seed 0's
    os.makedirs(os.path.dirname(base.eval_result))
    json.dump({"noref_unseen": 0.5, "noref_seen": 1.0}, open(base.eval_result, "w"))
    assert paper_table.main(argv) == 0, capsys.readouterr().err
    summary = json.load(open(os.path.join(out, "table_seeds.json")))
    assert summary["seeds"] == [0, 3] and summary["rows"]["base"]["average"]["values"] == {"0": 75.0}
    assert summary["rows"]["opsd"]["average"]["n"] == 0


def test_seed_summary_is_each_rows_mean_and_sample_sd_over_the_seeds_that_finished(tmp_path):
    import statistics

    from phf_megatron.tools.seed_table import seeds_markdown, seeds_summary

    def table(rows):
        return {"benchmarks": ["unseen", "seen"], "step": 100,
                "rows": {name: {"ours": None if v is None else {"unseen": v[0], "seen": v[1], "average": (v[0] + v[1]) / 2}}
                         for name, v in rows.items()}}
    tables = {0: table({"base": (18.5, 100.0), "opsd": (80.0, 99.0)}),
              1: table({"base": (4.5, 100.0), "opsd": (61.5, 98.5)}),
              2: table({"base": (40.5, 100.0), "opsd": None})}              # seed 2's OPSD row did not finish
    summary = seeds_summary(tables)
    base, opsd = summary["rows"]["base"], summary["rows"]["opsd"]
    assert base["unseen"]["mean"] == pytest.approx(statistics.mean([18.5, 4.5, 40.5]), abs=1e-12)
    assert base["unseen"]["sd"] == pytest.approx(statistics.stdev([18.5, 4.5, 40.5]), abs=1e-12)
    assert base["seen"]["sd"] == 0.0 and base["seen"]["n"] == 3
    assert opsd["unseen"]["n"] == 2 and opsd["unseen"]["values"] == {0: 80.0, 1: 61.5}
    assert opsd["average"]["mean"] == pytest.approx(statistics.mean([89.5, 80.0]), abs=1e-12)
    one = seeds_summary({5: tables[0]})
    assert one["rows"]["base"]["unseen"]["sd"] is None                     # one seed: no spread
    md = seeds_markdown(summary)
    assert f"| base | {statistics.mean([18.5, 4.5, 40.5]):.2f} ± {statistics.stdev([18.5, 4.5, 40.5]):.2f} (3) |" in md
    assert md.splitlines()[-1].endswith("| 89.50 | 80.00 | — |")           # opsd's average per seed
