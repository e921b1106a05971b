"""--megatron_checkpoint given a training run or its checkpoints directory: the latest iteration.

A user passes what training printed (``runs/x``, ``runs/x/checkpoints``), not only one
``iter_N``: the eval converts the iteration ``latest_checkpointed_iteration.txt`` names (as
Megatron resumes from it) and marks the converted model with it, so a later checkpoint is converted
afresh, not the earlier one reused, and a resume into the same ``--out_dir`` is refused rather than mixing the
two iterations' samples. The conversion itself (the converter's command) is replaced by a
recorder here; tests/training/test_run_export.py runs the real one.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from phf_megatron.errors import ConfigError, InputFileError
from phf_megatron.eval import EvalConfig, models, run_eval


def _checkpoint(save_dir, iteration: int) -> str:
    path = save_dir / f"iter_{iteration:07d}"
    path.mkdir(parents=True)
    (path / "meta.json").write_text('{"iteration": %d}' % iteration)   # what phf_megatron.train writes
    (save_dir / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    return str(path)


@pytest.fixture
def converted(monkeypatch) -> list[str]:
    """The checkpoints the eval hands to the converter's command, in order."""
    seen: list[str] = []

    def convert(ckpt_dir, out_dir, *, base_model):
        seen.append(ckpt_dir)
        os.makedirs(out_dir)

    monkeypatch.setattr(models, "_convert_training_checkpoint", convert)
    return seen


def test_a_run_or_its_checkpoints_directory_is_its_latest_iteration(tmp_path, converted):
    run = tmp_path / "run"
    _checkpoint(run / "checkpoints", 2)
    latest = _checkpoint(run / "checkpoints", 4)
    for given in (run, run / "checkpoints", latest):
        out = tmp_path / f"eval_{len(converted)}"
        assert models.convert_megatron(str(given), str(out)) == str(out / "converted_model")
    assert converted == [latest] * 3
    newer = _checkpoint(run / "checkpoints", 6)   # the run went on: not the step-4 model reused
    models.convert_megatron(str(run), str(tmp_path / "eval_0"))
    assert converted[-1] == newer
    models.convert_megatron(str(run), str(tmp_path / "eval_0"))   # the same iteration: reused
    assert len(converted) == 4


def test_a_latest_file_naming_a_missing_iteration_is_one_line(tmp_path, converted):
    run = tmp_path / "run"
    _checkpoint(run / "checkpoints", 2)
    (run / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("3")
    with pytest.raises(ConfigError) as err:
        models.convert_megatron(str(run), str(tmp_path / "eval"))
    assert err.value.line == (f"--megatron_checkpoint: {run}: its latest checkpoint {run}/checkpoints/iter_0000003 "
                              "does not exist (checkpoints there: iter_0000002)")
    assert converted == [] and not (tmp_path / "eval").exists()


def test_a_release_checkpoint_is_refused_naming_the_evals_flag(tmp_path, converted):
    """Megatron-LM's base-model checkpoint (its latest file says ``release``) is no run: the line names
    --megatron_checkpoint, not the trainer's --model.pretrained_checkpoint (read_latest's advice to a resume)."""
    base = tmp_path / "megatron_lm_base"
    (base / "release").mkdir(parents=True)
    (base / "latest_checkpointed_iteration.txt").write_text("release")
    with pytest.raises(ConfigError) as err:
        models.convert_megatron(str(base), str(tmp_path / "eval"))
    assert err.value.line.startswith(f"--megatron_checkpoint: {base} is neither hf_to_mcore's output"), err.value.line
    assert converted == [] and not (tmp_path / "eval").exists()


def test_a_latest_file_of_garbage_bytes_is_one_line(tmp_path, converted):
    """latest_checkpoint read the tracker as text to spot 'release': bytes that are not UTF-8 were a
    UnicodeDecodeError traceback (for --megatron_checkpoint, and for --adapter's hint)."""
    run = tmp_path / "run"
    _checkpoint(run / "checkpoints", 2)
    tracker = run / "checkpoints" / "latest_checkpointed_iteration.txt"
    tracker.write_bytes(b"\xff\xfe2")
    with pytest.raises(InputFileError) as err:
        models.convert_megatron(str(run), str(tmp_path / "eval"))
    assert str(err.value) == f"{tracker}: expected an iteration number, found '\ufffd\ufffd2'"
    assert converted == [] and not (tmp_path / "eval").exists()


@pytest.mark.parametrize("saved", ["elsewhere", "default"])
def test_a_run_saving_its_checkpoints_elsewhere_is_found_as_mcore_to_hf_finds_it(tmp_path, converted, saved):
    """A run whose config.yaml sets checkpoint.save: mcore_to_hf (find_run_checkpoint) took its run directory,
    the eval refused it. Both now read the checkpoints where the run put them, the same iteration."""
    from phf_megatron.training.export import find_run_checkpoint

    run = tmp_path / "run"
    run.mkdir()
    save_dir = tmp_path / "scratch" / "ckpts" if saved == "elsewhere" else run / "checkpoints"
    (run / "config.yaml").write_text(f"checkpoint:\n  save: {save_dir}\n" if saved == "elsewhere" else
                                     "checkpoint:\n  save: null\n")
    _checkpoint(save_dir, 2)
    latest = _checkpoint(save_dir, 4)
    models.convert_megatron(str(run), str(tmp_path / "eval"))
    exported = find_run_checkpoint(str(run))
    assert converted == [latest] == [os.path.join(exported.save_dir, f"iter_{exported.iteration:07d}")]


def test_a_damaged_run_config_is_named(tmp_path, converted):
    run = tmp_path / "run"
    _checkpoint(tmp_path / "elsewhere", 2)
    (run / "config.yaml").parent.mkdir()
    (run / "config.yaml").write_bytes(b"checkpoint:\n  save: \xff\xfe\n")
    with pytest.raises(InputFileError) as err:
        models.convert_megatron(str(run), str(tmp_path / "eval"))
    assert str(err.value).startswith(f"{run / 'config.yaml'}: not valid YAML (") and "\n" not in str(err.value)
    assert converted == [] and not (tmp_path / "eval").exists()


def test_a_resume_after_the_run_saved_a_later_checkpoint_is_refused_not_mixed(tmp_path, tiny_dir, monkeypatch):
    """--megatron_checkpoint RUN into the same --out_dir after the run saved a later checkpoint: the converted model
    is the new iteration's, so the samples of the old one must not be kept beside its new ones (the fingerprint
    held the path as typed, the same for both: a silent mix of two models' samples in one score)."""
    monkeypatch.setattr(models, "_convert_training_checkpoint",
                        lambda ckpt_dir, out_dir, *, base_model: shutil.copytree(tiny_dir, out_dir))
    problems = tmp_path / "two.jsonl"
    problems.write_text("".join(json.dumps({"id": f"p{i}", "problem": f"What is {i} + {i}?", "answer": str(2 * i)})
                                + "\n" for i in (1, 2)))
    run = tmp_path / "run"
    _checkpoint(run / "checkpoints", 2)

    def evaluate(n: int):
        return run_eval(EvalConfig(out_dir=str(tmp_path / "eval"), megatron_checkpoint=str(run), model=tiny_dir,
                                   benchmarks=(str(problems),), n=n, max_new_tokens=4, backend="hf", dtype="float32",
                                   batch_size=2, pass_ks=(1,)))

    assert evaluate(1).generated == 2
    assert evaluate(2).generated == 2   # the same checkpoint: resumed
    _checkpoint(run / "checkpoints", 4)
    with pytest.raises(InputFileError, match="holds samples generated with other settings.*iter_0000004"):
        evaluate(3)
    # a directory from before the fingerprint held the iteration: its run_config.json holds the run as typed, and
    # the same command was refused as another model ({'megatron_checkpoint': (RUN, RUN/checkpoints/iter_N)});
    # it resumes, and is rewritten with the iteration: a later checkpoint is refused from then on
    shutil.rmtree(tmp_path / "eval")
    config = tmp_path / "eval" / "run_config.json"

    def legacy():
        config.write_text(json.dumps({**json.loads(config.read_text()), "megatron_checkpoint": str(run)}))

    assert evaluate(1).generated == 2
    legacy()
    assert evaluate(2).generated == 2
    assert json.loads(config.read_text())["megatron_checkpoint"] == str(run / "checkpoints" / "iter_0000004")
    legacy()   # the run saved a later one since: its converted model says the samples are iter 4's, refused
    _checkpoint(run / "checkpoints", 6)
    for _ in range(2):   # a second try too (the refused one left iter 6 converted)
        with pytest.raises(InputFileError, match="other settings.*iter_0000004.*iter_0000006"):
            evaluate(3)
