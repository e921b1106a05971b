"""A run's ``config.yaml`` read from another directory than the one the run was launched from.

A user trains from ``~/proj`` with ``--model.hf_dir=models/qwen3 --checkpoint.save=ckpts`` and converts or
evaluates the run from elsewhere: ``mcore_to_hf`` (``find_run_checkpoint``, then the run's base model), the eval's
``--megatron_checkpoint RUN`` (``latest_checkpoint``) must find the launch directory's files, not the reader's.
The writer is the trainer's own (``save_run_config``); the checkpoint is a stand-in (its ``meta.json`` and latest
file), as in tests/eval/test_checkpoint_paths.py: the readers only look for it.
"""

from __future__ import annotations

import os
import shutil

import pytest

from phf_megatron.errors import ConfigError, InputFileError

from ..helpers import REPO


def _checkpoint(save_dir: str, iteration: int) -> str:
    path = os.path.join(save_dir, f"iter_{iteration:07d}")
    os.makedirs(path)
    with open(os.path.join(path, "meta.json"), "w") as f:
        f.write('{"iteration": %d}' % iteration)
    with open(os.path.join(save_dir, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(iteration))
    return path


@pytest.fixture
def launch(tmp_path, tiny_inputs, monkeypatch):
    """``(A, B)``: the launch directory A holds the base model and the data; B is empty. The current directory is A."""
    hf, data = tiny_inputs
    a, b = tmp_path / "proj", tmp_path / "elsewhere"
    (a / "models").mkdir(parents=True)
    b.mkdir()
    os.symlink(hf, a / "models" / "qwen3")
    shutil.copy(data, a / "train.jsonl")
    monkeypatch.chdir(a)
    return str(a), str(b)


def test_a_run_launched_with_relative_paths_is_read_from_another_directory(launch, monkeypatch):
    from phf_megatron.eval.models import latest_checkpoint
    from phf_megatron.training.config_io import config_from_argv, load_config, save_run_config
    from phf_megatron.training.export import _with_base_model, find_run_checkpoint

    a, b = launch
    cfg = config_from_argv(["--config", os.path.join(REPO, "configs", "tiny_cpu.yaml"), "--run_dir=runs/x",
                            "--model.hf_dir=models/qwen3", "--checkpoint.save=ckpts", "--data.path=train.jsonl"])
    path = save_run_config(cfg)
    latest = _checkpoint(os.path.join(a, "ckpts"), 2)
    text = open(path).read()
    assert f"# model.hf_dir: 'models/qwen3' as given in {a}, the launch directory\n" in text   # as the user typed it
    saved = load_config(path)
    assert (saved.run_dir, saved.model.hf_dir, saved.checkpoint.save, saved.data.path) == (
        os.path.join(a, "runs", "x"), os.path.join(a, "models", "qwen3"), os.path.join(a, "ckpts"),
        os.path.join(a, "train.jsonl"))

    monkeypatch.chdir(b)
    run = os.path.join(a, "runs", "x")
    found = find_run_checkpoint(run)   # mcore_to_hf --mcore_dir RUN
    assert found.path == latest and found.iteration == 2
    assert _with_base_model(found.cfg, None).model.hf_dir == os.path.join(a, "models", "qwen3")   # no --base_model
    assert latest_checkpoint(run) == latest   # the eval's --megatron_checkpoint RUN
    hub = save_run_config(config_from_argv([f"--run_dir={b}/hub"]))   # a Hub dataset name is no path: kept
    assert load_config(hub).data.path == "siyanzhao/Openthoughts_math_30k_opsd" and "#" not in open(hub).read()


def test_an_older_run_config_with_relative_paths_is_read_as_before_or_is_one_line(launch, monkeypatch):
    """A config.yaml written before the trainer recorded absolute paths: from the launch directory it reads as
    before; from elsewhere one line names the file, the setting and the directory to run from."""
    from phf_megatron.eval.models import latest_checkpoint
    from phf_megatron.training.export import _with_base_model, find_run_checkpoint

    a, b = launch
    run = os.path.join(a, "runs", "x")
    os.makedirs(run)
    with open(os.path.join(run, "config.yaml"), "w") as f:
        f.write("run_dir: runs/x\nmodel:\n  hf_dir: models/qwen3\ncheckpoint:\n  save: ckpts\n")
    latest = _checkpoint(os.path.join(a, "ckpts"), 2)
    assert find_run_checkpoint(run).path == os.path.join("ckpts", "iter_0000002") and latest_checkpoint(run) == (
        os.path.join("ckpts", "iter_0000002"))
    monkeypatch.chdir(b)
    line = (f"{run}/config.yaml: checkpoint.save 'ckpts' is relative to the directory the run was launched from "
            f"(written before config.yaml recorded absolute paths) and {b}/ckpts does not exist: run this from "
            "that directory")
    for read in (find_run_checkpoint, latest_checkpoint):
        with pytest.raises(InputFileError) as err:
            read(run)
        assert str(err.value) == line
    found = find_run_checkpoint(os.path.join(a, "ckpts"), os.path.join(run, "config.yaml"))   # mcore_to_hf's
    assert found.path == latest   # --mcore_dir CHECKPOINTS --run_config FILE: found
    with pytest.raises(ConfigError) as err:
        _with_base_model(found.cfg, None)
    assert err.value.line == ("--base_model: the run's base model (model.hf_dir = 'models/qwen3', relative to the "
                              "directory the run was launched from) does not exist here; give the base "
                              "model the run was trained from")


def test_a_run_directory_moved_with_its_checkpoints_is_read_where_it_is_now(launch, monkeypatch, tmp_path):
    """``--checkpoint.save`` below the run directory, recorded absolute: the project moved (another machine, another
    mount) keeps the run's checkpoints in it, found there (as given relative, they were found from the project
    before config.yaml recorded absolute paths); one elsewhere that is not here is one line, not 'no checkpoint of
    the run yet' (mcore_to_hf) or the run directory taken as a checkpoint (the eval)."""
    from phf_megatron.eval.models import latest_checkpoint
    from phf_megatron.training.config_io import config_from_argv, save_run_config
    from phf_megatron.training.export import find_run_checkpoint

    a, _ = launch
    for run, save in (("runs/x", "runs/x/ckpts"), ("runs/y", "ckpts")):
        save_run_config(config_from_argv([f"--run_dir={run}", f"--checkpoint.save={save}"]))
        _checkpoint(os.path.join(a, save), 2)
    moved = str(tmp_path / "moved")
    shutil.move(a, moved)
    monkeypatch.chdir(moved)
    latest = os.path.join(moved, "runs", "x", "ckpts", "iter_0000002")
    assert find_run_checkpoint("runs/x").path == latest and latest_checkpoint(os.path.join(moved, "runs", "x")) == latest
    line = (f"{moved}/runs/y/config.yaml: checkpoint.save '{a}/ckpts' does not exist here (no checkpoint saved yet, or moved "
            "since the run wrote this file): give the checkpoints directory as it is now")
    for read in (find_run_checkpoint, latest_checkpoint):
        with pytest.raises(InputFileError) as err:
            read(os.path.join(moved, "runs", "y"))
        assert str(err.value) == line
    assert find_run_checkpoint("ckpts", "runs/y/config.yaml").iteration == 2 and latest_checkpoint("ckpts") == (
        os.path.join("ckpts", "iter_0000002"))   # as the line says


def test_a_runs_config_yaml_given_from_where_the_run_moved_is_that_run_not_the_old_one(launch, tmp_path, capsys):
    """``train --config MOVED/config.yaml`` after the run directory was moved (or copied) read run_dir and the paths
    recorded in it (absolute) at the old place: the run trained from step 0 there, or went on writing into the
    original. Now the run is where its config.yaml is (or the --run_dir given), the paths recorded in the old run
    directory follow it, as saved_path reads a moved run, and one line says so; a path outside it is kept."""
    from phf_megatron.train import train
    from phf_megatron.training.config_io import config_from_argv, load_config, save_run_config

    a, _ = launch
    old = os.path.join(a, "runs", "x")
    recorded = load_config(save_run_config(config_from_argv(
        ["--run_dir=runs/x", "--checkpoint.save=runs/x/ckpts", "--logging.tensorboard_dir=runs/x/tb",
         "--model.hf_dir=models/qwen3"])))
    assert (recorded.run_dir, recorded.checkpoint.save) == (old, os.path.join(old, "ckpts"))   # in its place
    _checkpoint(recorded.checkpoint.save, 1)   # the run's outputs go with it
    moved = str(tmp_path / "moved")
    shutil.move(old, moved)
    path = os.path.join(moved, "config.yaml")
    cfg = load_config(path)
    assert (cfg.run_dir, cfg.checkpoint.save, cfg.logging.tensorboard_dir, cfg.model.hf_dir) == (
        moved, os.path.join(moved, "ckpts"), os.path.join(moved, "tb"), os.path.join(a, "models", "qwen3"))
    other = load_config(path, [f"--run_dir={tmp_path}/y", f"--logging.tensorboard_dir={tmp_path}/tb"])
    assert (other.run_dir, other.checkpoint.save, other.logging.tensorboard_dir) == (   # the flags win
        f"{tmp_path}/y", f"{tmp_path}/y/ckpts", f"{tmp_path}/tb")
    assert train(["--config", path, "--print-config"]) == 0
    out, err = capsys.readouterr()
    assert f"run_dir: {moved}\n" in out
    assert err == (f"note: {path} records the run in {old}; its run_dir, checkpoint.save, logging.tensorboard_dir "
                   f"there are read in {moved} (give --run_dir for another run directory)\n")
    assert train(["--config", os.path.join(REPO, "configs", "tiny_cpu.yaml"), "--print-config"]) == 0
    assert capsys.readouterr().err == ""   # a preset: no note


def test_a_preset_named_config_yaml_keeps_its_run_dir(tmp_path, capsys):
    """A hand-written preset that happens to be named config.yaml, with an absolute run_dir elsewhere, was taken for
    a moved run's own config.yaml: the run (its checkpoints) went into the preset's directory, said only by a note.
    A run's own config.yaml holds every top-level setting (save_run_config); the preset's values are kept."""
    from phf_megatron.train import train
    from phf_megatron.training.config_io import load_config

    run = str(tmp_path / "runs" / "exp1")
    preset = tmp_path / "presets" / "config.yaml"
    preset.parent.mkdir()
    preset.write_text(f"run_dir: {run}\ncheckpoint:\n  save: {run}/checkpoints\n")
    cfg = load_config(str(preset))
    assert (cfg.run_dir, cfg.checkpoint.save) == (run, f"{run}/checkpoints")
    assert train(["--config", str(preset), "--print-config"]) == 0
    assert capsys.readouterr().err == ""   # no note


def test_a_new_run_dir_from_a_runs_config_yaml_reads_the_old_runs_inputs_where_they_are(tmp_path):
    """``--config A/config.yaml --run_dir B`` (a new run with A's settings) moved every path recorded inside A to B,
    what the run reads too: a data.path A/train.jsonl that is still there became B/train.jsonl, which is not, and
    the run could not start. What it writes follows to B; what it reads follows only where it is found in B (the
    run directory moved or copied with it)."""
    from phf_megatron.training.config_io import config_from_argv, load_config, save_run_config

    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    os.makedirs(a)
    open(os.path.join(a, "train.jsonl"), "w").close()
    path = save_run_config(config_from_argv([f"--run_dir={a}", f"--data.path={a}/train.jsonl",
                                             f"--checkpoint.save={a}/ckpts"]))
    cfg = load_config(path, [f"--run_dir={b}"])
    assert (cfg.run_dir, cfg.checkpoint.save, cfg.data.path) == (b, f"{b}/ckpts", f"{a}/train.jsonl")
    shutil.move(a, b)   # moved: all of it is read in B
    cfg = load_config(os.path.join(b, "config.yaml"))
    assert (cfg.run_dir, cfg.checkpoint.save, cfg.data.path) == (b, f"{b}/ckpts", f"{b}/train.jsonl")


def test_a_copied_run_directory_is_read_as_the_copy_by_the_eval_as_by_mcore_to_hf(tmp_path):
    """``cp -r runs/a runs/b`` (a run directory copied with its checkpoints, ``checkpoint.save`` recorded inside it),
    then run a trains on: the eval's ``--megatron_checkpoint runs/b`` read a's checkpoints (recorded, still there),
    its latest iteration, while ``mcore_to_hf --mcore_dir runs/b`` and the trainer read b's own. Both read b's."""
    from phf_megatron.eval.models import latest_checkpoint
    from phf_megatron.training.config_io import config_from_argv, save_run_config
    from phf_megatron.training.export import find_run_checkpoint

    a, b = str(tmp_path / "runs" / "a"), str(tmp_path / "runs" / "b")
    save_run_config(config_from_argv([f"--run_dir={a}", f"--checkpoint.save={a}/ckpts"]))
    _checkpoint(os.path.join(a, "ckpts"), 100)
    shutil.copytree(a, b)
    _checkpoint(os.path.join(a, "ckpts"), 200)   # the original goes on training
    copy = os.path.join(b, "ckpts", "iter_0000100")
    assert find_run_checkpoint(b).path == copy   # mcore_to_hf --mcore_dir runs/b
    assert latest_checkpoint(b) == copy          # the eval's --megatron_checkpoint runs/b (was a's iter_0000200)
    assert latest_checkpoint(a) == os.path.join(a, "ckpts", "iter_0000200")   # the original: its own


def test_a_run_directory_copied_without_its_checkpoints_is_not_read_at_the_originals(tmp_path):
    """``runs/b`` holding run a's config.yaml and metrics, not its checkpoints (``checkpoint.save`` recorded inside
    runs/a): the eval's ``--megatron_checkpoint runs/b`` converted and scored a's latest checkpoint in silence (the
    recorded path, still there), while ``mcore_to_hf --mcore_dir runs/b`` said b has none and the trainer saves b's
    own in runs/b. The eval now says the same line as mcore_to_hf."""
    from phf_megatron.eval.models import latest_checkpoint
    from phf_megatron.training.config_io import config_from_argv, save_run_config
    from phf_megatron.training.export import find_run_checkpoint

    a, b = str(tmp_path / "runs" / "a"), str(tmp_path / "runs" / "b")
    recorded = save_run_config(config_from_argv([f"--run_dir={a}", f"--checkpoint.save={a}/ckpts"]))
    _checkpoint(os.path.join(a, "ckpts"), 100)
    os.makedirs(b)
    shutil.copy(recorded, b)
    open(os.path.join(b, "metrics.jsonl"), "w").close()
    line = (f"{b}/config.yaml: checkpoint.save '{b}/ckpts' does not exist here (no checkpoint saved yet, or moved "
            "since the run wrote this file): give the checkpoints directory as it is now")
    for read in (find_run_checkpoint, latest_checkpoint):   # mcore_to_hf's, the eval's (was a's iter_0000100)
        with pytest.raises(InputFileError) as err:
            read(b)
        assert str(err.value) == line, read


def test_a_runs_config_yaml_copied_alone_starts_a_new_run_there_that_saves_in_its_own_place(tmp_path, capsys):
    """A run's config.yaml copied alone into an empty directory was read as that run moved there: the same note,
    and its checkpoint.save recorded outside the run directory kept, so that the new run resumed the old run's
    checkpoints and saved among them. A directory holding none of the run's checkpoints or metrics starts a new run
    with the file's settings, its checkpoints in their default place; mcore_to_hf and the eval (load_config) still
    read the run the file records. With the run's outputs copied too, it is that run, saving where it did."""
    from phf_megatron.train import train
    from phf_megatron.training.config_io import config_and_note, config_from_argv, load_config, save_run_config

    a, b, shared = str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "scratch" / "a_ckpts")
    recorded = save_run_config(config_from_argv([f"--run_dir={a}", f"--checkpoint.save={shared}",
                                                 f"--logging.tensorboard_dir={a}/tb"]))
    _checkpoint(shared, 2)
    os.makedirs(b)
    path = shutil.copy(recorded, b)
    cfg, note = config_and_note(path)
    assert (cfg.run_dir, cfg.save_dir, cfg.logging.tensorboard_dir) == (b, f"{b}/checkpoints", f"{b}/tb")
    assert note == (f"note: {path} records the run in {a}, and {b} holds none of its checkpoints or metrics: a new run "
                    f"there with its settings; its run_dir, logging.tensorboard_dir there are read in {b}; its "
                    f"checkpoint.save {shared}, outside {a}, is that run's: this run's is the default, in {b} (give "
                    "--run_dir for another run directory)")
    assert train(["--config", path, "--print-config"]) == 0
    out, err = capsys.readouterr()
    assert "  save: null\n" in out and err == note + "\n"
    assert train(["--config", path, "--help"]) == 0   # the defaults it shows are the run's too
    assert "--checkpoint.save=<str | None>  (default: None)\n" in capsys.readouterr().out
    assert load_config(path).checkpoint.save == shared   # a reader: the run it records
    assert config_and_note(path, [f"--checkpoint.save={shared}"])[0].save_dir == shared   # given: kept

    open(os.path.join(b, "metrics.jsonl"), "w").close()   # the run directory copied with the run's outputs
    cfg, note = config_and_note(path)
    assert (cfg.run_dir, cfg.save_dir) == (b, shared)
    assert note == (f"note: {path} records the run in {a}; its run_dir, logging.tensorboard_dir there are read in {b} "
                    "(give --run_dir for another run directory)")


def test_a_new_run_dir_from_a_runs_config_yaml_saves_its_own_checkpoints(tmp_path, capsys):
    """``--config A/config.yaml --run_dir B`` with A's checkpoint.save recorded outside A: run B resumed A's
    checkpoints there and saved its own among them, on every launch, unsaid. Run B's checkpoints and events are in
    their default places, in B (on its next launch too, with B's own checkpoints there); one line says so."""
    from phf_megatron.training.config_io import config_and_note, config_from_argv, help_text, save_run_config

    a, b, scratch = str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "scratch")
    path = save_run_config(config_from_argv([f"--run_dir={a}", f"--checkpoint.save={scratch}/a_ckpts",
                                             f"--logging.tensorboard_dir={scratch}/tb"]))
    _checkpoint(f"{scratch}/a_ckpts", 2)
    for launch in range(2):
        cfg, note = config_and_note(path, [f"--run_dir={b}"])
        assert (cfg.run_dir, cfg.save_dir, cfg.logging.tensorboard_dir) == (b, f"{b}/checkpoints", None), launch
        assert note == (f"note: {path} records the run in {a}: a new run in {b} (--run_dir) with its settings; its "
                        f"checkpoint.save {scratch}/a_ckpts, outside {a}, is that run's: this run's is the default, "
                        f"in {b}; its logging.tensorboard_dir {scratch}/tb, outside {a}, is that run's: this run's is "
                        f"the default, in {b}")
        _checkpoint(cfg.save_dir, launch + 1)   # run B's own
    cfg, note = config_and_note(path, [f"--run_dir={b}", f"--logging.tensorboard_dir={scratch}/tb"])
    assert cfg.logging.tensorboard_dir == f"{scratch}/tb" and "tensorboard" not in note   # given: kept
    for shown in (help_text("train", ["--config", path, f"--run_dir={b}"]), _train_help(path, b, capsys)):
        for flag in ("--checkpoint.save", "--logging.tensorboard_dir"):   # was A's scratch paths, 'from A/config.yaml'
            assert f"{flag}=<str | None>  (default: None)\n" in shown, flag


def _train_help(path: str, run_dir: str, capsys) -> str:
    """What ``train --config PATH --run_dir RUN_DIR --help`` prints: the flag is in the argv help_text reads (it
    was a setting parse_overrides refused, so the --run_dir given was dropped and the help showed PATH's run's)."""
    from phf_megatron.train import main

    capsys.readouterr()
    assert main(["--config", path, "--run_dir", run_dir, "--help"]) == 0
    return capsys.readouterr().out


def test_a_run_moved_away_from_its_checkpoints_outside_it_without_metrics_resumes_them(tmp_path):
    """``mv runs/a runs/b`` of a run whose checkpoint.save is outside it (scratch) and that wrote no metrics.jsonl
    (``--logging.jsonl=false``): runs/b holds none of its checkpoints or metrics, so it was read as the config.yaml
    copied alone, a new run saving in runs/b/checkpoints: the moved run restarted from step 0, its checkpoints left
    aside. With runs/a gone and its recorded checkpoints there, it is that run and resumes them."""
    from phf_megatron.training.config_io import config_and_note, config_from_argv, save_run_config

    a, b, shared = str(tmp_path / "runs" / "a"), str(tmp_path / "runs" / "b"), str(tmp_path / "scratch" / "a_ckpts")
    save_run_config(config_from_argv([f"--run_dir={a}", f"--checkpoint.save={shared}", "--logging.jsonl=false"]))
    _checkpoint(shared, 2)
    shutil.copytree(a, b)   # a copy: a is still there, b a new run with a's settings
    cfg, note = config_and_note(os.path.join(b, "config.yaml"))
    assert (cfg.run_dir, cfg.save_dir) == (b, f"{b}/checkpoints") and "a new run there" in note
    shutil.rmtree(b)
    shutil.move(a, b)   # moved
    cfg, note = config_and_note(os.path.join(b, "config.yaml"))
    assert (cfg.run_dir, cfg.save_dir) == (b, shared)
    assert note == (f"note: {b}/config.yaml records the run in {a}; its run_dir there are read in {b} (give --run_dir "
                    "for another run directory)")
