"""``tools/paper_table.py`` on damaged or unusual inputs from the rows' directories: each is one line naming
the file (and the key), never a traceback, and a row whose results are not there is "not run"."""

import json
import os
import shutil

import pytest

from phf_megatron.tools import paper_rows, paper_table

from .rows import fake_trained


def _fake_model(tmp_path):
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"num_hidden_layers": 36}))
    return str(d)


@pytest.mark.parametrize("text,line", [
    ("[1, 2]", "expected a JSON object at the top level, found [1, 2]"),
    ('{"k": 12}', "no benchmarks in the file"),
    ('{"k": 12, "benchmarks": 5}', "expected a JSON object at benchmarks, found 5"),
    ('{"k": 12, "benchmarks": {"aime24": 3}}', "expected a JSON object at benchmarks.aime24, found 3"),
    ('{"k": 12, "benchmarks": {"aime24": {"average_at_k_by_grader": {}}}}',
     "no benchmarks.aime24.average_at_k_by_grader.official in the file"),
    ('{"k": 12, "benchmarks": {}, "suite_average_at_k_by_grader": {"official": "x"}}',
     'expected a number at suite_average_at_k_by_grader.official, found "x"'),
    ('{"k": 12, "benchmarks": {}, "suite_average_at_k_by_grader": [60]}',
     "expected a JSON object at suite_average_at_k_by_grader, found [60]"),
    ("7", "expected a JSON object at the top level, found 7"),
    ("", "not valid JSON (the file is empty)"),
])
def test_a_summary_of_the_wrong_shape_is_one_line_naming_it(tmp_path, capsys, text, line):
    """A row's summary.json that is valid JSON of another shape was a TypeError or KeyError traceback
    (read_scores indexed it blindly); an empty one was already a line."""
    hf, out = _fake_model(tmp_path), str(tmp_path / "t")
    argv = ["--hf_model", hf, "--scale", "4b", "--out", out, "--rows", "base"]
    row = paper_table.plan_row(paper_table.parse_args(argv), "base")
    os.makedirs(os.path.dirname(row.eval_result))
    open(row.eval_result, "w").write(text)
    assert paper_table.main([*argv, "--table_only"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {row.eval_result}: {line}") and "\n" not in err, err
    if text.startswith("["):   # the run's own check of a finished eval (run_rows) reads it too: an AttributeError
        with pytest.raises(Exception, match="expected a JSON object at the top level"):
            paper_rows.eval_finished(row, 12, False)


@pytest.mark.parametrize("data,line", [
    ({"noref_unseen": 0.5}, "no noref_seen in the file (not a toy evaluate --json file?)"),
    ({"noref_unseen": 0.5, "noref_seen": None}, "expected a number at noref_seen, found null"),
    ([0.5, 1.0], "expected a JSON object at the top level"),
])
def test_a_toy_result_of_the_wrong_shape_is_one_line_naming_it(tmp_path, capsys, data, line):
    out = str(tmp_path / "t")
    argv = ["--toy", "--out", out, "--rows", "base"]
    row = paper_table.plan_row(paper_table.parse_args(argv), "base")
    os.makedirs(os.path.dirname(row.eval_result))
    json.dump(data, open(row.eval_result, "w"))
    assert paper_table.main([*argv, "--table_only"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {row.eval_result}: {line}") and "\n" not in err, err


def _summary(path, score, **config):
    from phf_megatron.eval.config import EvalConfig

    cfg = EvalConfig(out_dir=os.path.dirname(path), model="m", **config).to_json()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    json.dump({"k": cfg["n"], "suite_average_at_k_by_grader": {"official": score},
               "benchmarks": {"aime24": {"average_at_k_by_grader": {"official": score}}}, "config": cfg},
              open(path, "w"))


def test_a_summary_made_with_other_eval_settings_is_not_the_rows_result(tmp_path, capsys):
    """A row's summary.json from a --limit smoke or another --n was read into the table as the row's
    Average@k (--table_only did not even compare k; a run compared k alone and skipped the eval)."""
    hf, out = _fake_model(tmp_path), str(tmp_path / "t")
    argv = ["--hf_model", hf, "--scale", "4b", "--out", out, "--rows", "base", "--table_only"]
    row = paper_table.plan_row(paper_table.parse_args(argv), "base")
    for config, status in (({"n": 4}, "evaluated with other settings (k 4, not 12)"),
                           ({"limit": 5}, "evaluated with other settings (limit 5, not null)"),
                           ({"benchmarks": ("aime24",)}, 'evaluated with other settings (benchmarks ["aime24"], '
                                                         'not ["aime24", "aime25", "hmmt25"])'),
                           ({"max_new_tokens": 8}, "evaluated with other settings (max_new_tokens 8, not 38912)"),
                           ({"top_p": 0.95}, "done"),   # the default before it was None (official: 0.95 thinking)
                           ({"top_p": 0.8}, "evaluated with other settings (top_p 0.8, not 0.95)"),
                           ({}, "done")):
        _summary(row.eval_result, 55.0, **config)
        assert paper_table.main(argv) == 0, capsys.readouterr().err
        entry = json.load(open(os.path.join(out, "table.json")))["rows"]["base"]
        assert entry["status"] == status and (entry["ours"] is None) == (status != "done"), config
        assert paper_rows.eval_finished(row, 12, False) == (status == "done")   # a run evaluates it again
    _summary(row.eval_result, 55.0, limit=5)            # the smoke's own table: its flags, its numbers
    assert paper_table.main([*argv, "--eval_args=--limit 5"]) == 0
    entry = json.load(open(os.path.join(out, "table.json")))["rows"]["base"]
    assert entry["status"] == "done" and entry["ours"]["average"] == 55.0



def _failing_runs(monkeypatch) -> list:
    """The table's steps fail at once (exit 1) instead of running; returns the list of the commands run."""
    ran = []

    def fake_run(cmd, log):
        ran.append(cmd)
        os.makedirs(os.path.dirname(log), exist_ok=True)
        open(log, "a").close()
        return 1, 0.0
    monkeypatch.setattr(paper_table, "_run", fake_run)
    return ran


def test_a_summary_whose_samples_the_eval_will_not_resume_is_refused_before_any_row_runs(tmp_path, capsys,
                                                                                         monkeypatch):
    """A run evaluates a row "evaluated with other settings" again into the same eval_step<step>/: made with another
    top_p (any setting the eval's resume compares), the eval refused its samples ("holds samples generated with other
    settings ...; use another --out_dir") after the table had run the rows before it (sft's training here). Now one
    line at the start naming the row, its directory and the settings, nothing deleted; a --limit smoke's directory
    (limit is not compared) still resumes."""
    from phf_megatron.eval.config import EvalConfig
    from phf_megatron.eval.resume import _check_fingerprint
    from phf_megatron.input_files import InputFileError

    hf, out = _fake_model(tmp_path), str(tmp_path / "t")
    argv = ["--hf_model", hf, "--scale", "4b", "--out", out, "--rows", "sft,base"]
    row = paper_table.plan_row(paper_table.parse_args(argv), "base")
    eval_dir = os.path.dirname(row.eval_result)
    _summary(row.eval_result, 55.0, top_p=0.8, n=4)   # (another k does not hide it)
    # the eval's own check, as it meets the directory: samples of top_p 0.8, the row's command the official 0.95
    old, new = (EvalConfig(out_dir=eval_dir, model=hf, **c).generation_fingerprint(hf, "vllm", 40960)
                for c in ({"top_p": 0.8}, {}))
    _check_fingerprint(eval_dir, old, 40960, has_samples=False)   # writes run_config.json
    with pytest.raises(InputFileError, match="holds samples generated with other settings"):
        _check_fingerprint(eval_dir, new, 40960)
    ran = _failing_runs(monkeypatch)
    assert paper_table.main(argv) == 2 and not ran
    err = capsys.readouterr().err.strip()
    assert err == (f"error: {eval_dir}: row base's eval holds samples made with other settings (top_p 0.8, not "
                   "0.95), which its eval does not resume; remove the directory (or give another --out) to "
                   "evaluate the row with its settings"), err
    assert os.path.isfile(row.eval_result) and os.path.isfile(os.path.join(eval_dir, "run_config.json"))
    _summary(row.eval_result, 55.0, limit=5)   # a --limit smoke's: the table runs (its first step, failed here)
    assert paper_table.main(argv) == 1 and ran and "other settings" not in capsys.readouterr().err


def _table_refuses(argv, ran, capsys, line) -> None:
    """The table refuses at the start with ``line``, running nothing; ``line`` falsy: it runs (its first step, which
    fails here: ``_failing_runs``)."""
    ran.clear()
    code, err = paper_table.main(argv), capsys.readouterr().err.strip()
    if line:
        assert code == 2 and not ran and err == line, err
    else:
        assert code == 1 and ran and "holds samples" not in err, err


def _partial_eval(eval_dir, model_dir, model_limit, record=(), **config):
    """What an eval killed before its summary leaves (the eval's own writers): run_config.json, one sample."""
    from phf_megatron.eval.config import EvalConfig
    from phf_megatron.eval.records import SampleWriter, shard_path
    from phf_megatron.eval.resume import _check_fingerprint
    from phf_megatron.rollout.factory import resolve_backend

    cfg = EvalConfig(out_dir=eval_dir, model="m", **config)
    fingerprint = cfg.generation_fingerprint(model_dir, resolve_backend(cfg.backend), model_limit)
    os.makedirs(eval_dir, exist_ok=True)
    _check_fingerprint(eval_dir, fingerprint, model_limit, has_samples=False)   # writes run_config.json
    with SampleWriter(shard_path(eval_dir, 0)) as writer:
        writer.write([{"benchmark": "aime24", "problem_id": "0", "sample_index": 0, "output": "x", **dict(record)}])
    return fingerprint


@pytest.mark.parametrize("row_name", ["base", "sft"])
def test_a_partial_eval_whose_samples_the_eval_will_not_resume_is_refused_before_any_row_runs(
        tmp_path, capsys, monkeypatch, row_name):
    """An eval killed before its summary.json leaves its samples and run_config.json: made with another top_p, the
    table passed its check and that row's eval refused the samples after the rows before it had run (hours). Now
    the same one line at the start; a partial directory the eval resumes (the same settings, or another --limit,
    --n or --benchmarks, which it resumes) still runs. The eval's own check agrees on each."""
    from phf_megatron.eval.config import EvalConfig
    from phf_megatron.eval.resume import _check_fingerprint
    from phf_megatron.eval.models import merged_model_dir
    from phf_megatron.input_files import InputFileError
    from phf_megatron.rollout.factory import resolve_backend

    hf, out = _fake_model(tmp_path), str(tmp_path / "t")
    argv = ["--hf_model", hf, "--scale", "4b", "--out", out, "--rows", f"phf,{row_name}"]
    row = paper_table.plan_row(paper_table.parse_args(argv), row_name)
    eval_dir = os.path.dirname(row.eval_result)
    model_dir = hf if row.adapter is None else merged_model_dir(eval_dir)   # the model the eval samples from
    ran = _failing_runs(monkeypatch)
    row_fp = EvalConfig(out_dir=eval_dir, model=hf, adapter=row.adapter).generation_fingerprint(
        model_dir, resolve_backend("auto"), None)
    for config, refused in (({"top_p": 0.8}, "top_p 0.8, not 0.95"), ({"max_new_tokens": 8}, "max_new_tokens 8, not 38912"),
                            ({}, None), ({"limit": 5}, None), ({"n": 4, "benchmarks": ("aime24",)}, None)):
        shutil.rmtree(eval_dir, ignore_errors=True)
        _partial_eval(eval_dir, model_dir, None, adapter=row.adapter, **config)
        try:                          # the eval's own check, as the row's eval meets the directory
            _check_fingerprint(eval_dir, row_fp, None)
            eval_refuses = False
        except InputFileError:
            eval_refuses = True
        assert eval_refuses == (refused is not None), config
        _table_refuses(argv, ran, capsys, refused and f"error: {eval_dir}: row {row_name}'s eval holds samples made "
                       f"with other settings ({refused}), which its eval does not resume; remove the directory (or "
                       "give another --out) to evaluate the row with its settings")
    assert os.path.isfile(os.path.join(eval_dir, "samples.rank0.jsonl"))   # nothing deleted


def test_a_partial_eval_of_other_problems_under_the_same_ids_is_refused_before_any_row_runs(tmp_path, capsys,
                                                                                           monkeypatch):
    """Samples of an aime24 problem whose text has changed (an edited file, another --data_dir, ...: their
    problem_sha256) are refused by the row's eval after the rows before it ran: now the same line at the start,
    where the samples of the problem as it is still resume."""
    from phf_megatron.eval.config import EvalConfig
    from phf_megatron.eval.records import load_records, problem_digest
    from phf_megatron.eval.benchmarks import load_problems
    from phf_megatron.eval.resume import other_problem_samples

    hf, out = _fake_model(tmp_path), str(tmp_path / "t")
    argv = ["--hf_model", hf, "--scale", "4b", "--out", out, "--rows", "sft,base"]
    row = paper_table.plan_row(paper_table.parse_args(argv), "base")
    eval_dir = os.path.dirname(row.eval_result)
    problems, _ = load_problems(EvalConfig(out_dir=eval_dir, model=hf))
    first = problems["aime24"][0]
    ran = _failing_runs(monkeypatch)
    for text, refused in (("another problem", True), (first.problem, False)):
        shutil.rmtree(eval_dir, ignore_errors=True)
        _partial_eval(eval_dir, hf, None, record={"problem_id": first.id, "problem_sha256": problem_digest(text)})
        assert (other_problem_samples(load_records(eval_dir)[0], problems) is not None) == refused  # the eval's rule
        _table_refuses(argv, ran, capsys, refused and f"error: {eval_dir}: row base's eval holds samples of other "
                       f"problems under the same ids (aime24 {first.id!r}: the benchmark's file or --data_dir "
                       "changed), which its eval does not resume; remove the directory (or give another --out) to "
                       "evaluate the row with its settings")


def test_a_table_only_needs_the_summaries_not_the_eval_inputs(tmp_path, capsys, monkeypatch):
    """--table_only built each row's EvalConfig to compare its summary's settings, running the eval's own checks:
    a benchmark file of --eval_args gone since (or relative, the table assembled from another directory) stopped
    the whole table with 'error: sets/mine.jsonl: does not exist'. The summary is compared, the files not read."""
    hf, out = _fake_model(tmp_path), str(tmp_path / "t")
    (tmp_path / "sets").mkdir()
    (tmp_path / "sets" / "mine.jsonl").write_text('{"problem": "1 + 1?", "answer": "2"}\n')
    monkeypatch.chdir(tmp_path)
    argv = ["--hf_model", hf, "--scale", "4b", "--out", out, "--rows", "base", "--table_only",
            "--eval_args=--benchmarks sets/mine.jsonl --data_dir sets"]
    row = paper_table.plan_row(paper_table.parse_args(argv), "base")
    _summary(row.eval_result, 55.0, benchmarks=("sets/mine.jsonl",), data_dir="sets")
    monkeypatch.chdir(out)   # the rows run from tmp_path; the table assembled from another directory
    assert paper_table.main(argv) == 0, capsys.readouterr().err
    entry = json.load(open(os.path.join(out, "table.json")))["rows"]["base"]
    assert entry["status"] == "done" and entry["ours"]["average"] == 55.0


def test_a_trained_row_without_its_eval_is_said_to_be_trained(tmp_path, capsys):
    """A row whose training finished but whose eval directory is missing was "not run" (as a row never
    started): what is left is its eval. A row stopped short of the step says where (was "not run" too); a row
    with neither stays "not run"."""
    hf, out = _fake_model(tmp_path), str(tmp_path / "t")
    argv = ["--hf_model", hf, "--scale", "4b", "--out", out, "--rows", "base,sft,opsd", "--table_only"]
    row = paper_table.plan_row(paper_table.parse_args(argv), "sft")
    fake_trained(row, 100)
    os.makedirs(os.path.join(out, "opsd", "checkpoints"))
    open(os.path.join(out, "opsd", "checkpoints", "latest_checkpointed_iteration.txt"), "w").write("40")
    assert paper_table.main(argv) == 0, capsys.readouterr().err
    rows = json.load(open(os.path.join(out, "table.json")))["rows"]
    assert [rows[r]["status"] for r in ("base", "sft", "opsd")] == [
        "not run", "trained, not evaluated", "trained to step 40 of 100"]
    assert rows["sft"]["ours"] is None
    assert "| sft | — / 70.00 | — / 66.11 | — / 35.56 | — / 57.22 | — | trained, not evaluated |" in open(
        os.path.join(out, "table.md")).read()


def test_rows_sharing_one_checkpoints_directory_are_refused(tmp_path, capsys):
    """A --checkpoint.save after -- is every row's: the second row resumed from the first's checkpoints (refused
    by its settings after the first row had run, or a finished SFT taken as the OPSD row). One row may move its
    own there, and a row found there is said to be where it stopped."""
    hf, out, ckpts = _fake_model(tmp_path), str(tmp_path / "t"), str(tmp_path / "c")
    argv = ["--hf_model", hf, "--scale", "4b", "--out", out, "--dry_run"]
    assert paper_table.main([*argv, "--rows", "base,sft,opsd", "--", f"--checkpoint.save={ckpts}"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: --checkpoint.save: the sft and opsd rows would share the checkpoints in {ckpts}: give it after -- "
        "with one row (--rows opsd) per table run, or leave it out (each row's <out>/<row>/checkpoints)")
    os.makedirs(ckpts)
    os.makedirs(out)
    open(os.path.join(ckpts, "latest_checkpointed_iteration.txt"), "w").write("40")
    one = [*argv[:-1], "--rows", "opsd", "--table_only", "--", f"--checkpoint.save={ckpts}"]
    assert paper_table.main(one) == 0, capsys.readouterr().err
    assert json.load(open(os.path.join(out, "table.json")))["rows"]["opsd"]["status"] == "trained to step 40 of 100"


def test_seeds_sharing_one_checkpoints_directory_are_refused(tmp_path, capsys):
    """--seeds trains each row once per seed: with a --checkpoint.save after --, seed 1's row resumed from seed 0's
    checkpoints (each seed's table checked only its own rows: refused by its settings after seed 0's table ran).
    One seed may move its row there."""
    ckpts = str(tmp_path / "c")
    argv = ["--toy", "--out", str(tmp_path / "t"), "--rows", "base,sft", "--dry_run"]
    assert paper_table.main([*argv, "--seeds", "0,1", "--", f"--checkpoint.save={ckpts}"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: --checkpoint.save: the sft (seed 0) and sft (seed 1) rows would share the checkpoints in {ckpts}: "
        "give it after -- with one row (--rows sft --seed 1) per table run, or leave it out (each row's "
        "<out>/<row>/checkpoints)")
    assert paper_table.main([*argv, "--seeds", "1", "--", f"--checkpoint.save={ckpts}"]) == 0, capsys.readouterr().err


def test_a_log_cut_inside_a_character_is_still_shown(tmp_path, capsys):
    """A trainer killed (SIGKILL, out of memory) while drawing its bar leaves train.log ending inside a UTF-8
    character: the failed row's report was a UnicodeDecodeError traceback instead of the log's tail and its line."""
    log = tmp_path / "train.log"
    log.write_bytes("step 7 │ loss 0.5\n".encode() + "███".encode()[:4])
    assert paper_table._failed("sft: training", -9, str(log)) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "step 7 │ loss 0.5" and err[1].startswith("█")
    assert err[-1] == f"error: sft: training failed (exit code -9); its log: {log}"


@pytest.mark.parametrize("extra", [[], ["--table_only"], ["--dry_run"]])
def test_an_out_that_is_a_file_is_one_line(tmp_path, capsys, extra):
    """--out naming a file: a run said "toy model + data: running" and stopped on "[Errno 17] File exists";
    --table_only said the file "does not exist"."""
    out = tmp_path / "table"
    out.write_text("")
    assert paper_table.main(["--toy", "--out", str(out), "--rows", "base", *extra]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip().startswith(f"error: --out: {out} is not a directory (") and captured.out == ""


@pytest.mark.parametrize("flag,instead", [("--n 4", "the table's --k"), ("--model /m", "--hf_model"),
                                          ("--adapter /a", "each row's own"), ("--out_dir /o", "<out>/<row>/eval_step"),
                                          ("--megatron_checkpoint=/c", "each row's adapter")])
def test_eval_args_that_replace_a_rows_own_flag_are_refused(tmp_path, capsys, flag, instead):
    """The eval takes the last of a repeated flag: --eval_args='--adapter X' scored every row as X, '--model Y'
    every row as Y, '--n 4' or '--out_dir D' made each row's eval 'fail (exit code 0)' after it ran."""
    argv = ["--hf_model", _fake_model(tmp_path), "--scale", "4b", "--out", str(tmp_path / "t"), "--dry_run",
            f"--eval_args={flag}"]
    assert paper_table.main(argv) == 2
    err = capsys.readouterr().err.strip()
    key = flag.split()[0].split("=")[0]
    assert err.startswith(f"error: --eval_args: {key} is set by the table for each row ({instead}") and "\n" not in err


@pytest.mark.parametrize("override,line", [
    ("--model.hf_dir=/other", "error: --model.hf_dir: set by the table for each row (the sft row's: {hf}; the table's "
                              "--hf_model), not after --"),
    ("--method=sft", "error: --method: set by the table for each row (the phf row's: phf; the table's --rows)"),
    ("--run_dir=/one", "error: --run_dir: set by the table for each row (the sft row's: {out}/sft; the table's --out)"),
    ("--training.train_iters=50", "error: --training.train_iters: set by the table for each row (the sft row's: 100; "
                                  "the table's --step)"),
])
def test_trainer_overrides_that_replace_a_rows_own_setting_are_refused(tmp_path, capsys, monkeypatch, override, line):
    """After ``--`` the last flag wins: --model.hf_dir trained every row on another base than the eval's --model
    (silently), --method made every row one method, --run_dir put every row in one directory, and
    --training.train_iters made each row's training 'fail (exit code 0)' short of --step. Other overrides pass."""
    hf, out = _fake_model(tmp_path), str(tmp_path / "t")
    argv = ["--hf_model", hf, "--scale", "4b", "--out", out, "--rows", "base,sft,phf", "--dry_run", "--"]
    assert paper_table.main([*argv, override]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(line.format(hf=hf, out=out)) and "\n" not in err, err
    assert paper_table.main([*argv, "--training.micro_batch_size=2", "--logging.log_interval=2"]) == 0
    # the row's own value, typed otherwise (a trailing slash, relative): the same directory, not refused
    monkeypatch.chdir(tmp_path)
    assert paper_table.main([*argv, "--model.hf_dir=hf/"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("eval_args,said", [
    ("--pass_ks 1 16", "--pass_ks: each must lie in [1, n=12] (pass@k of n samples), got 16"),
    ("--top_p 2", "--top_p: must lie in (0, 1] or be None (official), got 2.0"),
])
def test_eval_args_the_eval_refuses_are_refused_before_any_row_runs(tmp_path, capsys, eval_args, said):
    """--eval_args were only parsed at the start: a value the eval refuses (a --pass_ks past the table's --k, which
    the eval refuses since 7829507) made each row's eval fail after its training (hours each)."""
    hf, out = _fake_model(tmp_path), str(tmp_path / "t")
    argv = ["--hf_model", hf, "--scale", "4b", "--out", out, "--rows", "base,sft", f"--eval_args={eval_args}"]
    assert paper_table.main([*argv, "--dry_run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: --eval_args: {said} (in {eval_args!r}, with the table's --k 12)", err
    assert paper_table.main([*argv, "--dry_run", "--k", "16"]) == (0 if "pass_ks" in eval_args else 2)
    assert not os.path.exists(out)


def test_a_latest_file_naming_a_missing_checkpoint_is_not_a_finished_row(tmp_path):
    """As the trainer decides (``training.export.finished_step``): a latest file whose checkpoint is gone (deleted,
    or a save killed before its meta.json) is no finished training; the table took the row as trained and went on
    to evaluate an export the trainer would not have called finished."""
    argv = ["--hf_model", _fake_model(tmp_path), "--scale", "4b", "--out", str(tmp_path / "t"), "--rows", "sft"]
    row = paper_rows.plan_row(paper_table.parse_args(argv), "sft")
    iteration = fake_trained(row, 100)
    assert paper_rows.training_finished(row, 100)
    shutil.rmtree(iteration)
    assert not paper_rows.training_finished(row, 100)
